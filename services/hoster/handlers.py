"""Event subscribers of the hoster service (validate, call the domain, publish). None yet: they
arrive with the hosting issue."""

from faststream.nats import NatsRouter

router = NatsRouter()
