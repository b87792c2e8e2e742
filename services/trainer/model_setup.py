"""Set-up before the first step: fetch inputs, build the model with its method (LoRA, QLoRA,
full), the AdamW optimizer and the warmup + decay schedule. Each piece is a small function the
loop calls once, in the spirit of torchtune's `_setup_*` methods.

Models are read from a catalogue id's prepared directory, a local directory or an `s3://` prefix
copied to the work dir, never from a hub (`local_files_only=True`).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    get_scheduler,
)

from services.trainer.config import ConfigError, Hyperparameters, JobConfig, RuntimeSettings
from shared import catalogue
from shared.settings import AppSettings
from shared.storage import IncompleteDirectory, ObjectStore

log = logging.getLogger(__name__)

# transformers' names for our schedule choices; "constant" still warms up.
_SCHEDULERS = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


def is_s3(location: str) -> bool:
    return location.startswith("s3://")


def apply_torch_threads(runtime: RuntimeSettings) -> None:
    """Set torch's thread counts as the job says (before any work), and log what torch uses."""
    if runtime.torch_threads is not None:
        torch.set_num_threads(runtime.torch_threads)
        try:
            torch.set_num_interop_threads(runtime.torch_threads)
        except RuntimeError:
            # Allowed once per process, before any inter-op work: a second run in the same
            # process (tests) keeps the first setting. Training uses intra-op threads anyway.
            log.debug("inter-op threads already fixed at %d", torch.get_num_interop_threads())
    log.info(
        "torch threads: %d intra-op, %d inter-op",
        torch.get_num_threads(),
        torch.get_num_interop_threads(),
        extra={
            "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(),
        },
    )


def base_model_location(base_model: str, *, data_dir: Path | None = None) -> str:
    """Where to read the job's base model: a catalogue id's prepared dir under the data dir
    (`TUNELOOP_DATA_DIR`), or its S3 copy when the catalogue names one; any other value as
    given (a local path or s3:// prefix). A catalogue id wins over a same-named relative dir."""
    if base_model in catalogue.CATALOGUE:
        try:
            return catalogue.locate(base_model, data_dir=data_dir or AppSettings().data_dir)
        except catalogue.CatalogueError as exc:
            raise ConfigError(str(exc)) from None
    if catalogue.is_model_id(base_model) and not Path(base_model).expanduser().is_dir():
        known = ", ".join(sorted(catalogue.CATALOGUE))
        raise ConfigError(
            f"base_model: {base_model!r} is neither a catalogue id ({known}) nor a directory"
        )
    return base_model


def fetch_dir(location: str, dest: Path, store: ObjectStore | None, *, field: str) -> Path:
    """A local directory holding `location`: the path itself, or a copy of the s3:// prefix.

    A prefix uploaded with `put_dir` is verified against its manifest; a plain prefix (uploaded
    by other tools) is copied object by object.
    """
    if not is_s3(location):
        path = Path(location).expanduser()
        if not path.is_dir():
            raise ConfigError(f"{field}: {location} is not a directory")
        return path
    if store is None:
        raise ConfigError(f"{field}: {location} needs object storage (TUNELOOP_S3_* settings)")
    prefix = location.rstrip("/") + "/"
    try:
        store.get_dir(prefix, dest)
    except IncompleteDirectory:
        keys = store.list_keys(prefix)
        if not keys:
            raise ConfigError(f"{field}: nothing stored under {location}") from None
        bucket_root = prefix[: prefix.index("/", len("s3://")) + 1]  # "s3://bucket/"
        key_root = prefix[len(bucket_root) :]
        for key in keys:
            store.get_file(bucket_root + key, dest / key[len(key_root) :])
    return dest


