"""Checkpoints into servable model directories: pull from object storage (every file's sha256
checked against the committed manifest), then merge a LoRA adapter into its catalogue base.

`transformers serve` loads model directories only (a PEFT adapter dir gives a 500), so a
checkpoint is served merged: merge_and_unload onto the base, saved in the base's dtype.
"""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.hoster.errors import ArtifactFailed, BadRequest
from shared.catalogue import CatalogueError, is_model_id, locate, tenant_prefix
from shared.storage import COMMIT_MARKER, ObjectNotFound, ObjectStore, StorageError, parse_uri

ADAPTER_CONFIG = "adapter_config.json"
_merge_lock = threading.Lock()  # one merge at a time: each holds a whole model in memory


@dataclass(frozen=True)
class Pulled:
    """A checkpoint on local disk: its model dir and the digest it was verified against."""

    root: Path
    sha256: str  # of the committed manifest, which lists every file's sha256

    @property
    def model_dir(self) -> Path:
        return self.root / "model" if (self.root / "model").is_dir() else self.root


def check_uri(uri: str, *, tenant: str, bucket: str, field: str = "uri") -> str:
    """uri if it is an s3:// directory under the tenant's own prefix; BadRequest naming field."""
    own = tenant_prefix(bucket, tenant)
    if not uri.startswith(own) or ".." in uri.removeprefix(own).split("/"):
        raise BadRequest(f"{field}: {uri!r} is not under this tenant's storage ({own})")
    try:
        parse_uri(uri)
    except ValueError as exc:
        raise BadRequest(f"{field}: {exc}") from None
    return uri.rstrip("/")


def checkpoint_digest(store: ObjectStore, uri: str) -> str:
    """The committed checkpoint's digest: its commit marker, the sha256 of its manifest.
    ArtifactFailed when there is none; StorageError (S3 unreachable: worth a retry) passes."""
    try:
        return store.get_bytes(f"{uri.rstrip('/')}/{COMMIT_MARKER}").decode().strip()
    except ObjectNotFound:
        raise ArtifactFailed(f"checkpoint {uri} is not committed (no {COMMIT_MARKER})") from None


def pull(store: ObjectStore, uri: str, dest: Path, *, expect_sha256: str | None = None) -> Pulled:
    """Download the committed checkpoint at uri into dest (kept if an earlier pull of the same
    digest is there), every file verified; ArtifactFailed on any mismatch."""
    try:
        digest = checkpoint_digest(store, uri)
    except StorageError as exc:
        raise ArtifactFailed(f"reading {uri}: {exc}") from None
    if expect_sha256 is not None and digest != expect_sha256:
        raise ArtifactFailed(f"checkpoint {uri} has digest {digest}, registered as {expect_sha256}")
    stamp = dest / ".sha256"
    if stamp.is_file() and stamp.read_text() == digest:
        return Pulled(dest, digest)
    shutil.rmtree(dest, ignore_errors=True)
    try:
        store.get_dir(uri, dest)
    except StorageError as exc:
        raise ArtifactFailed(f"pulling {uri}: {exc}") from None
    stamp.write_text(digest)
    return Pulled(dest, digest)


def base_of(model_dir: Path, *, data_dir: Path) -> Path | None:
    """The local base model directory an adapter dir names (a catalogue id), or None for a
    complete model directory."""
    config_path = model_dir / ADAPTER_CONFIG
    if not config_path.is_file():
        if (model_dir / "config.json").is_file():
            return None
        raise ArtifactFailed(f"{model_dir.name}: neither an adapter nor a model directory")
    base = json.loads(config_path.read_text()).get("base_model_name_or_path", "")
    if not isinstance(base, str) or not is_model_id(base):
        raise ArtifactFailed(
            f"{ADAPTER_CONFIG}: base_model_name_or_path {base!r} is no catalogue id"
        )
    try:
        return Path(locate(base, data_dir=data_dir))
    except CatalogueError as exc:
        raise ArtifactFailed(str(exc)) from None


def servable(pulled: Pulled, dest: Path, *, data_dir: Path, threads: int) -> Path:
    """A model directory at dest that `transformers serve` loads: the adapter merged into its base,
    or the full model linked. Written beside dest and renamed, so a half-written one never serves."""
    if (dest / "config.json").is_file():
        return dest
    base = base_of(pulled.model_dir, data_dir=data_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if base is None:
        dest.symlink_to(pulled.model_dir.resolve(), target_is_directory=True)
        return dest
    tmp = dest.with_name(f".{uuid.uuid4().hex}.partial")
    try:
        merge(base, pulled.model_dir, tmp, threads=threads)
        tmp.replace(dest)
    except Exception as exc:  # torch/peft raise many kinds; the caller gets one
        raise ArtifactFailed(f"merging {pulled.model_dir}: {exc!r}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def preload() -> None:
    """Import torch, transformers and peft now: imported on the first merge, in a worker
    thread, their seconds of import hold the GIL and starve the service's event loop (the bus
    consumers' fetches time out)."""
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401


def merge(base_dir: Path, adapter_dir: Path, dest: Path, *, threads: int) -> None:
    """peft's merge_and_unload of the adapter onto the base, saved with the adapter's tokenizer
    (it carries the chat template the model was trained with)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _merge_lock:
        torch.set_num_threads(threads)
        base: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
        merged: Any = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
        merged.save_pretrained(dest, safe_serialization=True)
        tokenizer_dir = (
            adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base_dir
        )
        AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(dest)


def link_base(base_id: str, models_dir: Path, *, data_dir: Path) -> None:
    """The catalogue base in an engine's models dir, under its catalogue id."""
    try:
        local = Path(locate(base_id, data_dir=data_dir))
    except CatalogueError as exc:
        raise BadRequest(str(exc)) from None
    if local.as_posix().startswith("s3://"):
        raise BadRequest(f"base_model: {base_id} is not prepared on this machine")
    link = models_dir / base_id
    if not link.exists():
        models_dir.mkdir(parents=True, exist_ok=True)
        link.symlink_to(local.resolve(), target_is_directory=True)
