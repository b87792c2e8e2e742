"""The trainer's job config: one versioned pydantic document, given as a JSON file plus `--set` overrides.

Locations (base model, dataset, output, resume point) are either local paths or `s3://bucket/key`
prefixes; object storage credentials come from the environment (`TUNELOOP_S3_*`, see
`shared.settings.S3Settings`), never from the config, so a config can be logged and stored. The
webhook secret is the one secret here: a `SecretStr`, never printed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from shared.chat import describe_errors
from shared.tenancy import TenantId

CONFIG_VERSION: Literal[1] = 1


class ConfigError(ValueError):
    """The job config is unreadable or invalid; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoraSettings(_Strict):
    rank: int = Field(default=16, ge=1, le=1024)
    alpha: int = Field(default=32, ge=1)  # peft's type: LoraConfig.lora_alpha is an int
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0)
    # "all-linear": every linear layer of the blocks (peft's own shorthand), else module names.
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class Hyperparameters(_Strict):
    epochs: int = Field(default=1, ge=1)
    # Stops early when reached; None: run every epoch.
    max_steps: int | None = Field(default=None, ge=1)
    # Rows (packed) or samples (unpacked) per micro-batch on each process.
    micro_batch_size: int = Field(default=4, ge=1)
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    max_seq_len: int = Field(default=2048, ge=16)
    packing: bool = True
    loss_on: Literal["all_assistant", "last_assistant"] = "all_assistant"
    learning_rate: float = Field(default=2e-4, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.999, ge=0, lt=1)
    adam_epsilon: float = Field(default=1e-8, gt=0)
    lr_scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    # warmup_steps wins over warmup_ratio when both are given.
    warmup_steps: int | None = Field(default=None, ge=0)
    warmup_ratio: float = Field(default=0.03, ge=0, lt=1)
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    seed: int = 0
    # auto: bf16 autocast on a GPU that supports it or a CPU with bf16 instructions (AVX512-BF16,
    # AMX), else fp32.
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # auto: on for GPUs, off on CPU (it only trades compute for memory).
    gradient_checkpointing: Literal["auto"] | bool = "auto"


class CheckpointPolicy(_Strict):
    every_n_steps: int = Field(default=50, ge=1)
    keep_last: int = Field(default=2, ge=1)
    keep_best: bool = True
    # Lower is better; the loop records it in each checkpoint's metrics.
    best_metric: str = "loss"
    # Seconds a SIGTERM may take to finish the step and save before the process gives up.
    sigterm_grace_s: float = Field(default=120.0, gt=0)


class OutputSettings(_Strict):
    # Local directory or s3://bucket/prefix: checkpoints/ and final/ go under it.
    prefix: str = Field(min_length=1)
    merge_weights: bool = False


class RuntimeSettings(_Strict):
    # torch's intra-op (and, where still allowed, inter-op) threads per process; None: torch's
    # default (OMP_NUM_THREADS, else one per core). Set it when training shares the machine with
    # an eval engine, so the two split the cores by plan instead of contending for all of them.
    torch_threads: int | None = Field(default=None, ge=1, le=1024)
    # CPU training beside other work (the eval engine): after each step, run on the cores the
    # other processes left free, at most torch_threads (shared/cpu_share.py).
    share_cores: bool = False


class WebhookSettings(_Strict):
    url: str = Field(pattern=r"^https?://")
    secret: SecretStr
    timeout_s: float = Field(default=5.0, gt=0)
    # Reports kept while the endpoint is unreachable; the oldest progress reports go first.
    max_buffered: int = Field(default=10_000, ge=1)

    @model_validator(mode="after")
    def _secret_not_empty(self) -> WebhookSettings:
        if not self.secret.get_secret_value():
            raise ValueError("secret: must not be empty")
        return self


