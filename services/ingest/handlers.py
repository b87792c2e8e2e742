"""Event subscribers of the ingest service (validate, call the domain, publish). None yet: they
arrive with #3 (gateway, upload, OTLP) and #4 (datasets)."""

from faststream.nats import NatsRouter

router = NatsRouter()
