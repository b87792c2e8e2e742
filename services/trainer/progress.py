"""What the loop tells the world about a run: per-step metrics, step timing and ETA, and the
webhook reports (built with the attempt's stamp, sent by rank 0 only)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from services.trainer.artifacts import FinalArtifacts
from services.trainer.config import JobConfig
from services.trainer.distributed import DistContext
from services.trainer.reporter import Reporter, ReportStamper, make_reporter
from shared.reports import FailureReason, SkippedCheckpoint

log = logging.getLogger(__name__)


@dataclass
class StepMetrics:
    step: int  # optimizer steps done, 1-based
    total_steps: int
    epoch: float
    loss: float
    learning_rate: float
    grad_norm: float
    tokens: int  # non-pad input tokens of the step, all ranks
    seconds: float  # wall time since the previous step ended (data, forward, backward, update)


class StepClock:
    """Step wall times (from the end of one step to the end of the next) and the ETA."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.durations: list[float] = []

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        self.durations.append(seconds)
        return seconds

    def eta_s(self, step: int, total_steps: int) -> float:
        # The first step pays one-off costs (allocation, kernel warm-up): leave it out when we can.
        recent = self.durations[1:] or self.durations
        return max(total_steps - step, 0) * (sum(recent) / len(recent))


class ReportSender:
    """The loop's reports: built with the attempt's stamp, sent by rank 0 only, progress
    throttled to one per `progress_interval_s` (plus the first and the last step)."""

    def __init__(self, config: JobConfig, *, enabled: bool, progress_interval_s: float = 5.0):
        self.config, self.enabled = config, enabled
        self.stamp = ReportStamper.for_job(config)
        self.reporter: Reporter | None = make_reporter(config) if enabled else None
        self.interval_s, self.last_progress = progress_interval_s, -math.inf
        # Non-pad tokens of every step so far, resumed ones included (the scheduler's usage).
        self.trained_tokens = 0

    def _send(self, build: Callable[[], Any]) -> None:
        if self.reporter is None:
            return
        try:
            self.reporter.send(build())
        except Exception:  # a report that cannot be built must not stop training
            log.exception("report not sent")

    def started(
        self,
        ctx: DistContext,
        total_steps: int,
        resumed_from: str | None,
        trained_tokens: int = 0,
        *,
        resume_skipped: Sequence[SkippedCheckpoint] = (),
    ) -> None:
        self.trained_tokens = trained_tokens
        self._send(
            lambda: self.stamp.started(
                world_size=ctx.world_size,
                total_steps=total_steps,
                resumed_from=resumed_from,
                resume_skipped=list(resume_skipped),
                device=_describe_device(ctx.device),
                method=self.config.method,
                trained_tokens=trained_tokens,
            )
        )

    def progress(self, m: StepMetrics, eta_s: float) -> None:
        now = time.monotonic()
        self.trained_tokens += m.tokens  # every step, reported or not
        first, last = m.step == 1, m.step >= m.total_steps
        if not (first or last or now - self.last_progress >= self.interval_s):
            return
        self.last_progress = now
        if self.config.webhook is not None:  # without one, the NullReporter logs each report
            log.info(
                "step %d/%d loss %.4f",
                m.step,
                m.total_steps,
                m.loss,
                extra={"lr": m.learning_rate, "grad_norm": m.grad_norm, "eta_s": round(eta_s)},
            )
        self._send(
            lambda: self.stamp.progress(
                step=m.step,
                total_steps=m.total_steps,
                epoch=m.epoch,
                loss=m.loss,
                learning_rate=m.learning_rate,
                grad_norm=m.grad_norm,
                tokens_per_s=m.tokens / m.seconds if m.seconds > 0 else None,
                eta_s=eta_s,
                trained_tokens=self.trained_tokens,
            )
        )

    def checkpoint_saved(self, step: int, uri: str, metrics: dict[str, float]) -> None:
        self._send(lambda: self.stamp.checkpoint_saved(step=step, uri=uri, metrics=metrics))

    def completed(
        self,
        artifact: FinalArtifacts,
        metrics: dict[str, float],
        steps: int,
        last_checkpoint_uri: str | None,
        trained_tokens: int,
    ) -> None:
        self._send(
            lambda: self.stamp.completed(
                artifact_uri=artifact.uri,
                merged_uri=artifact.merged_uri,
                metrics=metrics,
                steps=steps,
                last_checkpoint_uri=last_checkpoint_uri,
                trained_tokens=trained_tokens,
            )
        )

    def failed(self, reason: FailureReason, message: str, last_checkpoint: str | None) -> None:
        self._send(
            lambda: self.stamp.failed(
                reason=reason, message=message[:2000], last_checkpoint_uri=last_checkpoint
            )
        )

    def close(self, timeout_s: float = 10.0) -> None:
        if self.reporter is not None:
            self.reporter.close(timeout_s)


def _describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)