class JobConfig(_Strict):
    config_version: Literal[1] = CONFIG_VERSION
    job_id: str = Field(min_length=1, max_length=128)
    attempt_id: str = Field(default="attempt-1", min_length=1, max_length=128)
    tenant: TenantId
    # A base-model catalogue id (shared.catalogue: read from <TUNELOOP_DATA_DIR>/models/<id>), or
    # a Hugging Face directory as a local path or s3:// prefix (never a hub id). Checkpoints and
    # the artifact record it as given, so a catalogue id stays resolvable on another machine.
    base_model: str = Field(min_length=1)
    # A dataset snapshot (train.jsonl [+ eval.jsonl]): local dir, local .jsonl file or s3:// prefix.
    dataset: str = Field(min_length=1)
    method: Literal["lora", "qlora", "full"] = "lora"
    lora: LoraSettings = LoraSettings()
    hyperparameters: Hyperparameters = Hyperparameters()
    checkpoints: CheckpointPolicy = CheckpointPolicy()
    output: OutputSettings
    runtime: RuntimeSettings = RuntimeSettings()
    webhook: WebhookSettings | None = None
    # A checkpoint URI/path, or "latest": the newest committed checkpoint under output.prefix,
    # then the older ones there, newest first.
    resume_from: str | None = None
    # Tried in order when resume_from cannot be used (missing, uncommitted, a file failing its
    # sha256 check): the run resumes from the first that verifies (resume.py).
    resume_fallbacks: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    # How more than one process (torchrun / accelerate launch) shares the model: "ddp" (a whole
    # replica per rank) or "fsdp" (FSDP2: parameters, gradients and optimizer state sharded
    # across ranks). No-op in one process. Not in fingerprint(): it does not change the curve,
    # and a checkpoint written under one resumes under the other.
    parallelism: Literal["ddp", "fsdp"] = "ddp"

    @field_validator("resume_fallbacks")
    @classmethod
    def _fallbacks_need_resume_from(cls, fallbacks: list[str], info: ValidationInfo) -> list[str]:
        if fallbacks and not info.data.get("resume_from"):
            raise PydanticCustomError("fallback", "tried only after resume_from, which is not set")
        return fallbacks

    def fingerprint(self) -> str:
        """Hash of what decides the training curve; a checkpoint from another config is refused."""
        decisive = self.model_dump(
            mode="json", include={"base_model", "dataset", "method", "lora", "hyperparameters"}
        )
        # Extending a run is allowed, and so is a new learning rate: it is how a run that
        # diverged (a NaN loss) goes on from its last good checkpoint (the schedule keeps its
        # place and takes the new peak, loop.Trainer._restore).
        decisive["hyperparameters"].pop("max_steps", None)
        decisive["hyperparameters"].pop("learning_rate", None)
        return hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()[:16]


def _parse_value(raw: str) -> Any:
    """`--set` values are JSON when they parse (numbers, booleans, lists), else plain strings."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def apply_override(document: dict[str, Any], assignment: str) -> None:
    """Apply one `key.sub=value` override to a config document in place."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path:
        raise ConfigError(f"--set {assignment!r}: expected key=value (e.g. hyperparameters.seed=3)")
    *parents, leaf = path.split(".")
    node = document
    for name in parents:
        child = node.setdefault(name, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {path}: {name} is not a section")
        node = child
    node[leaf] = _parse_value(raw)


def parse_config(document: dict[str, Any], overrides: list[str] | None = None) -> JobConfig:
    document = json.loads(json.dumps(document))  # a deep copy the overrides may change
    for assignment in overrides or []:
        apply_override(document, assignment)
    try:
        return JobConfig.model_validate(document)
    except ValidationError as exc:
        raise ConfigError("invalid job config: " + "; ".join(describe_errors(exc))) from None


def with_resume(config: JobConfig, resume_from: str | None, fallbacks: list[str]) -> JobConfig:
    """The config with the CLI's `--resume-from` and `--resume-fallback`s, which replace the
    config's own when given."""
    update: dict[str, Any] = {}
    if resume_from:
        update["resume_from"] = resume_from
    if fallbacks:
        update["resume_fallbacks"] = fallbacks
    if not update:
        return config
    try:
        return JobConfig.model_validate({**dict(config), **update})
    except ValidationError as exc:
        raise ConfigError("invalid job config: " + "; ".join(describe_errors(exc))) from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> JobConfig:
    try:
        document = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(document, dict):
        raise ConfigError(f"--config {path}: must be a JSON object")
    return parse_config(document, overrides)
