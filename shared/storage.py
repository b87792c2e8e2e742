"""Object storage for checkpoints, dataset snapshots, images and eval outputs, through the S3 API.

Objects are addressed by key in the configured bucket or by `s3://bucket/key` URI. A directory is
uploaded as files, then `manifest.json` (sizes, sha256), then LAST a `_COMMITTED` marker holding
the manifest's sha256: a directory without its marker is incomplete and is never read.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import mimetypes
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, BinaryIO, Final, Literal, NamedTuple, cast

import urllib3
from minio import Minio
from minio.error import MinioException, S3Error
from minio.helpers import MAX_MULTIPART_COUNT, MAX_PART_SIZE, MIN_PART_SIZE
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator
from tenacity import Retrying, retry_if_not_exception_type, stop_after_delay, wait_exponential

from shared.settings import S3Settings

log = logging.getLogger(__name__)

MANIFEST_NAME: Final = "manifest.json"
COMMIT_MARKER: Final = "_COMMITTED"
MANIFEST_SCHEMA_VERSION: Final = 1
_CHUNK = 1024 * 1024
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "ResourceNotFound"})
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class StorageError(Exception):
    """Object storage failed; the message names the object and never holds credentials."""


class ObjectNotFound(StorageError):
    """The object (or its bucket) does not exist."""


class IncompleteDirectory(StorageError):
    """A directory has no commit marker: its upload never finished, so it must not be read."""


class ChecksumMismatch(StorageError):
    """Stored bytes differ from what the manifest (or the commit marker) promises."""

    def __init__(self, uri: str, detail: str) -> None:
        super().__init__(f"{uri}: {detail}")
        self.uri = uri


class StorageUnreachable(StorageError):
    """The S3 endpoint did not answer within the readiness timeout."""


class S3Uri(NamedTuple):
    bucket: str
    key: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def child(self, name: str) -> S3Uri:
        return S3Uri(self.bucket, self.key + name)


Ref = str | S3Uri  # a key in the store's bucket, an "s3://bucket/key" string, or a parsed S3Uri


def _check(bucket: str, key: str, uri: str) -> None:
    if not bucket:
        raise ValueError(f"bucket is missing in {uri!r} (expected s3://bucket/key)")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise ValueError(f"bucket {bucket!r} in {uri!r} is not a valid S3 bucket name")
    if not key:
        raise ValueError(f"key is missing in {uri!r} (expected s3://bucket/key)")
    if key.startswith("/"):
        raise ValueError(f"key {key!r} in {uri!r} starts with '/' (doubled slash?)")
    if len(key.encode()) > 1024:
        raise ValueError(f"key in {uri!r} is longer than S3's 1024 bytes")


def parse_uri(uri: str) -> S3Uri:
    """Split `s3://bucket/key`; the ValueError names the part that is wrong."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme != "s3":
        raise ValueError(f"scheme of {uri!r} must be 's3://' (got {scheme!r})")
    bucket, _, key = rest.partition("/")
    _check(bucket, key, uri)
    return S3Uri(bucket, key)


def make_uri(bucket: str, key: str) -> str:
    uri = f"s3://{bucket}/{key}"
    _check(bucket, key, uri)
    return uri


class ManifestFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str  # relative POSIX path inside the directory
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        # A manifest comes from storage; refuse paths that would write outside the destination.
        if "\\" in path or {"", ".", ".."} & set(path.split("/")):
            raise ValueError(f"path {path!r} must be relative, without '..', '.', '//' or '\\'")
        return path


class Manifest(BaseModel):
    """What a stored directory holds; written before its commit marker."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = MANIFEST_SCHEMA_VERSION
    files: list[ManifestFile]
    total_size: int = Field(ge=0)
    created_at: datetime
    metadata: dict[str, JsonValue] = Field(default_factory=dict)


@dataclass(frozen=True)
class StoredObject:
    """One uploaded or downloaded object, with the sha256 of the bytes that actually moved."""

    uri: str
    size: int
    sha256: str
    etag: str = ""  # S3's; a multipart upload's ends in "-<parts>"


class _HashingReader:
    """Hashes bytes as minio reads them, so an upload needs one pass over the file."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw, self.hash, self.size = raw, hashlib.sha256(), 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.hash.update(data)
        self.size += len(data)
        return data


