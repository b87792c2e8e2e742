"""Event subscribers of the hoster service (validate, call the domain, publish).

- eval.decided -> the chosen checkpoint registered as a model version (once per job), then
  model.registered; with auto_deploy and a gate not rejecting it, a deployment (under the job's
  suffix as a served name: a canary when the name is served already).
- deployment.canary_failed (a gateway's verdict) -> the canary taken out of its served name.
"""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.hoster.state import Hoster
from shared import bus
from shared.events import CanaryFailed, EvalDecided

SERVICE = "hoster"


def build_router(hoster: Hoster) -> NatsRouter:
    router = NatsRouter()

    @bus.subscribe(router, EvalDecided, service=SERVICE)
    async def register_decision(event: EvalDecided) -> None:
        await hoster.register(event)

    @bus.subscribe(router, CanaryFailed, service=SERVICE)
    async def canary_failed(event: CanaryFailed) -> None:
        await hoster.canary_failed(event)

    return router
