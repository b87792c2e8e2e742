"""The final artifact: Hugging Face directories that transformers, peft and vLLM load as they are.

- `<output.prefix>/final/`: for LoRA/QLoRA a PEFT adapter dir (adapter_config.json +
  adapter_model.safetensors, `base_model_name_or_path` = the base model location the job gave,
  plus the tokenizer); for a full fine-tune the whole model (safetensors + config + tokenizer).
- `<output.prefix>/final-merged/` (LoRA/QLoRA with `output.merge_weights`): the adapter merged
  into the base, stored in the base model's dtype, with the tokenizer.

Each directory also carries `trainer_state.json` (steps, loss curve, config fingerprint). On
S3 a directory is uploaded with `ObjectStore.put_dir` (manifest, commit marker last); locally it
is written beside its destination and renamed into place, so a reader never sees half of one.
"""

from __future__ import annotations

import copy
import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from services.trainer.rendering import serving_template
from shared.storage import ObjectStore

FINAL_DIR = "final"
MERGED_DIR = "final-merged"
STATE_FILE = "trainer_state.json"


@dataclass(frozen=True)
class FinalArtifacts:
    uri: str  # the adapter dir (LoRA/QLoRA) or the full model dir
    merged_uri: str | None = None


def child_location(prefix: str, name: str) -> str:
    """`prefix/name` for a local path or an s3:// prefix alike."""
    if prefix.startswith("s3://"):
        return prefix.rstrip("/") + "/" + name
    return str(Path(prefix).expanduser().resolve() / name)


def publish_dir(local_dir: Path, location: str, store: ObjectStore | None) -> str:
    """Store a finished local directory at `location` (local path or s3:// prefix); its URI."""
    if location.startswith("s3://"):
        if store is None:
            raise ValueError(f"{location}: storing on S3 needs an ObjectStore")
        store.put_dir(local_dir, location.rstrip("/") + "/")
        return location.rstrip("/")
    dest = Path(location)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.partial")
    shutil.copytree(local_dir, staging)
    if dest.exists():  # a rerun replaces the earlier artifact
        shutil.rmtree(dest)
    staging.replace(dest)
    return str(dest)


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    (directory / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))


def save_adapter(
    model: PeftModel, tokenizer: PreTrainedTokenizerBase, dest: Path, base_model: str
) -> None:
    """adapter_config.json + adapter_model.safetensors, base recorded as the job gave it."""
    model.save_pretrained(dest, safe_serialization=True)
    config_path = dest / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    # peft records the directory it loaded from: our work-dir copy when the base came from S3.
    adapter_config["base_model_name_or_path"] = base_model
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True))
    tokenizer.save_pretrained(dest)


def save_full(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dest: Path) -> None:
    model.config.use_cache = True  # it was off for training; generation wants it
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


def merge_adapter(
    model: PeftModel, *, base_dir: Path, adapter_dir: Path, quantized: bool
) -> PreTrainedModel:
    """The adapter folded into full-precision base weights.

    A QLoRA base is 4-bit, so its adapter is applied to a fresh full-precision load of the base
    (from the saved adapter dir: the artifact itself is what gets merged). A LoRA model merges
    in place: training is over and this saves a second copy of the base in memory.
    """
    if not quantized:
        merged: PreTrainedModel = model.merge_and_unload()
        return merged
    base = AutoModelForCausalLM.from_pretrained(
        base_dir, local_files_only=True, dtype=torch.bfloat16
    )
    reloaded = PeftModel.from_pretrained(base, adapter_dir)
    merged = reloaded.merge_and_unload()
    return merged


def write_final(
    model: PreTrainedModel | PeftModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    base_model: str,
    base_dir: Path,
    output_prefix: str,
    merge: bool,
    quantized: bool,
    state: dict[str, Any],
    work_dir: Path,
    store: ObjectStore | None,
) -> FinalArtifacts:
    """Write and publish final/ (and final-merged/ on request); returns their URIs."""
    model.eval()
    # The saved tokenizer renders conversations as training did (tools included).
    tokenizer = copy.copy(tokenizer)
    tokenizer.chat_template = serving_template(tokenizer)
    local = work_dir / "artifact"
    shutil.rmtree(local, ignore_errors=True)
    final_local = local / FINAL_DIR
    if isinstance(model, PeftModel):
        save_adapter(model, tokenizer, final_local, base_model)
    else:
        save_full(model, tokenizer, final_local)
    _write_state(final_local, state)
    uri = publish_dir(final_local, child_location(output_prefix, FINAL_DIR), store)
    if not (merge and isinstance(model, PeftModel)):
        return FinalArtifacts(uri=uri)
    merged = merge_adapter(model, base_dir=base_dir, adapter_dir=final_local, quantized=quantized)
    merged_local = local / MERGED_DIR
    merged = merged.to(getattr(torch, _base_dtype(base_dir)))
    save_full(merged, tokenizer, merged_local)
    _write_state(merged_local, state)
    merged_uri = publish_dir(merged_local, child_location(output_prefix, MERGED_DIR), store)
    return FinalArtifacts(uri=uri, merged_uri=merged_uri)


def _base_dtype(base_dir: Path) -> str:
    config = json.loads((base_dir / "config.json").read_text())
    name = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return name if isinstance(getattr(torch, name, None), torch.dtype) else "float32"
