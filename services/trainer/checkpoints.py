"""Checkpoints: the full training state saved locally, committed to object storage or a directory,
pruned to the last K plus the best, and found again for resuming.

A checkpoint directory (`step-00000040/`) holds `model/` (a PEFT adapter dir or full weights),
`optimizer.pt`, `scheduler.pt`, `rng.pt` and `trainer_state.json`; committing adds the manifest
(sizes, sha256, and the step and metrics as metadata) and LAST the commit marker holding the
manifest's sha256, on S3 through `ObjectStore.put_dir` and locally by the same rules. A directory
without a valid marker is never listed, resumed from or fetched: a process killed mid-commit
leaves nothing anyone will read, and the next commit of that step replaces it.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from services.trainer.checkpoint_storage import (
    STEP_DIR,
    Backend,
    CheckpointError,
    CorruptCheckpoint,
    LocalBackend,
    NoCheckpoint,
    S3Backend,
    UncommittedCheckpoint,
)
from services.trainer.config import CheckpointPolicy
from shared.storage import ObjectStore

__all__ = [
    "CHECKPOINT_DIR_FORMAT",
    "MODEL_DIR",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointStore",
    "CorruptCheckpoint",
    "NoCheckpoint",
    "UncommittedCheckpoint",
    "capture_rng_state",
    "load_model_weights",
    "load_training_state",
    "rescale_learning_rate",
    "restore_rng_state",
    "save_training_state",
]

log = logging.getLogger(__name__)

CHECKPOINT_DIR_FORMAT = "step-{step:08d}"
CHECKPOINT_FORMAT_VERSION = 1
CHECKPOINTS_SUBDIR = "checkpoints"
MODEL_DIR = "model"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng.pt"
STATE_FILE = "trainer_state.json"


# --- training state -----------------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from: Python, NumPy, torch CPU and each CUDA device."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:  # numpy is optional for the trainer
        pass
    else:
        numpy_state = np.random.get_state(legacy=False)
        # Plain lists, so `torch.load(weights_only=True)` can read it back without numpy globals.
        numpy_state["state"]["key"] = numpy_state["state"]["key"].tolist()
        state["numpy"] = numpy_state
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_python_state(state["python"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        numpy_state = {**state["numpy"], "state": dict(state["numpy"]["state"])}
        numpy_state["state"]["key"] = np.asarray(numpy_state["state"]["key"], dtype=np.uint32)
        np.random.set_state(numpy_state)
    cuda_states = state.get("cuda")
    if cuda_states and torch.cuda.is_available():
        if len(cuda_states) != torch.cuda.device_count():
            log.warning(
                "checkpoint holds RNG states of %d CUDA devices, this process sees %d",
                len(cuda_states),
                torch.cuda.device_count(),
            )
        for device, device_state in enumerate(cuda_states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, device)
    elif cuda_states:
        log.warning("checkpoint holds CUDA RNG states but no GPU is visible; they are ignored")


def _as_python_state(value: Any) -> tuple[Any, ...]:
    # random.setstate wants tuples all the way down; a JSON or list round trip gives lists.
    version, internal, gauss = value
    return (version, tuple(internal), gauss)


def save_training_state(
    local_dir: Path,
    *,
    model: Any,
    optimizer: Any,
    scheduler: Any | None,
    state: dict[str, Any],
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> None:
    """Write a checkpoint's files into local_dir (created if absent).

    `model` is the unwrapped model (not DDP's wrapper): a PEFT model saves its adapter dir,
    a plain one its full weights. `state` is the loop's JSON-serialisable trainer state (step,
    epoch, data position, config fingerprint, metrics, loss history).

    A sharded (FSDP2) model holds only its rank's shards: the caller gathers the whole tensors
    first (`distributed.gather_state`, a collective) and passes them as `model_state` (given to
    `save_pretrained`, which keeps a PEFT model's adapter keys) and `optimizer_state` (in
    `optimizer.state_dict()` form), so the files are the same as a single process writes.
    """
    try:
        state_json = json.dumps(state, indent=2, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{STATE_FILE}: trainer state is not JSON-serialisable: {exc}"
        ) from None
    local_dir.mkdir(parents=True, exist_ok=True)
    kwargs = peft_save_kwargs(model)
    if model_state is not None:
        kwargs["state_dict"] = model_state
    model.save_pretrained(local_dir / MODEL_DIR, **kwargs)
    optimizer_state = optimizer.state_dict() if optimizer_state is None else optimizer_state
    torch.save(optimizer_state, local_dir / OPTIMIZER_FILE)
    if scheduler is not None:
        torch.save(scheduler.state_dict(), local_dir / SCHEDULER_FILE)
    torch.save(capture_rng_state(), local_dir / RNG_FILE)
    (local_dir / STATE_FILE).write_text(state_json)


def peft_save_kwargs(model: Any) -> dict[str, Any]:
    """`save_pretrained` arguments for a PEFT model: never the base's embedding layers. We never
    resize the vocabulary, and peft's "auto" would look the base up on the Hugging Face Hub
    when its recorded name (a catalogue id) is not a local directory."""
    return {"save_embedding_layers": False} if hasattr(model, "peft_config") else {}


def _torch_load(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing from the checkpoint")
    # weights_only: a checkpoint from storage must not be able to run code when loaded.
    return torch.load(path, map_location="cpu", weights_only=True)


def rescale_learning_rate(optimizer: Any, scheduler: Any | None, peak: float) -> None:
    """Give a restored optimizer and schedule the config's peak learning rate, keeping the
    schedule's place: its state holds the peak it was saved with, and a run resumed after a
    divergence goes on at a lower one."""
    if scheduler is None or not getattr(scheduler, "base_lrs", None):
        return
    saved = scheduler.base_lrs[0]
    if saved == peak:
        return
    ratio = peak / saved
    scheduler.base_lrs = [base * ratio for base in scheduler.base_lrs]
    # What get_last_lr() reports (and the progress reports show) until the next step.
    if getattr(scheduler, "_last_lr", None):
        scheduler._last_lr = [rate * ratio for rate in scheduler._last_lr]
    for group in optimizer.param_groups:
        group["lr"] *= ratio
        if "initial_lr" in group:
            group["initial_lr"] *= ratio
    log.info("learning rate peak %.3g instead of the checkpoint's %.3g", peak, saved)


def load_training_state(
    local_dir: Path,
    *,
    optimizer: Any,
    scheduler: Any | None,
    load_optimizer: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Restore optimizer, scheduler and RNG states; return the trainer state dict.

    Model weights are loaded separately (`load_model_weights`) because the loop must do that
    before it wraps the model and builds the optimizer over its parameters. `load_optimizer`
    replaces `optimizer.load_state_dict` (a sharded model: `distributed.load_optimizer_state`).
    """
    state_path = local_dir / STATE_FILE
    try:
        trainer_state = json.loads(state_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{state_path}: missing from the checkpoint") from None
    except json.JSONDecodeError as exc:
        raise CorruptCheckpoint(
            f"{state_path}: not JSON ({exc.msg} at line {exc.lineno})"
        ) from None
    (load_optimizer or optimizer.load_state_dict)(_torch_load(local_dir / OPTIMIZER_FILE))
    if scheduler is not None:
        scheduler.load_state_dict(_torch_load(local_dir / SCHEDULER_FILE))
    restore_rng_state(_torch_load(local_dir / RNG_FILE))
    if not isinstance(trainer_state, dict):
        raise CorruptCheckpoint(f"{state_path}: must hold a JSON object")
    return trainer_state


def _read_safetensors(model_dir: Path, stem: str) -> dict[str, torch.Tensor]:
    """One `<stem>.safetensors` file, or the shards its `<stem>.safetensors.index.json` lists."""
    single, index = model_dir / f"{stem}.safetensors", model_dir / f"{stem}.safetensors.index.json"
    if single.is_file():
        return load_file(single)
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(model_dir / shard).items()}
    raise CheckpointError(f"{model_dir}: holds neither {single.name} nor {index.name}")


