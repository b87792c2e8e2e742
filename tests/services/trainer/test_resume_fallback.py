"""Resuming falls back to the newest checkpoint that verifies: `latest` goes down the committed
checkpoints newest first, then `resume_fallbacks` in order; what is skipped is logged and
reported, a fresh start happens only when there was nothing at all, and a set of checkpoints none
of which verifies fails the run with the reason for each."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from services.trainer.__main__ import EXIT_BAD_CONFIG, EXIT_OK, main
from services.trainer.checkpoints import CheckpointStore
from services.trainer.config import CheckpointPolicy, parse_config
from services.trainer.loop import run_training
from services.trainer.resume import NoUsableCheckpoint, ResumePoint, fetch_first_usable
from shared.storage import COMMIT_MARKER, MANIFEST_NAME, ObjectStore
from tests.services.trainer.jobs import (
    final_history,
    flip_bytes,
    isolated_logging,
    start_trainer,
    tiny_job,
    tiny_snapshot,
    webhook_receiver,
    webhook_section,
    write_job,
)

pytestmark = pytest.mark.usefixtures(isolated_logging.__name__)

POLICY = CheckpointPolicy(keep_last=5)
WEIGHTS = "model/adapter_model.safetensors"


def _step(step: int) -> str:
    return f"step-{step:08d}"


# --- the order and the rules, on small stand-in checkpoints ---------------------------------------


def _fake_checkpoint(root: Path, content: str) -> Path:
    (root / "model").mkdir(parents=True)
    (root / WEIGHTS).write_text(f"weights {content}")
    (root / "trainer_state.json").write_text(json.dumps({"note": content}))
    return root


@pytest.fixture(params=["local", "s3"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], CheckpointStore]:
    """Stores on output prefixes of one backend: a local directory or an s3:// prefix."""

    def make(name: str) -> CheckpointStore:
        if request.param == "local":
            return CheckpointStore(str(tmp_path / name), store=None, policy=POLICY)
        store: ObjectStore = request.getfixturevalue("object_store")
        prefix = f"s3://{store.bucket}/fallback-{id(tmp_path)}/{name}"
        return CheckpointStore(prefix, store=store, policy=POLICY)

    return make


def _commit(store: CheckpointStore, tmp_path: Path, step: int) -> str:
    return store.commit(
        _fake_checkpoint(tmp_path / f"src-{step}", str(step)), step=step, metrics={}
    )


def _damage(store: CheckpointStore, location: str) -> None:
    """Flip bytes of a stored file (local) or replace it by one of the same size (S3)."""
    object_store = store._store
    if object_store is None:
        flip_bytes(Path(location))
        return
    data = object_store.get_bytes(location)
    object_store.put_bytes(location, bytes(b ^ 0xFF for b in data))


def test_latest_goes_down_to_the_newest_checkpoint_that_verifies(
    make_store: Callable[[str], CheckpointStore], tmp_path: Path
) -> None:
    store = make_store("out")
    good, bad_manifest, bad_file = (_commit(store, tmp_path, step) for step in (10, 20, 30))
    _damage(store, f"{bad_file}/{WEIGHTS}")
    _damage(store, f"{bad_manifest}/{MANIFEST_NAME}")

    point = fetch_first_usable(store, "latest", [], tmp_path / "resume")

    assert point.uri == good
    assert [s.uri for s in point.skipped] == [bad_file, bad_manifest]
    assert "sha256" in point.skipped[0].error
    assert WEIGHTS in point.skipped[0].error
    assert "marker says" in point.skipped[1].error
    assert (tmp_path / "resume" / WEIGHTS).read_text() == "weights 10"


def test_resume_from_then_each_fallback_in_order(tmp_path: Path) -> None:
    previous = CheckpointStore(str(tmp_path / "attempt-1"), store=None, policy=POLICY)
    older, newest = _commit(previous, tmp_path, 10), _commit(previous, tmp_path, 20)
    flip_bytes(Path(newest) / WEIGHTS)
    gone = f"{previous.root}/{_step(30)}"
    store = CheckpointStore(str(tmp_path / "attempt-2"), store=None, policy=POLICY)

    # What an attempt is given: the job's newest checkpoint, then older ones; one tried twice
    # (a fallback that `latest` already covered) is tried once.
    point = fetch_first_usable(store, newest, [gone, newest, older], tmp_path / "resume")
    assert point.uri == older
    assert [s.uri for s in point.skipped] == [newest, gone]
    assert "no checkpoint stored there" in point.skipped[1].error

    # SkyPilot's run: the attempt's own checkpoints first, none yet on its first run.
    point = fetch_first_usable(store, "latest", [newest, older], tmp_path / "resume-2")
    assert point.uri == older
    assert [s.uri for s in point.skipped] == [newest]


def test_a_fresh_start_only_when_there_was_nothing_at_all(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "out"), store=None, policy=POLICY)
    elsewhere = CheckpointStore(str(tmp_path / "other"), store=None, policy=POLICY)
    gone = f"{elsewhere.root}/{_step(10)}"
    dest = tmp_path / "resume"

    assert fetch_first_usable(store, "latest", [], dest) == ResumePoint(None)
    missing = fetch_first_usable(store, "latest", [gone], dest)
    assert (missing.uri, [s.uri for s in missing.skipped]) == (None, [gone])
    # A leftover of a killed commit is no checkpoint: still nothing there.
    leftover = _commit(store, tmp_path, 5)
    (Path(leftover) / COMMIT_MARKER).unlink()
    assert fetch_first_usable(store, "latest", [], dest).uri is None

    # Something there that does not verify: never silently from scratch.
    corrupt = _commit(elsewhere, tmp_path, 20)
    flip_bytes(Path(corrupt) / WEIGHTS)
    with pytest.raises(NoUsableCheckpoint, match=rf"none of the 2 .*{_step(20)}.*sha256"):
        fetch_first_usable(store, "latest", [gone, corrupt], dest)
    # An explicit checkpoint that is not there is an error, as without fallbacks.
    with pytest.raises(NoUsableCheckpoint, match="no checkpoint stored there"):
        fetch_first_usable(store, gone, [], dest)
    assert not dest.exists()


