"""Event subscribers of the evaluator service (validate, call the domain, publish). None yet: they
arrive with the evaluation issue."""

from faststream.nats import NatsRouter

router = NatsRouter()
