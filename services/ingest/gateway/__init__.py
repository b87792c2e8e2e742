"""The gateway: provider calls authenticated, routed to their upstream, relayed byte for byte and journaled."""
