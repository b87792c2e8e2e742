"""Capture: the journal of answered calls, its shipper, the spill file, scrubbing, media and the persister."""
