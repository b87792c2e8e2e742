"""Settings of the evaluator service (env prefix TUNELOOP_EVALUATOR_).

What to evaluate and when is the job's plan (job.planned); these are how the service reaches the
hoster and how hard it drives an engine.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.settings import Settings


class EvaluatorSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TUNELOOP_EVALUATOR_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # The hoster's internal API; default: the local stack's (bind host, hoster port).
    hoster_url: str | None = None
    # Requests in flight on an engine: the CPU engine decodes the requests waiting together as
    # one batch (docs/hoster.md), so an eval point's items go at once (32 in one batch: 70
    # tokens/s on one thread, 16: 54).
    concurrency: int = Field(default=32, ge=1, le=256)
    # One generation; a CPU engine busy beside training answers a short item in seconds.
    request_timeout_s: float = Field(default=300.0, gt=0)
    # How often a long evaluation tells JetStream its event is still in hand (under its ack wait).
    keepalive_s: float = Field(default=20.0, gt=0)
    # The overfit stop (overfit.py): the subset's mean task score falling `overfit_evals` evals
    # in a row, each by at least `overfit_margin`, while the train loss falls. 0.02 is over one
    # field of one item on a 16-item json subset (~0.009) and under one short label (0.0625).
    overfit_evals: int = Field(default=3, ge=1)
    overfit_margin: float = Field(default=0.02, ge=0)
    # Re-scoring before the decision (rescoring.py): the top `rescore_top` checkpoints by subset
    # score, and the base, are scored on the eval split's first `rescore_max_items` items (the
    # subset's answers reused). Under 2 turns it off. Each costs the rest's generations.
    rescore_top: int = Field(default=3, ge=0)
    rescore_max_items: int = Field(default=200, ge=1)

    def hoster(self, settings: Settings) -> str:
        if self.hoster_url:
            return self.hoster_url.rstrip("/")
        host = settings.app.bind_host
        # A wildcard bind address listens everywhere; connect to this machine's loopback.
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104
        return f"http://{host}:{settings.services.hoster_port}"
