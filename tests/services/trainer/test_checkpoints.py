"""Checkpoints: the training state round-trips exactly; commits on S3 and on a local directory
follow the same rules (marker last, retention, verified fetch); an uncommitted or corrupt
checkpoint, including one left by a process SIGKILLed mid-commit, is never picked."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaForCausalLM

from services.trainer.checkpoints import (
    CHECKPOINT_DIR_FORMAT,
    CheckpointError,
    CheckpointStore,
    CorruptCheckpoint,
    NoCheckpoint,
    UncommittedCheckpoint,
    capture_rng_state,
    load_model_weights,
    load_training_state,
    restore_rng_state,
    save_training_state,
)
from services.trainer.config import CheckpointPolicy
from shared.settings import Settings
from shared.storage import COMMIT_MARKER, MANIFEST_NAME, ObjectStore
from tests.plugins.infra import settings_env
from tests.plugins.models import build_tiny_causal_lm

REPO_ROOT = Path(__file__).resolve().parents[3]
POLICY = CheckpointPolicy(keep_last=2, keep_best=True, best_metric="loss")

# --- training state ------------------------------------------------------------------------------


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_state_round_trips_through_a_file(tmp_path: Path) -> None:
    torch.save(capture_rng_state(), tmp_path / "rng.pt")
    expected = _draws()
    _draws()  # move every generator on

    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))

    assert _draws() == expected


def _lora(model: LlamaForCausalLM) -> PeftModel:
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.2, target_modules="all-linear")
    return get_peft_model(model, config)  # type: ignore[return-value]


def _optimizer(
    model: torch.nn.Module,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return optimizer, scheduler


def _steps(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: object, n: int
) -> list[float]:
    """n training steps on random batches drawn from the global RNG (dropout draws from it too)."""
    model.train()
    losses = []
    for _ in range(n):
        input_ids = torch.randint(3, 500, (2, 12))
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        scheduler.step()  # type: ignore[attr-defined]
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_full_weights_round_trip_with_tied_embeddings(
    tmp_path: Path, tiny_model: LlamaForCausalLM
) -> None:
    optimizer, scheduler = _optimizer(tiny_model)
    _steps(tiny_model, optimizer, scheduler, 1)
    save_training_state(
        tmp_path, model=tiny_model, optimizer=optimizer, scheduler=None, state={"step": 1}
    )
    other = build_tiny_causal_lm(seed=7)

    load_model_weights(tmp_path, other)

    mine, theirs = tiny_model.state_dict(), other.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[name], theirs[name]) for name in mine)
    assert other.lm_head.weight.data_ptr() == other.model.embed_tokens.weight.data_ptr()


def test_model_kind_mismatch_is_refused(tmp_path: Path, tiny_model: LlamaForCausalLM) -> None:
    peft_model = _lora(build_tiny_causal_lm())
    peft_model.save_pretrained(tmp_path / "adapter" / "model")
    tiny_model.save_pretrained(tmp_path / "full" / "model")

    with pytest.raises(CheckpointError, match="holds a PEFT adapter but the model has none"):
        load_model_weights(tmp_path / "adapter", build_tiny_causal_lm())
    with pytest.raises(CheckpointError, match="holds full weights but the model is a PEFT model"):
        load_model_weights(tmp_path / "full", peft_model)


def test_missing_state_files_are_named(tmp_path: Path, tiny_model: LlamaForCausalLM) -> None:
    optimizer, scheduler = _optimizer(tiny_model)
    (tmp_path / "trainer_state.json").write_text("{}")

    with pytest.raises(CheckpointError, match=r"optimizer\.pt: missing"):
        load_training_state(tmp_path, optimizer=optimizer, scheduler=scheduler)
    with pytest.raises(CheckpointError, match=r"trainer_state\.json: trainer state is not JSON"):
        save_training_state(
            tmp_path / "x",
            model=tiny_model,
            optimizer=optimizer,
            scheduler=None,
            state={"x": object()},
        )


# --- the store, on both backends -----------------------------------------------------------------


@pytest.fixture(params=["local", "s3"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., CheckpointStore]:
    """Builds CheckpointStores on one output prefix: a local directory or an s3:// prefix."""
    if request.param == "local":
        prefix, store = str(tmp_path / "output"), None
    else:
        store = request.getfixturevalue("object_store")
        prefix = f"s3://{store.bucket}/runs/job-1"

    def make(**policy: object) -> CheckpointStore:
        return CheckpointStore(prefix, store=store, policy=POLICY.model_copy(update=policy))

    return make


