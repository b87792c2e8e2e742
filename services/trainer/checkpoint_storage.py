"""Where committed checkpoints live: an s3:// prefix (through `ObjectStore.put_dir`) or a local
directory, with the same commit rules on both.

Files first, then the manifest (sizes, sha256, metadata), then LAST the commit marker holding the
manifest's sha256. Locally a commit is written into a hidden temp dir beside the target and
renamed into place, so a killed commit leaves only a hidden leftover; on S3 it leaves objects
without a marker, which readers refuse and the next commit of that step deletes first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from shared.storage import (
    COMMIT_MARKER,
    MANIFEST_NAME,
    ChecksumMismatch,
    IncompleteDirectory,
    Manifest,
    ManifestFile,
    ObjectNotFound,
    ObjectStore,
    walk_files,
)

log = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step-(\d{8,})$")
_CHUNK = 1024 * 1024


class CheckpointError(Exception):
    """A checkpoint cannot be used; the message names it and says why."""


class NoCheckpoint(CheckpointError):
    """Nothing is stored where a checkpoint was expected."""


class UncommittedCheckpoint(CheckpointError):
    """The directory has no commit marker: its upload never finished."""


class CorruptCheckpoint(CheckpointError):
    """The manifest or a file differs from what the commit marker / manifest promises."""


def _digest_and_copy(src: Path, dst: Path) -> tuple[int, str]:
    """Copy src to dst (fsynced), hashing the bytes as they pass; returns (size, sha256)."""
    digest, size = hashlib.sha256(), 0
    with src.open("rb") as reader, dst.open("wb") as writer:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
            size += writer.write(chunk)
        writer.flush()
        os.fsync(writer.fileno())
    return size, digest.hexdigest()


def _parse_manifest(where: str, marker: bytes, body: bytes) -> Manifest:
    expected = marker.decode(errors="replace").strip()
    if (actual := hashlib.sha256(body).hexdigest()) != expected:
        raise CorruptCheckpoint(
            f"{where}: {MANIFEST_NAME} has sha256 {actual}, marker says {expected}"
        )
    try:
        return Manifest.model_validate_json(body)
    except ValueError as exc:
        raise CorruptCheckpoint(
            f"{where}: {MANIFEST_NAME} is not a valid manifest: {exc}"
        ) from None


class Backend(Protocol):
    def child(self, name: str) -> str: ...
    def children(self) -> list[str]: ...
    def manifest(self, uri: str) -> Manifest: ...
    def put(self, local_dir: Path, uri: str, metadata: dict[str, Any]) -> None: ...
    def get(self, uri: str, dest: Path) -> None: ...
    def delete(self, uri: str) -> None: ...
    def sweep(self, step: int) -> None: ...


class S3Backend:
    """Checkpoints under an s3:// prefix, through ObjectStore's commit semantics."""

    def __init__(self, root: str, store: ObjectStore) -> None:
        self.root, self.store = root, store

    def child(self, name: str) -> str:
        return f"{self.root}/{name}"

    def children(self) -> list[str]:
        keys = self.store.list_keys(self.root + "/", recursive=False)
        return [key.rstrip("/").rsplit("/", 1)[-1] for key in keys if key.endswith("/")]

    def manifest(self, uri: str) -> Manifest:
        base = uri.rstrip("/") + "/"
        try:
            marker = self.store.get_bytes(base + COMMIT_MARKER)
        except ObjectNotFound:
            if self.store.list_keys(base):
                raise UncommittedCheckpoint(
                    f"{uri}: no {COMMIT_MARKER}, its upload never finished"
                ) from None
            raise NoCheckpoint(f"{uri}: no checkpoint stored there") from None
        try:
            body = self.store.get_bytes(base + MANIFEST_NAME)
        except ObjectNotFound:
            raise CorruptCheckpoint(f"{uri}: committed but {MANIFEST_NAME} is missing") from None
        return _parse_manifest(uri, marker, body)

    def put(self, local_dir: Path, uri: str, metadata: dict[str, Any]) -> None:
        # A leftover of a killed commit of this step: remove it so no stale object survives.
        if self.store.list_keys(uri + "/"):
            self.store.delete_dir(uri)
        self.store.put_dir(local_dir, uri, metadata=metadata)

    def get(self, uri: str, dest: Path) -> None:
        self.manifest(uri)  # the precise error for an uncommitted, absent or corrupt one
        try:
            self.store.get_dir(uri, dest)
        except IncompleteDirectory as exc:
            raise UncommittedCheckpoint(str(exc)) from None
        except ChecksumMismatch as exc:
            raise CorruptCheckpoint(f"{uri}: {exc}") from None

    def delete(self, uri: str) -> None:
        self.store.delete_dir(uri)

    def sweep(self, step: int) -> None:
        """Uncommitted leftovers of earlier steps (killed commits) are garbage: delete them."""
        for name in self.children():
            match = STEP_DIR.match(name)
            if (
                match
                and int(match.group(1)) < step
                and not self.store.is_committed(self.child(name))
            ):
                log.info("removing uncommitted leftover %s", self.child(name))
                self.store.delete_dir(self.child(name))