# --- real training runs on the tiny model -------------------------------------------------------


@pytest.fixture(scope="module")
def trained(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, object], Path]:
    """A finished 4-step run with committed checkpoints at steps 2 and 4; copy before use."""
    root = tmp_path_factory.mktemp("trained")
    snapshot = tiny_snapshot(root / "snapshot", count=16)
    document = tiny_job(
        tiny_model_dir, snapshot, root / "out", hyperparameters={"epochs": 2, "max_steps": 4}
    )
    result = run_training(parse_config(document), work_dir=root / "work")
    assert result.steps == 4
    assert sorted(p.name for p in (root / "out" / "checkpoints").iterdir()) == [_step(2), _step(4)]
    return document, root / "out"


def _copy(trained: tuple[dict[str, object], Path], dest: Path) -> tuple[dict[str, object], Path]:
    document, out = trained
    shutil.copytree(out, dest)
    shutil.rmtree(dest / "final")
    return {**document, "output": {"prefix": str(dest)}}, dest / "checkpoints"


def _first_losses(checkpoint: Path) -> list[float]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["history"]]


def test_latest_resumes_from_the_older_checkpoint_when_the_newest_is_corrupt(
    trained: tuple[dict[str, object], Path], tmp_path: Path
) -> None:
    document, checkpoints = _copy(trained, tmp_path / "out")
    flip_bytes(checkpoints / _step(4) / WEIGHTS)
    before = _first_losses(checkpoints / _step(2))
    log = tmp_path / "trainer.log"
    with webhook_receiver() as receiver:
        job = write_job(tmp_path / "job.json", {**document, "webhook": webhook_section(receiver)})
        process = start_trainer(["run", "--config", str(job), "--resume-from", "latest"], log)
        assert process.wait(240) == EXIT_OK, log.read_text()[-3000:]

    (started,) = receiver.of_kind("started")
    assert started.resumed_from == str(checkpoints / _step(2))
    (skipped,) = started.resume_skipped
    assert skipped.uri == str(checkpoints / _step(4))
    assert "sha256" in skipped.error
    assert "adapter_model.safetensors" in skipped.error
    warning = next(line for line in log.read_text().splitlines() if "skipping checkpoint" in line)
    assert '"level":"WARNING"' in warning
    assert _step(4) in warning
    # Steps 3 and 4 again, after the older checkpoint's two.
    assert [r.step for r in receiver.of_kind("checkpoint_saved")] == [4]
    history = final_history(tmp_path / "out" / "final")
    assert len(history) == 4
    assert history[:2] == before


def test_a_corrupt_resume_from_falls_back_to_the_given_good_checkpoint(
    trained: tuple[dict[str, object], Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The scheduler's next attempt: its own (empty) prefix, the job's checkpoints from the last.
    _, previous = _copy(trained, tmp_path / "attempt-1")
    flip_bytes(previous / _step(4) / WEIGHTS)
    document = {
        **trained[0],
        "output": {"prefix": str(tmp_path / "attempt-2")},
        "resume_from": str(previous / _step(4)),
        "resume_fallbacks": [str(previous / _step(2))],
    }
    with caplog.at_level(logging.WARNING, logger="services.trainer.resume"):
        result = run_training(parse_config(document), work_dir=tmp_path / "work")

    assert result.resumed_from == str(previous / _step(2))
    assert [s.uri for s in result.resume_skipped] == [str(previous / _step(4))]
    assert any(_step(4) in r.getMessage() and "sha256" in r.getMessage() for r in caplog.records)
    assert result.steps == 4
    assert [e["loss"] for e in result.history[:2]] == _first_losses(previous / _step(2))


def test_when_no_checkpoint_verifies_the_run_fails_naming_each(
    trained: tuple[dict[str, object], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document, checkpoints = _copy(trained, tmp_path / "out")
    for step in (2, 4):
        flip_bytes(checkpoints / _step(step) / WEIGHTS)
    with webhook_receiver() as receiver:
        job = write_job(tmp_path / "job.json", {**document, "webhook": webhook_section(receiver)})
        work_dir = str(tmp_path / "work")
        code = main(
            ["run", "--config", str(job), "--resume-from", "latest", "--work-dir", work_dir]
        )

    assert code == EXIT_BAD_CONFIG
    (failed,) = receiver.of_kind("failed")
    assert failed.reason == "bad_config"
    assert "none of the 2 checkpoint(s) to resume from can be used" in failed.message
    assert _step(4) in failed.message
    assert _step(2) in failed.message
    assert failed.message in capsys.readouterr().err
    assert receiver.kinds() == ["failed"]  # nothing trained, nothing started
    assert not (tmp_path / "out" / "final").exists()


def test_a_fallback_needs_resume_from(
    trained: tuple[dict[str, object], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = write_job(tmp_path / "job.json", trained[0])
    assert main(["run", "--config", str(job), "--resume-fallback", "x"]) == EXIT_BAD_CONFIG
    assert "resume_fallbacks: tried only after resume_from" in capsys.readouterr().err