def test_lora_training_continues_identically_after_commit_fetch_and_load(
    tmp_path: Path, tiny_model: LlamaForCausalLM, make_store: Callable[..., CheckpointStore]
) -> None:
    torch.manual_seed(1)
    model = _lora(tiny_model)
    optimizer, scheduler = _optimizer(model)
    _steps(model, optimizer, scheduler, 2)
    state = {
        "step": 2,
        "epoch": 0,
        "data_position": {"epoch": 0, "batch_index": 2},
        "losses": [1.0],
    }
    save_training_state(
        tmp_path / "save", model=model, optimizer=optimizer, scheduler=scheduler, state=state
    )
    uninterrupted = _steps(model, optimizer, scheduler, 3)

    store = make_store()
    uri = store.commit(tmp_path / "save", step=2, metrics={"loss": 1.0})
    local = store.fetch(store.resolve("latest"), tmp_path / "fetched")
    torch.manual_seed(99)  # a fresh process: other RNG states, other adapter init
    resumed = _lora(build_tiny_causal_lm())
    load_model_weights(local, resumed)
    optimizer2, scheduler2 = _optimizer(resumed)
    loaded_state = load_training_state(local, optimizer=optimizer2, scheduler=scheduler2)

    assert uri == f"{store.root}/step-00000002"
    assert loaded_state == state
    assert {p.name for p in (local / "model").iterdir()} >= {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    assert _steps(resumed, optimizer2, scheduler2, 3) == pytest.approx(uninterrupted, abs=1e-6)


def _fake_checkpoint(root: Path, content: str) -> Path:
    """A small directory shaped like a checkpoint: enough for the storage rules."""
    (root / "model").mkdir(parents=True)
    (root / "model" / "adapter_model.safetensors").write_text(f"weights {content}")
    (root / "trainer_state.json").write_text(f'{{"note": "{content}"}}')
    return root


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*") if p.is_file()}


def _steps_of(store: CheckpointStore) -> list[int]:
    return [info.step for info in store.committed()]


def test_commit_then_latest_and_fetch_verify(
    make_store: Callable[..., CheckpointStore], tmp_path: Path
) -> None:
    store = make_store()
    assert store.latest() is None
    source = _fake_checkpoint(tmp_path / "ck", "ten")

    uri = store.commit(source, step=10, metrics={"loss": 0.5, "eval_loss": 0.7})
    fetched = store.fetch(store.resolve("latest"), tmp_path / "fetched")

    assert uri.endswith("/checkpoints/" + CHECKPOINT_DIR_FORMAT.format(step=10))
    assert store.latest() == uri
    assert store.info(uri).metrics == {"loss": 0.5, "eval_loss": 0.7}
    assert _tree(fetched) == _tree(source)


def test_retention_keeps_the_last_k_and_the_best(
    make_store: Callable[..., CheckpointStore], tmp_path: Path
) -> None:
    store = make_store(keep_last=2, keep_best=True)
    losses = {10: 0.5, 20: 0.2, 30: 0.4, 40: 0.3, 50: 0.35}
    uris = {
        step: store.commit(
            _fake_checkpoint(tmp_path / str(step), str(step)), step=step, metrics={"loss": loss}
        )
        for step, loss in losses.items()
    }

    assert _steps_of(store) == [20, 40, 50]
    assert store.best() == uris[20]
    with pytest.raises(NoCheckpoint):
        store.fetch(uris[10], tmp_path / "gone")

    make_store(keep_last=2, keep_best=False).commit(
        _fake_checkpoint(tmp_path / "60", "60"), step=60, metrics={"loss": 0.9}
    )
    assert _steps_of(store) == [50, 60]


def test_a_job_with_evals_keeps_every_checkpoint(
    make_store: Callable[..., CheckpointStore], tmp_path: Path
) -> None:
    """The scheduler's policy for jobs with evals: no loss-based best, keep_last >= the planned
    count. Every checkpoint stays until the final decision (the scheduler prunes then), even
    when the training loss rises: the task score, not the loss, picks the one to register."""
    planned = [5, 10, 15, 20, 23]  # the cadence, plus the last step
    store = make_store(keep_last=len(planned), keep_best=False)
    losses = iter([0.9, 0.4, 0.6, 0.8, 1.0])
    uris = [
        store.commit(
            _fake_checkpoint(tmp_path / str(step), str(step)),
            step=step,
            metrics={"loss": next(losses)},
        )
        for step in planned
    ]

    assert _steps_of(store) == planned
    assert [info.uri for info in store.committed()] == uris
    assert store.latest() == uris[-1]


def test_a_resumed_run_replaces_the_later_checkpoints_of_the_run_it_left(
    make_store: Callable[..., CheckpointStore], tmp_path: Path
) -> None:
    store = make_store(keep_last=10, keep_best=True)
    for step in (10, 20, 30):
        store.commit(
            _fake_checkpoint(tmp_path / str(step), str(step)), step=step, metrics={"loss": 0.1}
        )
    # Resumed from step 10 (say, after a bad step 20), the new run checkpoints at 15.
    resumed = store.commit(_fake_checkpoint(tmp_path / "15", "15"), step=15, metrics={"loss": 0.5})
    assert _steps_of(store) == [10, 15]
    assert store.latest() == resumed


def test_the_checkpoint_just_written_is_never_pruned(
    make_store: Callable[..., CheckpointStore], tmp_path: Path
) -> None:
    store = make_store(keep_last=1, keep_best=False)
    store.commit(_fake_checkpoint(tmp_path / "a", "a"), step=50, metrics={})

    older = store.commit(
        _fake_checkpoint(tmp_path / "b", "b"), step=30, metrics={}
    )  # resumed from earlier

    assert _steps_of(store) == [30]  # 50 belonged to the run this one replaced
    assert store.info(older).step == 30


def _write_uncommitted(
    store: CheckpointStore, object_store: ObjectStore | None, step: int, tmp_path: Path
) -> str:
    """Files of a checkpoint without manifest and marker, as a commit killed half-way leaves them."""
    uri = f"{store.root}/{CHECKPOINT_DIR_FORMAT.format(step=step)}"
    partial = _fake_checkpoint(tmp_path / f"partial-{step}", "stale")
    (partial / "stale-extra.bin").write_text("from the killed commit")
    if object_store is None:
        Path(uri).mkdir(parents=True)
        for rel, text in _tree(partial).items():
            (Path(uri) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(uri) / rel).write_text(text)
    else:
        for rel, text in _tree(partial).items():
            object_store.put_bytes(f"{uri}/{rel}", text.encode())
    return uri


def test_an_uncommitted_checkpoint_is_skipped_refused_and_cleanly_replaced(
    make_store: Callable[..., CheckpointStore], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store()
    object_store = store._store  # the same bucket, to write what a killed upload leaves
    good = store.commit(_fake_checkpoint(tmp_path / "good", "good"), step=10, metrics={"loss": 1.0})
    partial = _write_uncommitted(store, object_store, 20, tmp_path)

    assert store.latest() == good
    assert store.resolve("latest") == good
    with pytest.raises(UncommittedCheckpoint, match=COMMIT_MARKER):
        store.resolve(partial)
    with pytest.raises(UncommittedCheckpoint):
        store.fetch(partial, tmp_path / "nope")

    redo = store.commit(_fake_checkpoint(tmp_path / "redo", "redo"), step=20, metrics={"loss": 0.9})

    assert redo == partial
    assert store.latest() == redo
    assert _tree(store.fetch(redo, tmp_path / "fetched")) == _tree(tmp_path / "redo")
    stored = _stored_names(store, object_store, redo)
    assert "stale-extra.bin" not in stored
    assert {MANIFEST_NAME, COMMIT_MARKER} <= stored


def _stored_names(store: CheckpointStore, object_store: ObjectStore | None, uri: str) -> set[str]:
    if object_store is None:
        return {p.relative_to(uri).as_posix() for p in Path(uri).rglob("*") if p.is_file()}
    prefix = uri.split("/", 3)[3] + "/"
    return {key[len(prefix) :] for key in object_store.list_keys(uri + "/")}


def test_a_corrupt_checkpoint_is_skipped_and_refused(
    make_store: Callable[..., CheckpointStore], tmp_path: Path
) -> None:
    store = make_store(keep_last=5)
    object_store = store._store
    good = store.commit(_fake_checkpoint(tmp_path / "a", "a"), step=10, metrics={})
    tampered_manifest = store.commit(_fake_checkpoint(tmp_path / "b", "b"), step=20, metrics={})
    tampered_file = store.commit(_fake_checkpoint(tmp_path / "c", "c"), step=30, metrics={})
    _overwrite(object_store, f"{tampered_manifest}/{MANIFEST_NAME}", b'{"files": []}')
    _overwrite(object_store, f"{tampered_file}/trainer_state.json", b'{"note": "changed"}')

    assert [info.uri for info in store.committed()] == [
        good,
        tampered_file,
    ]  # a bad file is found on fetch
    with pytest.raises(CorruptCheckpoint, match="marker says"):
        store.resolve(tampered_manifest)
    with pytest.raises(CorruptCheckpoint, match=r"trainer_state\.json"):
        store.fetch(tampered_file, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    _overwrite(object_store, f"{tampered_file}/{COMMIT_MARKER}", None)
    assert store.latest() == good


def _overwrite(object_store: ObjectStore | None, location: str, data: bytes | None) -> None:
    if object_store is None:
        path = Path(location)
        path.unlink() if data is None else path.write_bytes(data)
    elif data is None:
        object_store.delete(location)
    else:
        object_store.put_bytes(location, data)


def test_resolving_nothing_says_so(make_store: Callable[..., CheckpointStore]) -> None:
    store = make_store()

    with pytest.raises(NoCheckpoint, match="resume_from=latest: no committed checkpoint"):
        store.resolve("latest")
    with pytest.raises(NoCheckpoint, match="no checkpoint stored there"):
        store.resolve(f"{store.root}/step-00000099")


def test_an_s3_prefix_without_object_storage_is_refused() -> None:
    with pytest.raises(CheckpointError, match="needs object storage"):
        CheckpointStore("s3://bucket/run", store=None, policy=POLICY)


# --- a real kill mid-commit ----------------------------------------------------------------------

# The child commits a checkpoint and, once the first file has landed, stops inside the commit and
# says so; the test then SIGKILLs it. Only the hook that pauses it is test code.
_KILLED_COMMIT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from services.trainer import checkpoint_storage, checkpoints
    from services.trainer.config import CheckpointPolicy
    from shared.settings import S3Settings
    from shared.storage import ObjectStore

    prefix, source, step = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])

    def pause_after(original):
        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            print("mid-commit", flush=True)
            time.sleep(600)
            return result
        return wrapper

    if prefix.startswith("s3://"):
        ObjectStore.put_file = pause_after(ObjectStore.put_file)
    else:
        checkpoint_storage._digest_and_copy = pause_after(checkpoint_storage._digest_and_copy)
    s3 = ObjectStore.from_settings(S3Settings()) if prefix.startswith("s3://") else None
    store = checkpoints.CheckpointStore(prefix, store=s3, policy=CheckpointPolicy())
    store.commit(source, step=step, metrics={"loss": 0.1})
    print("finished", flush=True)
    """
)


def _commit_and_kill(prefix: str, source: Path, step: int, env: dict[str, str]) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_COMMIT, prefix, str(source), str(step)],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        assert line == "mid-commit", (
            f"child did not reach the commit: {line!r} {child.stderr.read() if child.poll() is not None else ''}"
        )  # type: ignore[union-attr]
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(30)
        child.stdout.close()  # type: ignore[union-attr]
        child.stderr.close()  # type: ignore[union-attr]
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_commit_killed_by_sigkill_is_never_picked(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env: dict[str, str] = {}
    object_store: ObjectStore | None = None
    if backend == "s3":
        object_store = request.getfixturevalue("object_store")
        stack: Settings = request.getfixturevalue("stack_settings")
        env = settings_env(stack) | {"TUNELOOP_S3_BUCKET": object_store.bucket}
        prefix = f"s3://{object_store.bucket}/runs/{uuid.uuid4().hex[:8]}"
    else:
        prefix = str(tmp_path / "output")
    store = CheckpointStore(prefix, store=object_store, policy=POLICY)
    good = store.commit(_fake_checkpoint(tmp_path / "good", "good"), step=10, metrics={"loss": 1.0})
    big = _fake_checkpoint(tmp_path / "big", "big")
    (big / "optimizer.pt").write_bytes(os.urandom(64 * 1024))

    _commit_and_kill(prefix, big, 20, env)

    killed = f"{store.root}/step-00000020"
    left_behind = _leftovers(store, object_store, killed)
    assert left_behind, "the kill should leave part of the commit behind"
    assert store.latest() == good
    assert _steps_of(store) == [10]
    with pytest.raises(CheckpointError):
        store.resolve(killed)

    redo = store.commit(big, step=20, metrics={"loss": 0.5})

    assert store.latest() == redo == killed
    assert _tree_bytes(store.fetch(redo, tmp_path / "fetched")) == _tree_bytes(big)
    assert not _leftovers(store, object_store, killed, committed_ok=True)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _leftovers(
    store: CheckpointStore,
    object_store: ObjectStore | None,
    uri: str,
    *,
    committed_ok: bool = False,
) -> list[str]:
    """What a killed commit of `uri` left: objects under it without a marker (S3), or hidden temp dirs (local)."""
    if object_store is not None:
        keys = object_store.list_keys(uri + "/")
        committed = any(key.endswith("/" + COMMIT_MARKER) for key in keys)
        return [] if committed and committed_ok else keys
    name = Path(uri).name
    return [p.name for p in Path(store.root).iterdir() if p.name.startswith(f".{name}.")]
