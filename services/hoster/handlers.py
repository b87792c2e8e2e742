"""Event subscribers of the hoster service (validate, call the domain, publish).

- eval.decided -> the chosen checkpoint registered as a model version (once per job), then
  model.registered; with auto_deploy and a gate not rejecting it, a deployment.
"""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.hoster.state import Hoster
from shared import bus
from shared.events import EvalDecided

SERVICE = "hoster"


def build_router(hoster: Hoster) -> NatsRouter:
    router = NatsRouter()

    @bus.subscribe(router, EvalDecided, service=SERVICE)
    async def register_decision(event: EvalDecided) -> None:
        await hoster.register(event)

    return router
