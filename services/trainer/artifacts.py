"""Model directories that transformers, peft and vLLM load as they are: the final artifact, and the
`model/` dir of every checkpoint, completed the same way so any of them can be served and registered.

- `<output.prefix>/final/`: for LoRA/QLoRA a PEFT adapter dir (adapter_config.json +
  adapter_model.safetensors, `base_model_name_or_path` = the base model as the job named it: a
  catalogue id, or the s3:// prefix / path it gave), for a full fine-tune the whole model.
- `<output.prefix>/final-merged/` (LoRA/QLoRA with `output.merge_weights`): the adapter merged
  into the base, stored in the base model's dtype.
- `<output.prefix>/checkpoints/step-XXXXXXXX/model/`: the same as `final/` at that step.

Every one of them also holds the tokenizer with the serving chat template (so serving renders
as training did) and `tuneloop-model.json` (`ModelInfo`: the base model by name, job, step,
method). The final dirs also carry `trainer_state.json` (steps, loss curve, config fingerprint).
On S3 a directory is uploaded with `ObjectStore.put_dir` (manifest, commit marker last); locally
it is written beside its destination and renamed into place, so a reader never sees half of one.
"""

from __future__ import annotations

import copy
import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from services.trainer.checkpoints import peft_save_kwargs
from services.trainer.rendering import serving_template
from shared.catalogue import CATALOGUE
from shared.storage import ObjectStore

FINAL_DIR = "final"
MERGED_DIR = "final-merged"
STATE_FILE = "trainer_state.json"
MODEL_INFO_FILE: Final = "tuneloop-model.json"
MODEL_INFO_FORMAT: Final = 1
ArtifactKind = Literal["adapter", "full", "merged"]


@dataclass(frozen=True)
class ModelInfo:
    """What `tuneloop-model.json` records about a model dir: which base it needs (by catalogue id
    when the job named one, so a reader resolves it with `shared.catalogue` on its own machine),
    and which job, attempt and step produced it."""

    base_model: str
    method: str
    job_id: str
    attempt_id: str
    tenant: str
    step: int

    @property
    def base_model_kind(self) -> Literal["catalogue", "s3", "path"]:
        if self.base_model in CATALOGUE:
            return "catalogue"
        return "s3" if self.base_model.startswith("s3://") else "path"

    def document(self, artifact: ArtifactKind) -> dict[str, Any]:
        return {
            "format": MODEL_INFO_FORMAT,
            "artifact": artifact,
            "base_model": self.base_model,
            "base_model_kind": self.base_model_kind,
            "method": self.method,
            "job_id": self.job_id,
            "attempt_id": self.attempt_id,
            "tenant": self.tenant,
            "step": self.step,
        }


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


def serving_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """A copy of the training tokenizer carrying the serving chat template (tools included), so
    the saved model renders conversations as training did."""
    copied = copy.copy(tokenizer)
    copied.chat_template = serving_template(tokenizer)
    return copied


def _update_json(path: Path, **fields: Any) -> None:
    document = json.loads(path.read_text())
    document.update(fields)
    path.write_text(json.dumps(document, indent=2, sort_keys=True))


def complete_model_dir(
    dest: Path, tokenizer: PreTrainedTokenizerBase, info: ModelInfo, artifact: ArtifactKind
) -> None:
    """Make a saved adapter or model dir servable as it is: the tokenizer (give it the
    `serving_tokenizer`), the base named as the job named it, a generation-ready config, and
    `tuneloop-model.json`."""
    tokenizer.save_pretrained(dest)
    if (dest / "adapter_config.json").is_file():
        # peft records the directory it loaded from: our work-dir copy of a catalogue or s3://
        # base. The name the job gave is what any other machine can resolve.
        _update_json(dest / "adapter_config.json", base_model_name_or_path=info.base_model)
    elif (dest / "config.json").is_file():
        _update_json(dest / "config.json", use_cache=True)  # off for training only
    (dest / MODEL_INFO_FILE).write_text(
        json.dumps(info.document(artifact), indent=2, sort_keys=True)
    )


def save_full(model: PreTrainedModel, dest: Path) -> None:
    model.config.use_cache = True  # it was off for training; generation wants it
    model.save_pretrained(dest, safe_serialization=True)


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
    info: ModelInfo,
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
    tokenizer = serving_tokenizer(tokenizer)
    local = work_dir / "artifact"
    shutil.rmtree(local, ignore_errors=True)
    final_local = local / FINAL_DIR
    if isinstance(model, PeftModel):
        model.save_pretrained(str(final_local), safe_serialization=True, **peft_save_kwargs(model))
        complete_model_dir(final_local, tokenizer, info, "adapter")
    else:
        save_full(model, final_local)
        complete_model_dir(final_local, tokenizer, info, "full")
    _write_state(final_local, state)
    uri = publish_dir(final_local, child_location(output_prefix, FINAL_DIR), store)
    if not (merge and isinstance(model, PeftModel)):
        return FinalArtifacts(uri=uri)
    merged = merge_adapter(model, base_dir=base_dir, adapter_dir=final_local, quantized=quantized)
    merged_local = local / MERGED_DIR
    merged = merged.to(getattr(torch, _base_dtype(base_dir)))
    save_full(merged, merged_local)
    complete_model_dir(merged_local, tokenizer, info, "merged")
    _write_state(merged_local, state)
    merged_uri = publish_dir(merged_local, child_location(output_prefix, MERGED_DIR), store)
    return FinalArtifacts(uri=uri, merged_uri=merged_uri)


def _base_dtype(base_dir: Path) -> str:
    config = json.loads((base_dir / "config.json").read_text())
    name = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return name if isinstance(getattr(torch, name, None), torch.dtype) else "float32"
