"""OTLP traces: export requests decoded, GenAI spans assembled into samples, in worker processes."""
