"""The training loop: a job config in, an artifact (or a checkpoint to resume from) out.

`run_training` reads top to bottom: set up (inputs, model + method, data, optimizer, schedule,
resume), then one optimizer step per `StepBatch` (gradient accumulation with the loss of the
step normalised by its label tokens across micro-batches and ranks), checkpoints on cadence and
on a stop request (SIGTERM), and the final artifact. Checkpoint, report and artifact code lives
beside it (checkpoints.py, reporter.py, artifacts.py), not inside it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import random
import shutil
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psutil
import torch
from transformers import PreTrainedModel

from services.trainer import distributed as dist_utils
from services.trainer.artifacts import (
    ArtifactKind,
    FinalArtifacts,
    ModelInfo,
    complete_model_dir,
    serving_tokenizer,
    write_final,
)
from services.trainer.checkpoints import (
    MODEL_DIR,
    STATE_FILE,
    CheckpointError,
    CheckpointStore,
    load_model_weights,
    load_training_state,
    rescale_learning_rate,
    save_training_state,
)
from services.trainer.config import ConfigError, JobConfig
from services.trainer.data import (
    DataPosition,
    DatasetError,
    StepBatch,
    TrainingData,
    load_snapshot_samples,
    tokenize_samples,
)
from services.trainer.distributed import DistContext
from services.trainer.model_setup import (
    apply_torch_threads,
    autocast_dtype,
    base_model_location,
    build_model,
    build_optimizer,
    build_scheduler,
    check_model_dir,
    count_parameters,
    fetch_dir,
    is_s3,
    load_tokenizer,
)
from services.trainer.packing import token_loss
from services.trainer.progress import ReportSender, StepClock, StepMetrics
from services.trainer.rendering import IGNORE_INDEX
from services.trainer.resume import ResumePoint, fetch_first_usable
from shared.cpu_share import CoreShare
from shared.reports import FailureReason, SkippedCheckpoint
from shared.settings import S3Settings
from shared.storage import ObjectStore

log = logging.getLogger(__name__)

STATE_VERSION = 1


class TrainingFailed(Exception):
    """The run stopped without an artifact; `reason` is the report's failure reason."""

    def __init__(
        self, reason: FailureReason, message: str, last_checkpoint_uri: str | None = None
    ) -> None:
        super().__init__(message)
        self.reason, self.message, self.last_checkpoint_uri = reason, message, last_checkpoint_uri


class NonFiniteLoss(Exception):
    """A step produced a NaN/inf loss or gradient; the optimizer did not apply it."""


@dataclass
class RunResult:
    status: Literal["completed", "stopped"]  # stopped: a stop request, checkpointed
    steps: int
    history: list[dict[str, Any]]
    artifact: FinalArtifacts | None = None
    last_checkpoint_uri: str | None = None
    resumed_from: str | None = None
    data_stats: dict[str, Any] = field(default_factory=dict)
    # Checkpoints tried before `resumed_from` that could not be used, and why.
    resume_skipped: list[SkippedCheckpoint] = field(default_factory=list)


OnStep = Callable[[StepMetrics], None]


def run_training(
    config: JobConfig,
    *,
    work_dir: Path,
    stop: threading.Event | None = None,
    on_step: OnStep | None = None,
) -> RunResult:
    """Train as the config says; TrainingFailed (already reported) when the run cannot finish.

    `stop` is set by the SIGTERM handler: the current step finishes, a checkpoint is saved and
    the result says "stopped". `on_step` sees every step's metrics (the CLI's progress bar).
    """
    apply_torch_threads(config.runtime)  # before any work, so every pool starts at that size
    ctx = dist_utils.init_distributed()
    run = _Run(config, work_dir / f"rank-{ctx.rank}", ctx, stop or threading.Event(), on_step)
    try:
        return run.execute()
    finally:
        run.close()
        # Drop the model (DDP's reducer holds the process group) while the group still exists:
        # freed after destroy_process_group, the reducer would destroy the gloo group itself,
        # joining gloo's threads with the GIL held while one of them waits for the GIL.
        del run
        gc.collect()
        dist_utils.shutdown(ctx)