def load_model_weights(local_dir: Path, model: Any) -> None:
    """Load `local_dir/model` into `model`: a PEFT adapter into a PEFT model, full weights into
    a plain one. Refuses a mismatch (adapter vs full, unknown or missing tensors)."""
    model_dir = local_dir / MODEL_DIR
    is_peft_model = hasattr(model, "peft_config")
    if (model_dir / "adapter_config.json").is_file():
        if not is_peft_model:
            raise CheckpointError(f"{model_dir} holds a PEFT adapter but the model has none")
        from peft import set_peft_model_state_dict

        result: Any = set_peft_model_state_dict(
            model, _read_safetensors(model_dir, "adapter_model")
        )
        if result.unexpected_keys:
            raise CheckpointError(
                f"{model_dir}: adapter tensors the model lacks: {result.unexpected_keys[:5]}"
            )
        return
    if is_peft_model:
        raise CheckpointError(f"{model_dir} holds full weights but the model is a PEFT model")
    weights = _read_safetensors(model_dir, "model")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected:
        raise CheckpointError(f"{model_dir}: tensors the model lacks: {unexpected[:5]}")
    # save_pretrained writes a tied tensor once (lm_head shares the embedding): not missing.
    current = model.state_dict()
    loaded_ptrs = {current[name].data_ptr() for name in weights}
    really_missing = [name for name in missing if current[name].data_ptr() not in loaded_ptrs]
    if really_missing:
        raise CheckpointError(
            f"{model_dir}: tensors missing from the checkpoint: {really_missing[:5]}"
        )


