"""Resuming continues the same loss curve: after a stop request in-process, after a real SIGTERM,
and after a real kill -9 with the checkpoints on S3 (a partial checkpoint is never picked)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from services.trainer.__main__ import main
from services.trainer.checkpoints import CheckpointStore
from services.trainer.config import parse_config
from services.trainer.loop import TrainingFailed, run_training
from services.trainer.progress import StepMetrics
from shared.settings import Settings
from shared.storage import COMMIT_MARKER, ObjectStore
from tests.plugins.infra import settings_env
from tests.services.trainer.jobs import (
    final_history,
    isolated_logging,
    start_trainer,
    tiny_job,
    tiny_snapshot,
    webhook_receiver,
    webhook_section,
    write_job,
)

TOLERANCE = 1e-4

pytestmark = pytest.mark.usefixtures(isolated_logging.__name__)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_snapshot(tmp_path_factory.mktemp("snapshot"), count=24)


def _losses(history: list[dict[str, float]]) -> list[float]:
    return [entry["loss"] for entry in history]


def _assert_same_curve(got: list[float], expected: list[float]) -> None:
    assert len(got) == len(expected)
    for step, (a, b) in enumerate(zip(got, expected, strict=True), start=1):
        assert abs(a - b) <= TOLERANCE, f"step {step}: {a} vs uninterrupted {b}"


def test_resumed_run_continues_the_same_loss_curve(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    # Dropout > 0: the curve only continues if the RNG state is restored too. Two epochs: the
    # stop falls in the second, so the data position carries the epoch's shuffle.
    def config(name: str, **extra: object) -> object:
        document = tiny_job(
            tiny_model_dir,
            snapshot,
            tmp_path / name,
            hyperparameters={"epochs": 2},
            checkpoints={"every_n_steps": 100},
        )
        return parse_config({**document, **extra})

    uninterrupted = run_training(config("full"), work_dir=tmp_path / "w1")
    total = uninterrupted.steps
    stop_at = total // 2 + 1

    stop = threading.Event()

    def request_stop(metrics: StepMetrics) -> None:
        if metrics.step == stop_at:
            stop.set()  # what the SIGTERM handler does

    first = run_training(
        config("resumed"), work_dir=tmp_path / "w2", stop=stop, on_step=request_stop
    )
    assert (first.status, first.steps) == ("stopped", stop_at)
    assert first.artifact is None
    second = run_training(config("resumed", resume_from="latest"), work_dir=tmp_path / "w3")
    assert second.resumed_from == str(tmp_path / "resumed" / "checkpoints" / f"step-{stop_at:08d}")
    assert second.steps == total

    _assert_same_curve(_losses(second.history), _losses(uninterrupted.history))
    assert _losses(second.history)[-1] < _losses(second.history)[0]
    got = load_file(tmp_path / "resumed" / "final" / "adapter_model.safetensors")
    expected = load_file(tmp_path / "full" / "final" / "adapter_model.safetensors")
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=1e-5, rtol=1e-4)


def test_resume_refuses_a_checkpoint_of_another_config(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    document = tiny_job(
        tiny_model_dir, snapshot, tmp_path / "out", hyperparameters={"max_steps": 2}
    )
    run_training(parse_config(document), work_dir=tmp_path / "w1")
    changed = tiny_job(
        tiny_model_dir,
        snapshot,
        tmp_path / "out",
        hyperparameters={"max_steps": 3, "weight_decay": 0.1},
    )
    with pytest.raises(TrainingFailed) as failed:
        run_training(parse_config({**changed, "resume_from": "latest"}), work_dir=tmp_path / "w2")
    assert failed.value.reason == "bad_config"
    assert "resume_from" in failed.value.message
    assert "fingerprint" in failed.value.message

    # max_steps is not part of the fingerprint: extending a finished run is allowed.
    extended = tiny_job(
        tiny_model_dir, snapshot, tmp_path / "out", hyperparameters={"max_steps": 3}
    )
    result = run_training(
        parse_config({**extended, "resume_from": "latest"}), work_dir=tmp_path / "w3"
    )
    assert result.steps == 3
    assert len(result.history) == 3


def test_a_run_resumed_with_a_lower_learning_rate_keeps_its_schedule_at_the_new_peak(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    # How a run that diverged goes on (the scheduler halves the rate after a NaN loss).
    def config(name: str, rate: float, max_steps: int, **extra: object) -> object:
        hyperparameters = {"max_steps": max_steps, "learning_rate": rate, "warmup_steps": 0}
        document = tiny_job(
            tiny_model_dir, snapshot, tmp_path / name, hyperparameters=hyperparameters
        )
        return parse_config({**document, **extra})

    whole = run_training(config("whole", 2e-3, 6), work_dir=tmp_path / "w1")  # 4 steps: one epoch
    stop = threading.Event()

    def stop_at_3(metrics: StepMetrics) -> None:
        if metrics.step == 3:
            stop.set()

    first = run_training(
        config("halved", 2e-3, 6), work_dir=tmp_path / "w2", stop=stop, on_step=stop_at_3
    )
    assert first.steps == 3
    halved = run_training(config("halved", 1e-3, 6, resume_from="latest"), work_dir=tmp_path / "w3")
    rates = [entry["learning_rate"] for entry in whole.history]
    resumed = [entry["learning_rate"] for entry in halved.history]
    assert resumed[:3] == pytest.approx(rates[:3])  # the first attempt's, from its checkpoint
    assert resumed[3:] == pytest.approx([rate / 2 for rate in rates[3:]])  # same place, half


def _wait_for(
    predicate: object, process: subprocess.Popen[bytes], log: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        if process.poll() is not None:
            pytest.fail(f"trainer exited early ({process.returncode}):\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"timed out waiting for the trainer:\n{log.read_text()[-3000:]}")


def test_sigterm_finishes_the_step_checkpoints_and_exits_zero(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with webhook_receiver() as receiver:
        document = tiny_job(
            tiny_model_dir,
            snapshot,
            out,
            hyperparameters={"epochs": 50},  # far more than it gets to run
            checkpoints={"every_n_steps": 1000, "sigterm_grace_s": 60},
            webhook=webhook_section(receiver),
        )
        job = write_job(tmp_path / "job.json", document)
        log = tmp_path / "trainer.log"
        process = start_trainer(["run", "--config", str(job)], log)
        _wait_for(lambda: receiver.of_kind("progress"), process, log, 120)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()[-3000:]
    saved = receiver.of_kind("checkpoint_saved")
    assert len(saved) == 1
    assert receiver.kinds()[-1] == "checkpoint_saved"  # no completed: it stopped

    checkpoints = CheckpointStore(str(out), store=None, policy=parse_config(document).checkpoints)
    latest = checkpoints.latest()
    assert latest is not None
    assert not (out / "final").exists()
    state = json.loads((Path(latest) / "trainer_state.json").read_text())
    stopped_at = state["step"]
    assert 1 <= stopped_at < 50
    assert len(state["history"]) == stopped_at
    assert saved[0].step == stopped_at
    assert saved[0].uri == latest

    # The CLI resumes it, and max_steps may end the run early: the curve picks up at the next step.
    code = main(
        [
            "run",
            "--config",
            str(job),
            "--resume-from",
            "latest",
            "--set",
            f"hyperparameters.max_steps={stopped_at + 1}",
            "--set",
            "webhook=null",  # the receiver above is gone
            "--work-dir",
            str(tmp_path / "work"),
        ]
    )
    assert code == 0
    history = final_history(out / "final")
    assert len(history) == stopped_at + 1
    assert history[:stopped_at] == [entry["loss"] for entry in state["history"]]


def _plant_partial_checkpoint(store: ObjectStore, committed: str, step: int) -> str:
    """What a kill in the middle of put_dir leaves: files and manifest, but no commit marker."""
    partial = committed.rsplit("/", 1)[0] + f"/step-{step:08d}/"
    for key in store.list_keys(committed + "/"):
        name = key.split("/")[-1]
        if name != COMMIT_MARKER:
            relative = key[len(committed.split("/", 3)[3]) + 1 :]
            store.put_bytes(partial + relative, store.get_bytes(f"s3://{store.bucket}/{key}"))
    return partial


def test_kill_9_then_resume_latest_never_picks_a_partial_checkpoint(
    tiny_model_dir: Path,
    snapshot: Path,
    tmp_path: Path,
    object_store: ObjectStore,
    stack_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = settings_env(stack_settings) | {"TUNELOOP_S3_BUCKET": object_store.bucket}
    prefix = object_store.uri("jobs/job-1")
    document = tiny_job(
        tiny_model_dir,
        snapshot,
        prefix,
        hyperparameters={"epochs": 8},  # long enough to be killed mid-run
        checkpoints={"every_n_steps": 1, "keep_last": 3},
    )
    reference = run_training(
        parse_config(
            {
                **document,
                "output": {"prefix": str(tmp_path / "reference")},
                "checkpoints": {"every_n_steps": 1000},  # the cadence does not change the curve
            }
        ),
        work_dir=tmp_path / "w-ref",
    )
    job = write_job(tmp_path / "job.json", document)
    log = tmp_path / "trainer.log"
    checkpoints = CheckpointStore(
        prefix, store=object_store, policy=parse_config(document).checkpoints
    )

    process = start_trainer(["run", "--config", str(job)], log, env)
    _wait_for(lambda: len(checkpoints.committed()) >= 2, process, log, 120)
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait(30) == -signal.SIGKILL  # killed mid-run, not finished
    newest = checkpoints.latest()
    assert newest is not None
    partial = _plant_partial_checkpoint(object_store, newest, step=10_000)
    assert checkpoints.latest() == newest  # the marker-less one is invisible

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(
        [
            "run",
            "--config",
            str(job),
            "--resume-from",
            "latest",
            "--set",
            "checkpoints.every_n_steps=1000",
            "--work-dir",
            str(tmp_path / "work"),
        ]
    )
    assert code == 0
    final = tmp_path / "final"
    object_store.get_dir(prefix + "/final/", final)
    state = json.loads((final / "trainer_state.json").read_text())
    assert state["resumed_from"] == newest
    _assert_same_curve(final_history(final), _losses(reference.history))
    assert not object_store.is_committed(partial)
