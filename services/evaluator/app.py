"""Wiring only: the evaluator service's FastAPI app and its bus subscribers."""

import httpx
from fastapi import FastAPI

from services.evaluator import api, handlers, judge_api, overfit, shadow_api
from services.evaluator.config import EvaluatorSettings, JudgeSettings
from services.evaluator.engine_client import HosterClient
from services.evaluator.evals import api as evals_api
from services.evaluator.evals.serving import Evals
from services.evaluator.judging import Judging
from services.evaluator.runner import Evaluator
from services.evaluator.shadow import PairsReader, ShadowScorer
from shared import bus
from shared.events import Event
from shared.service import ServiceRuntime
from shared.settings import Settings
from shared.storage import ObjectStore

SERVICE = "evaluator"


def create_app(settings: Settings | None = None) -> FastAPI:
    runtime = ServiceRuntime(SERVICE, settings)
    config = EvaluatorSettings()
    hoster = HosterClient(
        config.hoster(runtime.settings),
        runtime.settings.auth.service_token.get_secret_value(),
    )

    async def publish(event: Event) -> None:
        await bus.publish(runtime.broker, event)

    async def nothing() -> None:
        return None

    judging = Judging.from_settings(runtime.engine, JudgeSettings())
    evaluator = Evaluator(
        db=runtime.engine,
        store=ObjectStore.from_settings(runtime.settings.s3),
        hoster=hoster,
        publish=publish,
        concurrency=config.concurrency,
        request_timeout_s=config.request_timeout_s,
        overfit_rule=overfit.Rule(config.overfit_evals, config.overfit_margin),
        rescore_top=config.rescore_top,
        rescore_max_items=config.rescore_max_items,
        serving_margin=config.serving_margin,
        judging=judging,
    )
    reader = PairsReader(
        httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0)),
        config.ingest(runtime.settings),
        runtime.settings.auth.service_token.get_secret_value(),
    )
    shadow = ShadowScorer(
        db=runtime.engine,
        client=judging.client,
        model=judging.model,
        reader=reader,
        publish=publish,
        min_pairs=config.shadow_min_pairs,
        poll_s=config.shadow_poll_s,
        page_size=config.shadow_page_size,
    )
    runtime.include_router(
        handlers.build_router(evaluator, keepalive_s=config.keepalive_s, shadow=shadow)
    )
    runtime.on_lifecycle(shadow.start, shadow.stop)
    runtime.on_lifecycle(nothing, hoster.aclose)
    runtime.on_lifecycle(nothing, judging.aclose)
    evals = Evals.from_settings(runtime.engine, config, runtime.settings)
    runtime.on_lifecycle(evals.start, evals.stop)
    app = runtime.build_app(
        api.router,
        summary="Mid-run task evals: generation on held-out data, the rubric judge, scores, best-checkpoint choice and the eval gate.",
    )
    app.state.judging = judging
    app.include_router(judge_api.router)
    app.add_exception_handler(api.EvalError, api.eval_error_response)
    app.state.evals = evals
    app.state.shadow = shadow
    app.include_router(shadow_api.router)
    app.include_router(evals_api.router)
    evals_api.add_error_handlers(app)
    return app