# --- the store ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint, as its manifest describes it (no download needed)."""

    step: int
    uri: str
    metrics: dict[str, float]


def _is_s3(location: str) -> bool:
    return location.startswith("s3://")


def _finite_metrics(metrics: dict[str, float]) -> dict[str, float]:
    kept = {name: float(v) for name, v in metrics.items() if math.isfinite(float(v))}
    if len(kept) != len(metrics):
        log.warning(
            "non-finite metrics left out of the manifest: %s", sorted(set(metrics) - set(kept))
        )
    return kept


class CheckpointStore:
    """Checkpoints under <output.prefix>/checkpoints/, on S3 (s3://bucket/prefix) or a local
    directory, with the SAME commit semantics: files, then manifest with sha256, then the commit
    marker last; a directory without a valid marker is never listed, never resumed from.

    One writer per prefix (rank 0 of the job's current attempt) is assumed: retention and the
    sweep of uncommitted leftovers would race with a second writer.
    """

    def __init__(self, prefix: str, *, store: ObjectStore | None, policy: CheckpointPolicy) -> None:
        self.policy, self._store = policy, store
        self.root = prefix.rstrip("/") + "/" + CHECKPOINTS_SUBDIR
        if _is_s3(prefix) and store is None:
            raise CheckpointError(f"output prefix {prefix} needs object storage (TUNELOOP_S3_*)")
        if not _is_s3(prefix):
            self.root = str(Path(prefix).expanduser().resolve() / CHECKPOINTS_SUBDIR)
        self._backend = self._backend_for(self.root)

    def _backend_for(self, location: str) -> Backend:
        if not _is_s3(location):
            return LocalBackend(Path(location).parent if location != self.root else Path(location))
        if self._store is None:
            raise CheckpointError(
                f"{location}: an s3:// checkpoint needs object storage (TUNELOOP_S3_*)"
            )
        root = self.root if location == self.root else location.rstrip("/").rsplit("/", 1)[0]
        return S3Backend(root, self._store)

    def _normalise(self, location: str) -> str:
        if _is_s3(location):
            return location.rstrip("/")
        return str(Path(location).expanduser().resolve())

    # -- writing ---------------------------------------------------------------------------------
    def commit(self, local_dir: Path, *, step: int, metrics: dict[str, float]) -> str:
        """Store local_dir as the checkpoint of `step`; return its URI. Then keep the last K plus
        the best; the one just written is never deleted. Retention failures are logged only:
        the checkpoint itself is safe by then."""
        if step < 0:
            raise ValueError(f"step must be >= 0 (got {step})")
        if not Path(local_dir).is_dir():
            raise NotADirectoryError(f"{local_dir} is not a directory")
        uri = self._backend.child(CHECKPOINT_DIR_FORMAT.format(step=step))
        metadata = {
            "checkpoint_format": CHECKPOINT_FORMAT_VERSION,
            "step": step,
            "metrics": _finite_metrics(metrics),
        }
        self._backend.put(Path(local_dir), uri, metadata)
        log.info("checkpoint of step %d committed at %s", step, uri)
        try:
            self._apply_retention(uri, step)
        except Exception:
            log.warning("checkpoint retention after step %d failed", step, exc_info=True)
        return uri

    def _apply_retention(self, just_written: str, step: int) -> None:
        committed = self.committed()
        # Later steps than the one just written belong to a run this one resumed from an
        # earlier checkpoint and replaced: left there, `latest` would resume the abandoned run.
        for info in (c for c in committed if c.step > step):
            log.info("deleting checkpoint of step %d of a superseded run (%s)", info.step, info.uri)
            self._backend.delete(info.uri)
        committed = [c for c in committed if c.step <= step]
        keep = {info.uri for info in committed[-self.policy.keep_last :]} | {just_written}
        if self.policy.keep_best and (best := self._best_of(committed)) is not None:
            keep.add(best.uri)
        for info in committed:
            if info.uri not in keep:
                log.info("retention: deleting checkpoint of step %d (%s)", info.step, info.uri)
                self._backend.delete(info.uri)
        self._backend.sweep(step)

    # -- reading ---------------------------------------------------------------------------------
    def _info(self, uri: str) -> CheckpointInfo:
        manifest = self._backend_for(uri).manifest(uri)
        step, metrics = manifest.metadata.get("step"), manifest.metadata.get("metrics")
        if not isinstance(step, int) or not isinstance(metrics, dict):
            raise CorruptCheckpoint(f"{uri}: the manifest has no step/metrics: not a checkpoint")
        values = {name: v for name, v in metrics.items() if isinstance(v, int | float)}
        return CheckpointInfo(step=step, uri=uri, metrics={k: float(v) for k, v in values.items()})

    def _step_uris(self, *, newest_first: bool) -> list[str]:
        names = [n for n in self._backend.children() if STEP_DIR.match(n)]
        names.sort(key=lambda n: int(n.split("-", 1)[1]), reverse=newest_first)
        return [self._backend.child(name) for name in names]

    def _iter_committed(self, *, newest_first: bool) -> Iterator[CheckpointInfo]:
        for uri in self._step_uris(newest_first=newest_first):
            try:
                yield self._info(uri)
            except UncommittedCheckpoint:
                log.debug("skipping uncommitted %s", uri)
            except CheckpointError as exc:
                log.warning("skipping unusable checkpoint: %s", exc)

    def committed(self) -> list[CheckpointInfo]:
        """Every committed checkpoint under the prefix, oldest step first."""
        return list(self._iter_committed(newest_first=False))

    def latest(self) -> str | None:
        """The newest committed checkpoint (by step); uncommitted or corrupt ones are skipped."""
        return next((info.uri for info in self._iter_committed(newest_first=True)), None)

    def newest_first(self) -> list[str]:
        """What `latest` may resume from, in order: every checkpoint whose commit marker is there,
        newest step first. Unlike `committed()` this keeps one whose manifest does not match its
        marker: fetching it says why it cannot be used, and a resume reports that it skipped it."""
        found = []
        for uri in self._step_uris(newest_first=True):
            try:
                self._backend.manifest(uri)
            except UncommittedCheckpoint:
                continue  # a killed commit: never a checkpoint
            except CheckpointError:
                pass
            found.append(uri)
        return found

    def _best_of(self, committed: list[CheckpointInfo]) -> CheckpointInfo | None:
        metric = self.policy.best_metric
        scored = [info for info in committed if metric in info.metrics]
        # Lower is better; on a tie the later step wins (it trained longer for the same score).
        return min(scored, key=lambda info: (info.metrics[metric], -info.step), default=None)

    def best(self) -> str | None:
        """The committed checkpoint with the lowest `policy.best_metric`, None when none has it."""
        found = self._best_of(self.committed())
        return found.uri if found else None

    def info(self, uri: str) -> CheckpointInfo:
        """Step and metrics of a committed checkpoint; CheckpointError when it is not one."""
        return self._info(self._normalise(uri))

    def fetch(self, uri: str, dest: Path) -> Path:
        """Download (S3) or copy (local) a committed checkpoint into dest, verifying every file
        against the manifest; dest must be absent or empty. Returns dest."""
        uri = self._normalise(uri)
        self._backend_for(uri).get(uri, Path(dest))
        return Path(dest)

    def resolve(self, resume_from: str) -> str:
        """`latest` -> the newest committed checkpoint; a URI or path -> itself once it is known
        to be committed. CheckpointError (NoCheckpoint, UncommittedCheckpoint, ...) otherwise."""
        if resume_from == "latest":
            found = self.latest()
            if found is None:
                raise NoCheckpoint(f"resume_from=latest: no committed checkpoint under {self.root}")
            return found
        return self.info(resume_from).uri