def check_model_dir(model_dir: Path, location: str) -> None:
    if not (model_dir / "config.json").is_file():
        raise ConfigError(
            f"base_model: {location} has no config.json (not a Hugging Face model dir)"
        )


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    if tokenizer.pad_token_id is None:
        # Pad positions are masked out of attention and loss, so any id will do; eos is usual.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def autocast_dtype(hp: Hyperparameters, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on a device that computes it natively (or when asked), else fp32 (None)."""
    if hp.precision == "fp32":
        return None
    if hp.precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    if device.type == "cpu" and cpu_has_native_bf16():
        # Measured on the project's 2-core AVX512-BF16 machines: a LoRA step of SmolLM2-135M
        # over 256 tokens took 0.94 s under bf16 autocast, 1.25 s in fp32 (docs/trainer.md).
        return torch.bfloat16
    return None


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU has bf16 matrix instructions (AVX512-BF16 or AMX); elsewhere bf16 is
    emulated and slower than fp32."""
    try:
        flags = next(
            (line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), ""
        )
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def use_gradient_checkpointing(hp: Hyperparameters, device: torch.device) -> bool:
    if hp.gradient_checkpointing == "auto":
        return device.type == "cuda"
    return bool(hp.gradient_checkpointing)


def _check_method(config: JobConfig, device: torch.device) -> None:
    if config.method != "qlora":
        return
    if config.parallelism == "fsdp":
        # FSDP2 would shard bitsandbytes' packed 4-bit tensors as plain uint8 storage; wiring
        # that (bnb_4bit_quant_storage, a GPU to test it on) is not done.
        raise ConfigError("parallelism: fsdp is not supported with method qlora; use ddp")
    if device.type != "cuda":
        raise ConfigError("method: qlora needs a CUDA GPU (none found); use lora or full")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("method: qlora needs the bitsandbytes package (not installed)")


def _quantization_kwargs(config: JobConfig) -> dict[str, Any]:
    if config.method != "qlora":
        # Master weights in fp32: autocast computes in bf16 on GPU, AdamW updates in fp32.
        return {"dtype": torch.float32}
    from transformers import BitsAndBytesConfig  # only reached with bitsandbytes present

    return {
        "quantization_config": BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        ),
        "dtype": torch.bfloat16,
    }


def lora_config(config: JobConfig) -> LoraConfig:
    lora = config.lora
    return LoraConfig(
        task_type="CAUSAL_LM",
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
    )


def build_model(config: JobConfig, model_dir: Path, device: torch.device) -> PreTrainedModel:
    """The base model with its method applied: a PeftModel for (q)lora, the model itself for full."""
    _check_method(config, device)
    # Any: the base, a kbit-prepared base or its PeftModel in turn (transformers' and peft's
    # own annotations do not follow one object through them).
    model: Any = AutoModelForCausalLM.from_pretrained(
        model_dir,
        local_files_only=True,
        # sdpa takes our 4D block-diagonal mask as is; flash-attention would need varlen inputs.
        attn_implementation="sdpa",
        **_quantization_kwargs(config),
    )
    if config.method == "qlora":
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    model.config.use_cache = False  # a KV cache is only for generation
    if config.method == "full":
        model.requires_grad_(True)
    else:
        model = get_peft_model(model, lora_config(config))
        # Checkpoints and the artifact record the base as the job gave it (peft would record
        # the work-dir copy an s3:// base was downloaded to), so evaluators can load them.
        model.peft_config["default"].base_model_name_or_path = config.base_model
    if use_gradient_checkpointing(config.hyperparameters, device):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if isinstance(model, PeftModel):
            # Frozen embeddings give no grad to checkpointed blocks' inputs without this.
            model.enable_input_require_grads()
    placed: PreTrainedModel = model.to(device) if config.method != "qlora" else model
    return placed


def build_optimizer(model: torch.nn.Module, hp: Hyperparameters) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; no weight decay on biases and norms (1-D tensors)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": hp.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=hp.learning_rate,
        betas=(hp.adam_beta1, hp.adam_beta2),
        eps=hp.adam_epsilon,
    )


def warmup_steps(hp: Hyperparameters, total_steps: int) -> int:
    if hp.warmup_steps is not None:
        return min(hp.warmup_steps, total_steps)
    return int(hp.warmup_ratio * total_steps)


def build_scheduler(
    optimizer: torch.optim.Optimizer, hp: Hyperparameters, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    scheduler: torch.optim.lr_scheduler.LRScheduler = get_scheduler(
        _SCHEDULERS[hp.lr_scheduler],
        optimizer,
        num_warmup_steps=warmup_steps(hp, total_steps),
        num_training_steps=total_steps,
    )
    return scheduler


@dataclass(frozen=True)
class ParameterCount:
    trainable: int
    total: int


def count_parameters(model: torch.nn.Module) -> ParameterCount:
    params = list(model.parameters())
    return ParameterCount(
        trainable=sum(p.numel() for p in params if p.requires_grad),
        total=sum(p.numel() for p in params),
    )