def _root_reason(exc: BaseException) -> str:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = cast(BaseException, exc.__cause__ or exc.__context__)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


def _client(settings: S3Settings, http: urllib3.PoolManager | None = None) -> Minio:
    # The region is passed so minio never spends a request asking for the bucket's location.
    return Minio(
        settings.endpoint,
        access_key=settings.access_key,
        secret_key=settings.secret_key.get_secret_value(),
        secure=settings.secure,
        region=settings.region,
        http_client=http,
    )


class ObjectStore:
    """A bucket (plus any `s3://` URI) behind the minio client; blocking calls, thread-safe."""

    def __init__(self, client: Minio, settings: S3Settings, *, bucket: str | None = None) -> None:
        self._client, self._settings = client, settings
        self.bucket = bucket or settings.bucket
        self.endpoint = settings.endpoint

    @classmethod
    def from_settings(cls, settings: S3Settings, *, bucket: str | None = None) -> ObjectStore:
        return cls(_client(settings), settings, bucket=bucket)

    # -- plumbing --------------------------------------------------------------------------
    def _locate(self, ref: Ref) -> S3Uri:
        if isinstance(ref, S3Uri):
            return ref
        if "://" in ref:
            return parse_uri(ref)
        _check(self.bucket, ref, ref)
        return S3Uri(self.bucket, ref)

    def _dir(self, ref: Ref) -> S3Uri:
        loc = self._locate(ref)
        return S3Uri(loc.bucket, loc.key.strip("/") + "/")

    def _redact(self, text: str) -> str:
        secret = self._settings.secret_key.get_secret_value()
        return text.replace(secret, "***") if secret else text

    @contextmanager
    def _errors(self, op: str, loc: S3Uri) -> Iterator[None]:
        """Turn minio/urllib3 failures into typed errors naming the object, never the secret."""
        try:
            yield
        except S3Error as exc:
            if exc.code in _NOT_FOUND_CODES:
                what = "bucket does not exist" if exc.code == "NoSuchBucket" else "no such object"
                raise ObjectNotFound(f"{loc}: {what}") from None
            raise StorageError(self._redact(f"{op} {loc}: {exc.code}: {exc.message}")) from None
        except (urllib3.exceptions.HTTPError, MinioException) as exc:
            # Local file errors (OSError) pass through untouched: they are not the server's fault.
            reason = self._redact(_root_reason(exc))
            raise StorageError(f"{op} {loc} failed at S3 {self.endpoint}: {reason}") from None

    @contextmanager
    def _reading(self, op: str, loc: S3Uri) -> Iterator[urllib3.BaseHTTPResponse]:
        with self._errors(op, loc):
            response = self._client.get_object(loc.bucket, loc.key)
            try:
                yield response
            finally:
                response.close()
                response.release_conn()

    def _part_size(self, size: int) -> int:
        single_put_limit = min(self._settings.multipart_threshold_bytes, MAX_PART_SIZE)
        if size <= single_put_limit:
            return max(size, MIN_PART_SIZE)  # one part: minio sends a plain PUT
        # Capping parts at the threshold guarantees two or more of them, i.e. a multipart upload.
        part = min(self._settings.part_size_bytes, single_put_limit)
        return max(part, math.ceil(size / MAX_MULTIPART_COUNT))

    def _upload(self, loc: S3Uri, stream: IO[bytes], size: int, content_type: str) -> StoredObject:
        reader = _HashingReader(stream)
        part_size = self._part_size(size)
        with self._errors("upload", loc):
            result = self._client.put_object(
                loc.bucket, loc.key, cast(BinaryIO, reader), size, content_type, part_size=part_size
            )
        return StoredObject(str(loc), reader.size, reader.hash.hexdigest(), result.etag or "")

    def _download(self, loc: S3Uri, dest: Path) -> StoredObject:
        """Stream an object into `dest` (a fresh path), hashing as it goes."""
        digest, size = hashlib.sha256(), 0
        with self._reading("download", loc) as response, dest.open("wb") as out:
            for chunk in response.stream(_CHUNK):
                digest.update(chunk)
                size += out.write(chunk)
        return StoredObject(str(loc), size, digest.hexdigest())

    # -- readiness and buckets -------------------------------------------------------------
    def wait_until_ready(self, timeout_s: float = 30.0) -> None:
        """Block until S3 answers; raise StorageUnreachable with one clear line after timeout_s."""
        # A probe client without urllib3's own retries, so tenacity alone bounds the wait.
        timeout = urllib3.Timeout(connect=min(2.0, timeout_s), read=min(5.0, timeout_s))
        probe = _client(self._settings, urllib3.PoolManager(timeout=timeout, retries=False))
        retrying = Retrying(
            stop=stop_after_delay(timeout_s),
            wait=wait_exponential(multiplier=0.1, max=1.0),
            retry=retry_if_not_exception_type(S3Error),  # an S3 error means it answered
            reraise=True,
        )
        try:
            retrying(probe.bucket_exists, self.bucket)
        except S3Error as exc:
            key = self._settings.access_key
            raise StorageError(
                f"S3 at {self.endpoint} refused access key {key!r}: {exc.code}"
            ) from None
        except Exception as exc:
            reason = self._redact(_root_reason(exc))
            msg = f"S3 at {self.endpoint} unreachable after {timeout_s:g}s: {reason}"
            raise StorageUnreachable(msg) from None

    def ensure_bucket(self, bucket: str | None = None) -> None:
        """Create the bucket unless it exists; safe to call from every process at start-up."""
        name = bucket or self.bucket
        with self._errors("create bucket", S3Uri(name, "")):
            if self._client.bucket_exists(name):
                return
            try:
                self._client.make_bucket(name, location=self._settings.region)
            except S3Error as exc:
                # Another process may have created it between our check and our request.
                if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

    def remove_bucket(self) -> None:
        """Delete every object in this store's bucket, then the bucket. (On SeaweedFS a bucket
        holds volume slots, 7 by default, until it is removed.)"""
        for key in self.list_keys():
            self.delete(key)
        with self._errors("remove bucket", S3Uri(self.bucket, "")):
            self._client.remove_bucket(self.bucket)

    # -- single objects --------------------------------------------------------------------
    def uri(self, key: str) -> str:
        return make_uri(self.bucket, key)

    def put_bytes(self, ref: Ref, data: bytes, *, content_type: str = "") -> StoredObject:
        """Store small in-memory data (JSON, eval outputs) under a key or URI."""
        kind = content_type or "application/octet-stream"
        return self._upload(self._locate(ref), io.BytesIO(data), len(data), kind)

    def get_bytes(self, ref: Ref) -> bytes:
        """Read a whole object into memory: for small objects only; use get_file for big ones."""
        with self._reading("read", self._locate(ref)) as response:
            return response.read()

    def put_file(
        self, ref: Ref, path: str | os.PathLike[str], *, content_type: str = ""
    ) -> StoredObject:
        """Stream a local file up; above multipart_threshold_bytes it goes in parts."""
        path = Path(path)
        kind = content_type or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        with path.open("rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            return self._upload(self._locate(ref), stream, size, kind)

    def get_file(self, ref: Ref, dest: str | os.PathLike[str]) -> StoredObject:
        """Stream an object to `dest`; a failed download leaves `dest` untouched."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
        try:
            stored = self._download(self._locate(ref), tmp)
            tmp.replace(dest)
        finally:
            tmp.unlink(missing_ok=True)
        return stored

    def exists(self, ref: Ref) -> bool:
        loc = self._locate(ref)
        try:
            with self._errors("stat", loc):
                self._client.stat_object(loc.bucket, loc.key)
        except ObjectNotFound:
            return False
        return True

    def delete(self, ref: Ref) -> None:
        """Remove one object; removing a missing object is not an error (S3 semantics)."""
        loc = self._locate(ref)
        with self._errors("delete", loc):
            self._client.remove_object(loc.bucket, loc.key)

    def list_keys(self, prefix: Ref = "", *, recursive: bool = True) -> list[str]:
        """Keys that start with `prefix`, sorted (a string prefix: "a/b" also matches "a/bc")."""
        loc = self._locate(prefix) if prefix else S3Uri(self.bucket, "")
        with self._errors("list", loc):
            found = self._client.list_objects(loc.bucket, loc.key or None, recursive=recursive)
            return sorted(obj.object_name for obj in found if obj.object_name)

    # -- directories with manifests --------------------------------------------------------
    def put_dir(
        self,
        local_dir: str | os.PathLike[str],
        prefix: Ref,
        metadata: dict[str, JsonValue] | None = None,
    ) -> Manifest:
        """Upload every file under local_dir, then the manifest, then LAST the commit marker."""
        root, base = Path(local_dir), self._dir(prefix)
        if not root.is_dir():
            raise NotADirectoryError(f"{root} is not a directory")
        rel_paths = walk_files(root)
        # Re-uploading over a committed directory: uncommit first so no reader trusts a mix.
        self.delete(base.child(COMMIT_MARKER))
        files = []
        for rel in rel_paths:
            stored = self.put_file(base.child(rel), root / rel)
            files.append(ManifestFile(path=rel, size=stored.size, sha256=stored.sha256))
        total = sum(f.size for f in files)
        manifest = Manifest(
            files=files, total_size=total, created_at=datetime.now(UTC), metadata=metadata or {}
        )
        body = manifest.model_dump_json(indent=2).encode()
        self.put_bytes(base.child(MANIFEST_NAME), body, content_type="application/json")
        marker = hashlib.sha256(body).hexdigest().encode()
        self.put_bytes(base.child(COMMIT_MARKER), marker, content_type="text/plain")
        log.info("stored %d files (%d bytes) at %s", len(files), total, base)
        return manifest

    def is_committed(self, prefix: Ref) -> bool:
        return self.exists(self._dir(prefix).child(COMMIT_MARKER))

    def read_manifest(self, prefix: Ref) -> Manifest:
        """The manifest of a committed directory, checked against the marker's sha256."""
        base = self._dir(prefix)
        try:
            marker = self.get_bytes(base.child(COMMIT_MARKER)).decode().strip()
        except ObjectNotFound:
            raise IncompleteDirectory(f"{base} has no {COMMIT_MARKER}: upload unfinished") from None
        where = base.child(MANIFEST_NAME)
        body = self.get_bytes(where)
        if (actual := hashlib.sha256(body).hexdigest()) != marker:
            raise ChecksumMismatch(str(where), f"sha256 {actual}, marker says {marker}")
        try:
            return Manifest.model_validate_json(body)
        except ValidationError as exc:
            raise StorageError(f"{where} is not a valid manifest: {exc}") from None

    def get_dir(self, prefix: Ref, dest: str | os.PathLike[str]) -> Manifest:
        """Download a committed directory into dest (absent or empty), verifying every file."""
        manifest, base, dest = self.read_manifest(prefix), self._dir(prefix), Path(dest)
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise FileExistsError(f"{dest} already exists and is not an empty directory")
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Download beside dest, then rename: a failure never leaves a half-written dest.
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.partial")
        try:
            tmp.mkdir()
            for entry in manifest.files:
                target = tmp / entry.path
                target.parent.mkdir(parents=True, exist_ok=True)
                _verify(self._download(base.child(entry.path), target), entry)
            tmp.replace(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return manifest

    def delete_dir(self, prefix: Ref) -> int:
        """Delete a stored directory, marker FIRST, so a half-deleted one is never committed."""
        base = self._dir(prefix)
        self.delete(base.child(COMMIT_MARKER))
        keys = self.list_keys(base)
        for key in keys:
            self.delete(S3Uri(base.bucket, key))
        return len(keys)


def _verify(got: StoredObject, entry: ManifestFile) -> None:
    if got.size != entry.size:
        raise ChecksumMismatch(got.uri, f"size {got.size}, manifest says {entry.size}")
    if got.sha256 != entry.sha256:
        raise ChecksumMismatch(got.uri, f"sha256 {got.sha256}, manifest says {entry.sha256}")


def walk_files(root: Path) -> list[str]:
    """Relative POSIX paths of every file under root, sorted; refuses our reserved names."""
    found = sorted(
        Path(dirpath, name).relative_to(root).as_posix()
        for dirpath, _dirs, names in os.walk(root)
        for name in names
    )
    for reserved in (MANIFEST_NAME, COMMIT_MARKER):
        if reserved in found:
            raise ValueError(f"{root / reserved}: the name {reserved!r} is reserved by the store")
    return found
