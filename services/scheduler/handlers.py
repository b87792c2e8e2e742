"""Event subscribers of the scheduler service (validate, call the domain, publish). None yet: they
arrive with the scheduling issue."""

from faststream.nats import NatsRouter

router = NatsRouter()