class LocalBackend:
    """Checkpoints in a local directory, with the same files, manifest and marker as on S3.

    A commit is written into a hidden temp dir beside the target and renamed into place, so a
    visible `step-*` directory is either complete or a foreign leftover without a marker.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def child(self, name: str) -> str:
        return str(self.root / name)

    def children(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return [p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")]

    def manifest(self, uri: str) -> Manifest:
        path = Path(uri)
        if not path.is_dir():
            raise NoCheckpoint(f"{uri}: no checkpoint stored there")
        marker = path / COMMIT_MARKER
        if not marker.is_file():
            raise UncommittedCheckpoint(f"{uri}: no {COMMIT_MARKER}, its commit never finished")
        try:
            body = (path / MANIFEST_NAME).read_bytes()
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{uri}: committed but {MANIFEST_NAME} is missing") from None
        return _parse_manifest(uri, marker.read_bytes(), body)

    def put(self, local_dir: Path, uri: str, metadata: dict[str, Any]) -> None:
        target = Path(uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")
        try:
            tmp.mkdir()
            files = [self._copy_in(local_dir, rel, tmp) for rel in walk_files(local_dir)]
            manifest = Manifest(
                files=files,
                total_size=sum(f.size for f in files),
                created_at=datetime.now(UTC),
                metadata=metadata,
            )
            body = manifest.model_dump_json(indent=2).encode()
            _write_synced(tmp / MANIFEST_NAME, body)
            _write_synced(tmp / COMMIT_MARKER, hashlib.sha256(body).hexdigest().encode())
            self._move_into_place(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _copy_in(local_dir: Path, rel: str, tmp: Path) -> ManifestFile:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        size, sha256 = _digest_and_copy(local_dir / rel, tmp / rel)
        return ManifestFile(path=rel, size=size, sha256=sha256)

    @staticmethod
    def _move_into_place(tmp: Path, target: Path) -> None:
        # os.replace cannot replace a non-empty directory: move the old one aside first.
        old = target.with_name(f".{target.name}.{uuid.uuid4().hex}.old")
        if target.exists():
            (target / COMMIT_MARKER).unlink(missing_ok=True)  # uncommit before anything else
            target.replace(old)
        tmp.replace(target)
        _fsync_dir(target.parent)
        shutil.rmtree(old, ignore_errors=True)

    def get(self, uri: str, dest: Path) -> None:
        manifest, source = self.manifest(uri), Path(uri)
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise FileExistsError(f"{dest} already exists and is not an empty directory")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.partial")
        try:
            tmp.mkdir()
            for entry in manifest.files:
                (tmp / entry.path).parent.mkdir(parents=True, exist_ok=True)
                try:
                    size, sha256 = _digest_and_copy(source / entry.path, tmp / entry.path)
                except FileNotFoundError:
                    raise CorruptCheckpoint(f"{uri}: {entry.path} is missing") from None
                if (size, sha256) != (entry.size, entry.sha256):
                    raise CorruptCheckpoint(
                        f"{uri}/{entry.path}: sha256 {sha256} ({size} bytes), "
                        f"manifest says {entry.sha256} ({entry.size} bytes)"
                    )
            tmp.replace(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def delete(self, uri: str) -> None:
        path = Path(uri)
        (path / COMMIT_MARKER).unlink(missing_ok=True)  # uncommitted first, as on S3
        shutil.rmtree(path, ignore_errors=True)

    def sweep(self, step: int) -> None:
        """Hidden temp dirs of killed commits, and visible uncommitted dirs, of steps up to `step`."""
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            match = re.match(r"^\.?step-(\d{8,})", path.name)
            if not match or not path.is_dir():
                continue
            step_of = int(match.group(1))
            leftover = path.name.startswith(".") or not (path / COMMIT_MARKER).is_file()
            if leftover and step_of <= step:
                log.info("removing uncommitted leftover %s", path)
                shutil.rmtree(path, ignore_errors=True)


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