class _Run:
    """One attempt: the set-up objects and the loop over steps."""

    def __init__(
        self,
        config: JobConfig,
        work_dir: Path,
        ctx: DistContext,
        stop: threading.Event,
        on_step: OnStep | None,
    ) -> None:
        self.config, self.hp, self.ctx = config, config.hyperparameters, ctx
        self.work_dir, self.stop, self.on_step = work_dir, stop, on_step
        self.reports = ReportSender(config, enabled=ctx.is_main)
        self.history: list[dict[str, Any]] = []
        self.last_checkpoint: str | None = None
        self.resumed_from: str | None = None
        self.resume_skipped: list[SkippedCheckpoint] = []

    # -- set-up ---------------------------------------------------------------------------------
    def _setup_inputs(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        base = base_model_location(self.config.base_model)  # a catalogue id's prepared dir
        locations = [base, self.config.dataset, self.config.output.prefix]
        locations += [self.config.resume_from or "", *self.config.resume_fallbacks]
        self.store = ObjectStore.from_settings(S3Settings()) if any(map(is_s3, locations)) else None
        self.model_dir = fetch_dir(base, self.work_dir / "base", self.store, field="base_model")
        check_model_dir(self.model_dir, self.config.base_model)
        self.tokenizer = load_tokenizer(self.model_dir)
        # What every checkpoint and the artifact carry: renders as training did, tools included.
        self.serving_tokenizer = serving_tokenizer(self.tokenizer)

    def _setup_data(self) -> None:
        samples = load_snapshot_samples(self.config.dataset, store=self.store, split="train")
        examples, report = tokenize_samples(samples, self.tokenizer, self.hp)
        if not examples:
            raise DatasetError(
                f"dataset: none of {report['samples']} samples can be trained on "
                f"(dropped: {report['dropped']}; e.g. {report['drop_messages'][:2]})"
            )
        self.data = TrainingData(
            examples,
            self.hp,
            pad_token_id=int(self.tokenizer.pad_token_id),
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
        )
        self.data_stats = {**self.data.stats, "dropped": report["dropped"]}
        log.info("training data ready", extra={"data": self.data_stats})

    def _setup_model(self) -> None:
        self.cores = (
            CoreShare(torch.get_num_threads(), psutil.cpu_count() or 1, torch.set_num_threads)
            if self.config.runtime.share_cores
            and self.ctx.device.type == "cpu"
            and self.ctx.world_size == 1
            else None
        )
        _seed_everything(self.hp.seed)  # LoRA's initial weights come from the global RNG
        self.model = build_model(self.config, self.model_dir, self.ctx.device)
        params = count_parameters(self.model)
        log.info(
            "model ready",
            extra={"trainable_params": params.trainable, "total_params": params.total},
        )
        self.autocast = autocast_dtype(self.hp, self.ctx.device)

    def _setup_checkpoints(self) -> DataPosition:
        """The checkpoint store, the wrapped model, optimizer and schedule, and where the data
        starts (after a resumed checkpoint)."""
        self.checkpoints = CheckpointStore(
            self.config.output.prefix, store=self.store, policy=self.config.checkpoints
        )
        resume = self._fetch_resume(self.config.resume_from) if self.config.resume_from else None
        if resume is not None:
            # Whole weights into the unwrapped model on every rank, before wrapping: DDP
            # broadcasts rank 0's, FSDP2 keeps each rank's shard of them.
            load_model_weights(resume[1], self.model)
        self.train_model = dist_utils.wrap_model(self.model, self.ctx, self.config.parallelism)
        # After wrapping: FSDP2 replaced the parameters by their shards.
        self.optimizer = build_optimizer(self.model, self.hp)
        self.scheduler = build_scheduler(self.optimizer, self.hp, self.data.total_steps)
        return self._restore(*resume) if resume is not None else DataPosition(0, 0)

    def _fetch_resume(self, resume_from: str) -> tuple[str, Path] | None:
        """The checkpoint to resume from: rank 0 tries resume_from and its fallbacks in turn
        (resume.py) and tells the others which one verified; each of them fetches its own copy."""
        local = self.work_dir / "resume"
        outcome: ResumePoint | CheckpointError | None = None
        if self.ctx.is_main:
            fallbacks = self.config.resume_fallbacks
            try:
                outcome = fetch_first_usable(self.checkpoints, resume_from, fallbacks, local)
            except CheckpointError as exc:
                outcome = exc  # raised on every rank: none is left waiting for rank 0
        outcome = dist_utils.broadcast_object(outcome, self.ctx)
        if isinstance(outcome, CheckpointError):
            raise outcome
        self.resume_skipped = list(outcome.skipped)
        if outcome.uri is None:
            return None
        if not self.ctx.is_main:
            self.checkpoints.fetch(outcome.uri, local)
        _check_compatible(local, outcome.uri, self.config.fingerprint(), self.ctx.world_size)
        return outcome.uri, local

    def _restore(self, uri: str, local: Path) -> DataPosition:
        """Optimizer, schedule, RNG and history of a fetched checkpoint; its data position."""
        model, optimizer = self.train_model, self.optimizer
        state = load_training_state(
            local,
            optimizer=optimizer,
            scheduler=self.scheduler,
            load_optimizer=lambda sd: dist_utils.load_optimizer_state(model, optimizer, sd),
        )
        shutil.rmtree(local, ignore_errors=True)
        rescale_learning_rate(optimizer, self.scheduler, self.config.hyperparameters.learning_rate)
        self.history = list(state.get("history", []))
        self.resumed_from = self.last_checkpoint = uri
        log.info("resumed", extra={"checkpoint": uri, "step": state["step"]})
        return DataPosition(**state["position"])

    # -- the loop -------------------------------------------------------------------------------
    def execute(self) -> RunResult:
        try:
            self._setup_inputs()
            self._setup_data()
            self._setup_model()
            start = self._setup_checkpoints()
            self.reports.started(
                self.ctx,
                self.data.total_steps,
                self.resumed_from,
                _trained_tokens(self.history),
                resume_skipped=self.resume_skipped,
            )
            return self._train(start)
        except Exception as exc:
            failure = _classify(exc, self.last_checkpoint)
            self.reports.failed(failure.reason, failure.message, failure.last_checkpoint_uri)
            log.error("training failed: %s", failure.message, extra={"reason": failure.reason})
            raise failure from exc

    def _train(self, start: DataPosition) -> RunResult:
        step = len(self.history)
        window: list[float] = []  # losses since the last checkpoint: its "loss" metric
        clock = StepClock()
        for batch in self.data.steps(start):
            metrics = self._train_step(batch, clock)
            step = metrics.step
            self.history.append(asdict(metrics))
            window.append(metrics.loss)
            self.reports.progress(metrics, clock.eta_s(step, self.data.total_steps))
            if self.cores is not None:
                self.cores.update()
            if self.on_step is not None:
                self.on_step(metrics)
            stopping = dist_utils.any_across(self.stop.is_set(), self.ctx)
            # The last step is always saved, so the evaluator and the registry see the final
            # state as a checkpoint like the others, whatever the cadence.
            last = step == self.data.total_steps
            if stopping or last or step % self.config.checkpoints.every_n_steps == 0:
                self._checkpoint(step, batch.next_position, window)
                window = []
            if stopping:
                log.info("stop requested: checkpointed step %d, exiting", step)
                dist_utils.barrier(self.ctx)
                return self._result("stopped", step)
        return self._finish(step, window)

    def _train_step(self, batch: StepBatch, clock: StepClock) -> StepMetrics:
        self.train_model.train()
        scale = self.ctx.world_size / max(batch.step_label_tokens, 1)
        loss_sum = 0.0
        last = len(batch.micro_batches) - 1
        for i, micro in enumerate(batch.micro_batches):
            # DDP/FSDP2 average gradients over ranks at the last micro-batch; the scale undoes
            # the average, so the step's gradient is that of (sum of token CE) / (step's tokens).
            with dist_utils.gradient_sync(self.train_model, enabled=i == last):
                loss_sum += self._micro_step(micro, scale)
        grad_norm = self._clip_gradients()
        loss_total, tokens = dist_utils.sum_across([loss_sum, float(batch.num_tokens)], self.ctx)
        loss = loss_total / max(batch.step_label_tokens, 1)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLoss(
                f"step {batch.global_step + 1}: loss {loss}, grad norm {grad_norm}; "
                "the update was not applied (learning rate too high? bad data?)"
            )
        learning_rate = float(self.scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        step = batch.global_step + 1
        return StepMetrics(
            step=step,
            total_steps=self.data.total_steps,
            epoch=step / self.data.steps_per_epoch,
            loss=loss,
            learning_rate=learning_rate,
            grad_norm=grad_norm,
            tokens=int(tokens),
            seconds=clock.lap(),
        )

    def _micro_step(self, micro: dict[str, torch.Tensor], scale: float) -> float:
        inputs = {k: v.to(self.ctx.device) for k, v in micro.items() if k != "labels"}
        labels = micro["labels"]
        keep = labels != IGNORE_INDEX
        with self._autocast():
            # Vocabulary logits only where a label is: the lm_head is a fifth of a small
            # model's compute, and full logits are the largest activation of the step.
            logits = self.train_model(**inputs, logits_to_keep=keep.to(self.ctx.device)).logits
        ce_sum, _ = token_loss(logits, labels[keep])
        (ce_sum * scale).backward()
        return float(ce_sum.detach())

    def _clip_gradients(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = self.hp.max_grad_norm if self.hp.max_grad_norm is not None else math.inf
        return dist_utils.clip_grad_norm(params, max_norm)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.ctx.device.type, dtype=self.autocast)

    # -- checkpoints, artifact ------------------------------------------------------------------
    def _state(self, step: int, position: DataPosition) -> dict[str, Any]:
        return {
            "state_version": STATE_VERSION,
            "step": step,
            "total_steps": self.data.total_steps,
            "position": asdict(position),
            "config_fingerprint": self.config.fingerprint(),
            # The data position counts steps of this many ranks' global batch.
            "world_size": self.ctx.world_size,
            "job_id": self.config.job_id,
            "attempt_id": self.config.attempt_id,
            "history": self.history,
        }

    def _model_info(self, step: int) -> ModelInfo:
        return ModelInfo(
            base_model=self.config.base_model,
            method=self.config.method,
            job_id=self.config.job_id,
            attempt_id=self.config.attempt_id,
            tenant=self.config.tenant,
            step=step,
        )

    def _checkpoint(self, step: int, position: DataPosition, window: list[float]) -> None:
        # FSDP2: every rank takes part in gathering the whole tensors rank 0 writes.
        sharded = dist_utils.is_sharded(self.model)
        gathered = dist_utils.gather_state(self.model, self.optimizer) if sharded else None
        if self.ctx.is_main:
            local = self.work_dir / "checkpoint" / f"step-{step:08d}"
            shutil.rmtree(local, ignore_errors=True)
            save_training_state(
                local,
                model=self.model,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                state=self._state(step, position),
                model_state=gathered.model if gathered else None,
                optimizer_state=gathered.optimizer if gathered else None,
            )
            # model/ is a complete artifact (tokenizer, template, base by name), servable as is.
            kind: ArtifactKind = "full" if self.config.method == "full" else "adapter"
            info = self._model_info(step)
            complete_model_dir(local / MODEL_DIR, self.serving_tokenizer, info, kind)
            metrics = {"loss": sum(window) / len(window)} if window else {}
            uri = self.checkpoints.commit(local, step=step, metrics=metrics)
            shutil.rmtree(local, ignore_errors=True)
            self.reports.checkpoint_saved(step, uri, metrics)
            self.last_checkpoint = uri
            if self.cores is not None:
                self.cores.checkpoint_saved()
        self.last_checkpoint = dist_utils.broadcast_object(self.last_checkpoint, self.ctx)

    def _finish(self, step: int, window: list[float]) -> RunResult:
        artifact = None
        sharded = dist_utils.is_sharded(self.model)
        gathered = dist_utils.gather_model_state(self.model) if sharded else None
        if self.ctx.is_main:
            state = self._state(step, DataPosition(self.hp.epochs, 0))
            state["resumed_from"] = self.resumed_from
            artifact = write_final(
                self.model if gathered is None else self._unsharded(gathered),
                self.tokenizer,
                info=self._model_info(step),
                base_dir=self.model_dir,
                output_prefix=self.config.output.prefix,
                merge=self.config.output.merge_weights,
                quantized=self.config.method == "qlora",
                state=state,
                work_dir=self.work_dir,
                store=self.store,
            )
            metrics = {"loss": sum(window) / len(window)} if window else {}
            self.reports.completed(
                artifact, metrics, step, self.last_checkpoint, _trained_tokens(self.history)
            )
        dist_utils.barrier(self.ctx)
        return self._result("completed", step, artifact)

    def _unsharded(self, gathered: dict[str, torch.Tensor]) -> PreTrainedModel:
        """A whole copy of the trained model (CPU, rank 0) for the artifact: the same code then
        writes the same adapter, merged weights or full model as an unsharded run."""
        with torch.random.fork_rng(devices=[]):  # LoRA's init draws from the global RNG
            model = build_model(self.config, self.model_dir, torch.device("cpu"))
        dist_utils.load_gathered_model_state(model, gathered)
        return model

    def _result(
        self,
        status: Literal["completed", "stopped"],
        step: int,
        artifact: FinalArtifacts | None = None,
    ) -> RunResult:
        return RunResult(
            status=status,
            steps=step,
            history=list(self.history),
            artifact=artifact,
            last_checkpoint_uri=self.last_checkpoint,
            resumed_from=self.resumed_from,
            data_stats=getattr(self, "data_stats", {}),
            resume_skipped=list(self.resume_skipped),
        )

    def close(self) -> None:
        self.reports.close()


def _trained_tokens(history: list[dict[str, Any]]) -> int:
    """Non-pad tokens of every step taken, resumed attempts' steps included."""
    return sum(int(entry.get("tokens", 0)) for entry in history)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)  # some libraries draw from numpy's legacy global generator
    torch.manual_seed(seed)


def _check_compatible(local: Path, uri: str, expected: str, world_size: int) -> None:
    """Refuse a checkpoint this run would not continue exactly: another config, or another
    number of processes (its data position counts steps of another global batch)."""
    state = json.loads((local / STATE_FILE).read_text())
    written_by = state.get("world_size", world_size)
    if written_by != world_size:
        raise ConfigError(
            f"resume_from: {uri} was written by {written_by} process(es), this run has "
            f"{world_size}: its data position counts steps of that global batch "
            "(micro_batch_size x gradient_accumulation_steps x processes); resume with "
            f"{written_by} process(es)"
        )
    found = state.get("config_fingerprint")
    if found != expected:
        raise ConfigError(
            f"resume_from: {uri} was written by a different job config (fingerprint {found}, "
            f"this config {expected}): base_model, dataset, method, lora and hyperparameters "
            "except max_steps must match"
        )


def _classify(exc: BaseException, last_checkpoint: str | None) -> TrainingFailed:
    if isinstance(exc, TrainingFailed):
        return exc
    reason: FailureReason
    if isinstance(exc, ConfigError | CheckpointError):
        reason = "bad_config"
    elif isinstance(exc, DatasetError):
        reason = "bad_dataset"
    elif isinstance(exc, NonFiniteLoss):
        reason = "nan_loss"
    elif isinstance(exc, torch.OutOfMemoryError):
        reason = "oom"
    else:
        reason = "error"
    message = str(exc) if reason != "error" else f"{type(exc).__name__}: {exc}"
    return TrainingFailed(reason, message, last_checkpoint)
