"""shared.storage against a real SeaweedFS S3 gateway: objects, manifests, commit markers, URLs."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from shared.settings import Settings
from shared.storage import (
    COMMIT_MARKER,
    MANIFEST_NAME,
    ChecksumMismatch,
    IncompleteDirectory,
    Manifest,
    ManifestFile,
    ObjectNotFound,
    ObjectStore,
    S3Uri,
    StorageError,
    StorageUnreachable,
    make_uri,
    parse_uri,
)
from tests.plugins.infra import RunningProcess, bucket_of_its_own, free_port

MiB = 1024 * 1024


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def store(object_store: ObjectStore) -> ObjectStore:
    return object_store


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> dict[str, bytes]:
    """A small nested directory shaped like a Hugging Face checkpoint; returns path -> bytes."""
    files = {
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors": os.urandom(70_000),
        "tokenizer/tokenizer.json": b'{"version": "1.0"}',
        "tokenizer/deep/er/special.txt": b"<s></s>",
        "empty.bin": b"",
    }
    for rel, data in files.items():
        path = tmp_path / "ckpt" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def test_ensure_bucket_is_idempotent(store: ObjectStore) -> None:
    store.ensure_bucket()
    store.ensure_bucket()
    assert store.list_keys() == []


def test_bytes_round_trip_exists_delete_and_list(store: ObjectStore) -> None:
    stored = store.put_bytes("evals/run-1/scores.json", b'{"acc": 0.9}')
    store.put_bytes(store.uri("evals/run-2/scores.json"), b"{}")
    assert stored.uri == f"s3://{store.bucket}/evals/run-1/scores.json"
    assert stored.sha256 == _sha(b'{"acc": 0.9}')
    assert store.get_bytes(stored.uri) == b'{"acc": 0.9}'
    assert store.exists("evals/run-1/scores.json")
    assert store.list_keys("evals/") == ["evals/run-1/scores.json", "evals/run-2/scores.json"]
    store.delete("evals/run-1/scores.json")
    assert not store.exists("evals/run-1/scores.json")
    assert store.list_keys("evals/") == ["evals/run-2/scores.json"]


def test_dir_round_trips_nested_files_with_a_true_manifest(
    store: ObjectStore, checkpoint_dir: dict[str, bytes], tmp_path: Path
) -> None:
    manifest = store.put_dir(tmp_path / "ckpt", "runs/r1/ckpt-10", metadata={"step": 10})

    assert {f.path: (f.size, f.sha256) for f in manifest.files} == {
        rel: (len(data), _sha(data)) for rel, data in checkpoint_dir.items()
    }
    assert manifest.total_size == sum(len(d) for d in checkpoint_dir.values())
    assert manifest.metadata == {"step": 10}
    assert manifest.schema_version == 1
    assert store.is_committed("runs/r1/ckpt-10")
    assert store.read_manifest(f"s3://{store.bucket}/runs/r1/ckpt-10/") == manifest
    keys = store.list_keys("runs/r1/ckpt-10/")
    assert f"runs/r1/ckpt-10/{MANIFEST_NAME}" in keys
    assert f"runs/r1/ckpt-10/{COMMIT_MARKER}" in keys

    got = store.get_dir("runs/r1/ckpt-10", tmp_path / "restored")
    assert got == manifest
    restored = {
        p.relative_to(tmp_path / "restored").as_posix(): p.read_bytes()
        for p in (tmp_path / "restored").rglob("*")
        if p.is_file()
    }
    assert restored == checkpoint_dir  # the manifest and marker are not copied into dest


def test_tampered_object_raises_checksum_mismatch_and_leaves_no_dest(
    store: ObjectStore, checkpoint_dir: dict[str, bytes], tmp_path: Path
) -> None:
    store.put_dir(tmp_path / "ckpt", "runs/r1/ckpt-1")
    original = checkpoint_dir["tokenizer/tokenizer.json"]
    # Same size, different bytes: only the sha256 can catch it.
    store.put_bytes("runs/r1/ckpt-1/tokenizer/tokenizer.json", original.upper())
    dest_parent = tmp_path / "downloads"
    dest_parent.mkdir()

    with pytest.raises(ChecksumMismatch, match=r"tokenizer/tokenizer\.json: sha256") as err:
        store.get_dir("runs/r1/ckpt-1", dest_parent / "ckpt")

    assert err.value.uri.endswith("runs/r1/ckpt-1/tokenizer/tokenizer.json")
    assert list(dest_parent.iterdir()) == []  # neither dest nor a temp dir is left behind


def test_rewritten_manifest_no_longer_matches_its_marker(
    store: ObjectStore, checkpoint_dir: dict[str, bytes], tmp_path: Path
) -> None:
    manifest = store.put_dir(tmp_path / "ckpt", "runs/r1/ckpt-2")
    forged = manifest.model_copy(update={"metadata": {"forged": True}})
    store.put_bytes(f"runs/r1/ckpt-2/{MANIFEST_NAME}", forged.model_dump_json().encode())

    with pytest.raises(ChecksumMismatch, match=MANIFEST_NAME):
        store.read_manifest("runs/r1/ckpt-2")


def test_directory_without_marker_is_incomplete_and_not_listed(
    store: ObjectStore, checkpoint_dir: dict[str, bytes], tmp_path: Path
) -> None:
    for step in (9, 10, 100):
        store.put_dir(tmp_path / "ckpt", f"runs/r7/ckpt-{step}")
    # A crash mid-upload: files and even the manifest are there, the marker never got written.
    crashed = "runs/r7/ckpt-200"
    store.put_file(f"{crashed}/config.json", tmp_path / "ckpt" / "config.json")
    store.put_bytes(
        f"{crashed}/{MANIFEST_NAME}", store.get_bytes(f"runs/r7/ckpt-9/{MANIFEST_NAME}")
    )

    assert not store.is_committed(crashed)
    with pytest.raises(IncompleteDirectory, match=rf"ckpt-200/ has no {COMMIT_MARKER}"):
        store.get_dir(crashed, tmp_path / "never")
    with pytest.raises(IncompleteDirectory):
        store.read_manifest(crashed)
    assert not (tmp_path / "never").exists()
    assert all(store.is_committed(f"runs/r7/ckpt-{step}") for step in (9, 10, 100))


def test_delete_dir_uncommits_first_and_removes_everything(
    store: ObjectStore, checkpoint_dir: dict[str, bytes], tmp_path: Path
) -> None:
    store.put_dir(tmp_path / "ckpt", "runs/r2/ckpt-1")
    store.put_dir(tmp_path / "ckpt", "runs/r2/ckpt-2")

    removed = store.delete_dir("runs/r2/ckpt-1")

    assert removed == len(checkpoint_dir) + 1  # the files and the manifest; the marker went first
    assert store.list_keys("runs/r2/ckpt-1/") == []
    assert not store.is_committed("runs/r2/ckpt-1")
    assert store.is_committed("runs/r2/ckpt-2")


def test_get_dir_refuses_a_non_empty_destination(
    store: ObjectStore, checkpoint_dir: dict[str, bytes], tmp_path: Path
) -> None:
    store.put_dir(tmp_path / "ckpt", "runs/r3/ckpt-1")
    with pytest.raises(FileExistsError, match="not an empty directory"):
        store.get_dir("runs/r3/ckpt-1", tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "config.json").read_bytes() == checkpoint_dir["config.json"]


def test_put_dir_refuses_a_file_with_a_reserved_name(store: ObjectStore, tmp_path: Path) -> None:
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / MANIFEST_NAME).write_text("{}")
    with pytest.raises(ValueError, match=rf"'{MANIFEST_NAME}' is reserved"):
        store.put_dir(tmp_path / "snap", "datasets/d1")
    assert store.list_keys("datasets/") == []


def test_file_above_threshold_goes_multipart_and_round_trips(
    s3_server: RunningProcess, stack_settings: Settings, tmp_path: Path
) -> None:
    s3 = stack_settings.s3.model_copy(
        update={"multipart_threshold_bytes": 5 * MiB, "part_size_bytes": 16 * MiB}
    )
    with bucket_of_its_own(s3) as store:
        big, small = tmp_path / "big.bin", tmp_path / "small.bin"
        big.write_bytes(os.urandom(12 * MiB + 123))
        small.write_bytes(os.urandom(5 * MiB))  # exactly at the threshold: one plain PUT

        up_big = store.put_file("blobs/big.bin", big)
        up_small = store.put_file("blobs/small.bin", small)
        down = store.get_file("blobs/big.bin", tmp_path / "out" / "big.bin")

        # An S3 multipart ETag ends in "-<number of parts>"; the part size is capped at the threshold.
        assert up_big.etag.strip('"').endswith("-3")
        assert "-" not in up_small.etag.strip('"')
        assert up_big.size == down.size == big.stat().st_size
        assert up_big.sha256 == down.sha256 == _sha(big.read_bytes())
        assert (tmp_path / "out" / "big.bin").read_bytes() == big.read_bytes()


def test_missing_objects_raise_object_not_found(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound, match=rf"s3://{store.bucket}/nope/missing\.bin: no such"):
        store.get_bytes("nope/missing.bin")
    with pytest.raises(ObjectNotFound):
        store.get_file("nope/missing.bin", tmp_path / "missing.bin")
    with pytest.raises(ObjectNotFound, match="bucket does not exist"):
        store.get_bytes("s3://no-such-bucket-here/key")
    assert not store.exists("nope/missing.bin")
    assert list(tmp_path.iterdir()) == []  # no partial download file left behind


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("http://bucket/key", "scheme of 'http://bucket/key' must be 's3://'"),
        ("bucket/key", "scheme of 'bucket/key' must be 's3://'"),
        ("s3:///key", "bucket is missing"),
        ("s3://Bad_Bucket/key", "bucket 'Bad_Bucket' in 's3://Bad_Bucket/key' is not a valid"),
        ("s3://bucket", "key is missing"),
        ("s3://bucket/", "key is missing"),
        ("s3://bucket//key", "key '/key' in 's3://bucket//key' starts with '/'"),
    ],
)
def test_bad_uris_name_the_problem(uri: str, problem: str) -> None:
    with pytest.raises(ValueError, match="^" + problem.replace("(", r"\(")):
        parse_uri(uri)


def test_uris_round_trip() -> None:
    uri = make_uri("tuneloop", "runs/r1/ckpt-3/model.safetensors")
    assert uri == "s3://tuneloop/runs/r1/ckpt-3/model.safetensors"
    assert parse_uri(uri) == S3Uri("tuneloop", "runs/r1/ckpt-3/model.safetensors")
    assert str(parse_uri(uri)) == uri
    with pytest.raises(ValueError, match="key is missing"):
        make_uri("tuneloop", "")


@pytest.mark.parametrize(
    "path", ["../escape", "/etc/passwd", "a/../../b", "a\\b", "./a", "a//b", "dir/", ""]
)
def test_manifest_refuses_paths_that_escape_the_destination(path: str) -> None:
    with pytest.raises(ValidationError, match="must be relative"):
        ManifestFile(path=path, size=1, sha256="0" * 64)
    assert Manifest.model_fields["schema_version"].default == 1


def test_wait_until_ready_returns_when_s3_answers(store: ObjectStore) -> None:
    store.wait_until_ready(timeout_s=5)
    assert store.list_keys() == []


def test_wait_until_ready_fails_with_one_clear_line_on_a_closed_port(
    stack_settings: Settings,
) -> None:
    port = free_port()
    s3 = stack_settings.s3.model_copy(update={"endpoint": f"127.0.0.1:{port}"})
    store = ObjectStore.from_settings(s3)
    started = time.monotonic()

    with pytest.raises(StorageUnreachable) as err:
        store.wait_until_ready(timeout_s=1)

    message = str(err.value)
    assert message == f"S3 at 127.0.0.1:{port} unreachable after 1s: Connection refused"
    assert s3.secret_key.get_secret_value() not in message
    assert time.monotonic() - started < 15  # bounded: it gives up instead of hanging


def test_wait_until_ready_fails_fast_on_refused_credentials(
    s3_server: RunningProcess, stack_settings: Settings
) -> None:
    s3 = stack_settings.s3.model_copy(update={"secret_key": SecretStr("not-the-secret-123")})
    store = ObjectStore.from_settings(s3)

    with pytest.raises(StorageError, match=f"refused access key '{s3.access_key}'") as err:
        store.wait_until_ready(timeout_s=30)

    assert not isinstance(err.value, StorageUnreachable)  # it answered: no point waiting 30s
    assert "not-the-secret-123" not in str(err.value)


def test_remove_bucket_deletes_its_objects_and_the_bucket(
    s3_server: RunningProcess, stack_settings: Settings
) -> None:
    store = ObjectStore.from_settings(stack_settings.s3, bucket=f"t-{uuid.uuid4().hex[:16]}")
    store.ensure_bucket()
    store.put_bytes("a/b.txt", b"x")
    store.put_bytes("c.txt", b"y")
    store.remove_bucket()
    with pytest.raises(StorageError, match="bucket does not exist"):
        store.list_keys()
