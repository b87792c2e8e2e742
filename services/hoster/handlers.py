"""Event subscribers of the hoster service (validate, call the domain, publish).

- eval.decided -> the chosen checkpoint registered as a model version (once per job), then
  model.registered; with auto_deploy and a gate not rejecting it, a deployment (under the job's
  suffix as a served name: a canary when the name is served already).
- deployment.canary_failed (a gateway's verdict) -> the canary taken out of its served name.
- eval.shadow_scored (the evaluator's pairwise score) -> kept for promote; a shadow scored
  `worse` taken out when the name's policy says so.
"""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.hoster.state import Hoster
from shared import bus
from shared.events import CanaryFailed, EvalDecided, ShadowScored

SERVICE = "hoster"


def build_router(hoster: Hoster) -> NatsRouter:
    router = NatsRouter()

    @bus.subscribe(router, EvalDecided, service=SERVICE)
    async def register_decision(event: EvalDecided) -> None:
        await hoster.register(event)

    @bus.subscribe(router, CanaryFailed, service=SERVICE)
    async def canary_failed(event: CanaryFailed) -> None:
        await hoster.canary_failed(event)

    @bus.subscribe(router, ShadowScored, service=SERVICE)
    async def shadow_scored(event: ShadowScored) -> None:
        await hoster.shadow_scored(event)

    return router
