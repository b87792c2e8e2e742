"""Settings of the evaluator service (env prefix TUNELOOP_EVALUATOR_).

What to evaluate and when is the job's plan (job.planned); these are how the service reaches the
hoster and how hard it drives an engine.
"""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.settings import ServiceUrl, Settings
from shared.tasks import TaskKind


class EvaluatorSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TUNELOOP_EVALUATOR_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # The hoster's internal API; default: the local stack's (bind host, hoster port).
    hoster_url: ServiceUrl | None = None
    # Requests in flight on an engine: the CPU engine decodes the requests waiting together as
    # one batch (docs/hoster.md), so an eval point's items go at once (32 in one batch: 70
    # tokens/s on one thread, 16: 54).
    concurrency: int = Field(default=32, ge=1, le=256)
    # One generation; a CPU engine busy beside training answers a short item in seconds.
    request_timeout_s: float = Field(default=300.0, gt=0)
    # How often a long evaluation tells JetStream its event is still in hand (under its ack wait).
    keepalive_s: float = Field(default=20.0, gt=0)
    # The Evals API (docs/evaluator.md): the gateway its runs call models through, and where
    # uploaded files and datasets are read from; default: the local stack's ingest.
    ingest_url: ServiceUrl | None = None
    # Generations in flight per run, and runs executing at once (the rest wait, queued).
    evals_concurrency: int = Field(default=8, ge=1, le=64)
    evals_runs_at_once: int = Field(default=2, ge=1, le=16)
    # A run's items (inline, a file or a dataset's eval split) and the file it reads at most.
    evals_max_items: int = Field(default=10_000, ge=1)
    evals_max_file_bytes: int = Field(default=64 * 1024**2, ge=1)
    # One generation of a run's item, through the gateway.
    evals_request_timeout_s: float = Field(default=120.0, gt=0)
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
    # Shadow scoring (shadow.py): how often ingest is asked for new shadow pairs, how many a
    # page, and the decided pairs (wins, losses, ties) a verdict needs: with 20, a shadow
    # winning 15 of 20 is `better` (Wilson's lower bound 0.53), one winning 14 is not yet.
    shadow_poll_s: float = Field(default=30.0, gt=0)
    shadow_page_size: int = Field(default=50, ge=1, le=500)
    shadow_min_pairs: int = Field(default=20, ge=1)
    # Beating the serving version (serving_baseline.py): an auto-deployed version becomes its
    # served name's canary only if its mean is at least the serving version's + this, on the
    # same items. 0: not worse is enough, as the canary's own traffic and rollback decide next;
    # raise it to ask for a gain beyond the noise of one item (1/items of the mean).
    serving_margin: float = Field(default=0.0, ge=0, le=1)

    def hoster(self, settings: Settings) -> str:
        return self.hoster_url.rstrip("/") if self.hoster_url else settings.local_url("hoster")

    def ingest(self, settings: Settings) -> str:
        return self.ingest_url.rstrip("/") if self.ingest_url else settings.local_url("ingest")


class JudgeSettings(BaseSettings):
    """The LLM judge (env prefix TUNELOOP_EVALUATOR_JUDGE_): any OpenAI-compatible endpoint.
    Without a base URL and a model there is no judge, and every task kind is graded
    deterministically. Through the gateway, use a key of scope `internal`: its calls are then
    captured tagged purpose:judge and kept out of datasets."""

    model_config = SettingsConfigDict(
        env_prefix="TUNELOOP_EVALUATOR_JUDGE_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
    )

    # The judge's OpenAI-compatible endpoint (its base URL, as an SDK takes it), key and model.
    base_url: str | None = None
    api_key: SecretStr = SecretStr("")
    model: str | None = None
    # Task kinds the judge grades when it is configured; the others keep their exact graders.
    kinds: list[TaskKind] = ["free_text"]
    # Sent as x-tuneloop-purpose (empty: not sent, for an endpoint that is not our gateway).
    purpose: str = "judge"
    # Judge calls in flight across every job of this evaluator.
    concurrency: int = Field(default=4, ge=1, le=64)
    # One judge call.
    timeout_s: float = Field(default=120.0, gt=0)
    # Tries again after a failure that passes (a dropped connection, a timeout, 408/409/429, a
    # 5xx), each wait doubling from backoff_s (or the endpoint's Retry-After) up to
    # max_backoff_s, before an item's judge_error: 3 tries more wait ~1 + 2 + 4 s, past a
    # gateway's or an engine's restart, and a dead endpoint costs an item seconds, not minutes.
    max_retries: int = Field(default=3, ge=0, le=10)
    backoff_s: float = Field(default=1.0, ge=0, le=60)
    max_backoff_s: float = Field(default=30.0, ge=0, le=600)
    # The most tokens a judge's answer may take.
    max_tokens: int = Field(default=400, ge=16, le=4096)
    # Items of the job's subset the rubric is written from.
    rubric_items: int = Field(default=6, ge=1, le=32)

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)
