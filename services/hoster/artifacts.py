"""Checkpoints onto local disk for the engines: pull from object storage (every file's sha256
checked against the committed manifest); the base a LoRA adapter names (a catalogue id) found in
the catalogue. Nothing is merged: the LoRA engine loads adapters onto its base as they are.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from services.hoster.errors import ArtifactFailed, BadRequest
from shared.catalogue import CatalogueError, is_model_id, locate, tenant_prefix
from shared.storage import COMMIT_MARKER, ObjectNotFound, ObjectStore, StorageError, parse_uri

ADAPTER_CONFIG = "adapter_config.json"


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


def link_model(model_dir: Path, dest: Path) -> Path:
    """A whole model's directory linked at dest, where `transformers serve` resolves its name."""
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(model_dir.resolve(), target_is_directory=True)
    return dest


def base_dir(base_id: str, *, data_dir: Path) -> Path:
    """The prepared local directory of a catalogue base; BadRequest naming `model` otherwise."""
    try:
        local = locate(base_id, data_dir=data_dir)
    except CatalogueError as exc:
        raise BadRequest(str(exc).replace("base_model:", "model:", 1)) from None
    if local.startswith("s3://"):
        raise BadRequest(f"model: {base_id} is not prepared on this machine; run `make model`")
    return Path(local).resolve()
