"""`python -m services.trainer run`: exit codes, failures named and reported (in-process main)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from services.trainer.__main__ import (
    EXIT_BAD_CONFIG,
    EXIT_BAD_DATASET,
    EXIT_NAN_LOSS,
    EXIT_OK,
    main,
)
from tests.services.trainer.jobs import (
    isolated_logging,
    start_trainer,
    tiny_job,
    tiny_snapshot,
    webhook_receiver,
    webhook_section,
    write_job,
)

pytestmark = pytest.mark.usefixtures(isolated_logging.__name__)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_snapshot(tmp_path_factory.mktemp("snapshot"), count=12)


def _run(job: Path, *extra: str) -> int:
    return main(["run", "--config", str(job), "--progress", "off", *extra])


def test_overrides_and_merged_artifact(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    job = write_job(tmp_path / "job.json", tiny_job(tiny_model_dir, snapshot, tmp_path / "out"))
    code = _run(
        job,
        "--set",
        "hyperparameters.max_steps=2",
        "--set",
        "output.merge_weights=true",
        "--work-dir",
        str(tmp_path / "work"),
    )
    assert code == EXIT_OK
    assert (tmp_path / "out" / "final" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "out" / "final-merged" / "model.safetensors").is_file()
    assert (tmp_path / "out" / "final-merged" / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("hyperparameters.learning_rate=-1", "hyperparameters.learning_rate"),
        ("method=dpo", "method"),
        ("lora.rank=zero", "lora.rank"),
        ("hyperparameters", "--set"),
        ("runtime.torch_threads=0", "runtime.torch_threads"),
    ],
)
def test_bad_config_exits_2_naming_the_field(
    tiny_model_dir: Path,
    snapshot: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    override: str,
    field: str,
) -> None:
    job = write_job(tmp_path / "job.json", tiny_job(tiny_model_dir, snapshot, tmp_path / "out"))
    assert _run(job, "--set", override) == EXIT_BAD_CONFIG
    assert field in capsys.readouterr().err


def test_missing_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(tmp_path / "nope.json") == EXIT_BAD_CONFIG
    assert "--config" in capsys.readouterr().err


def test_qlora_without_a_gpu_is_a_reported_bad_config(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with webhook_receiver() as receiver:
        document = tiny_job(
            tiny_model_dir, snapshot, tmp_path / "out", webhook=webhook_section(receiver)
        )
        code = _run(write_job(tmp_path / "job.json", document), "--set", "method=qlora")
    assert code == EXIT_BAD_CONFIG
    assert "method: qlora needs a CUDA GPU" in capsys.readouterr().err
    failed = receiver.of_kind("failed")
    assert [f.reason for f in failed] == ["bad_config"]
    assert "qlora" in failed[0].message


def test_unreadable_dataset_exits_3(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "train.jsonl").write_text('{"tenant": "acme"}\nnot json\n')
    job = write_job(tmp_path / "job.json", tiny_job(tiny_model_dir, snapshot, tmp_path / "out"))
    assert _run(job) == EXIT_BAD_DATASET
    err = capsys.readouterr().err
    assert "train.jsonl:1" in err
    assert "train.jsonl:2" in err


def test_nan_loss_stops_and_reports_the_last_good_checkpoint(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with webhook_receiver() as receiver:
        document = tiny_job(
            tiny_model_dir,
            snapshot,
            out,
            checkpoints={"every_n_steps": 1},
            webhook=webhook_section(receiver),
        )
        code = _run(
            write_job(tmp_path / "job.json", document),
            "--set",
            "hyperparameters.learning_rate=1e30",  # the first update blows the weights up
            "--set",
            "hyperparameters.warmup_steps=0",
        )
    assert code == EXIT_NAN_LOSS
    failed = receiver.of_kind("failed")
    assert [f.reason for f in failed] == ["nan_loss"]
    saved = receiver.of_kind("checkpoint_saved")
    assert saved  # the steps before the blow-up were finite and checkpointed
    assert failed[0].last_checkpoint_uri == saved[-1].uri
    assert f"step {saved[-1].step + 1}" in failed[0].message
    assert not (out / "final").exists()


def test_torch_threads_reach_torch_in_the_cli_process(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    """The child runs with OMP_NUM_THREADS=1, which torch's default follows; the job's
    runtime.torch_threads overrides it (intra- and inter-op) for the whole run."""
    document = tiny_job(
        tiny_model_dir,
        snapshot,
        tmp_path / "out",
        hyperparameters={"max_steps": 1},
        runtime={"torch_threads": 2},
    )
    log = tmp_path / "trainer.log"
    process = start_trainer(
        ["run", "--config", str(write_job(tmp_path / "job.json", document))], log
    )
    try:
        assert process.wait(240) == EXIT_OK, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    threads = [
        (line["torch_threads"], line["torch_interop_threads"])
        for line in lines
        if "torch_threads" in line
    ]
    assert threads == [(2, 2)]
