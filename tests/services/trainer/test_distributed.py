"""The same entry point under torchrun: 2 CPU processes (gloo, DDP) match one process that
takes the same global batch, step for step and in the final weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from services.trainer.config import parse_config
from services.trainer.loop import run_training
from tests.services.trainer.jobs import (
    REPO_ROOT,
    child_env,
    tiny_job,
    tiny_snapshot,
    webhook_receiver,
    webhook_section,
    write_job,
)

TOLERANCE = 1e-4


def test_two_gloo_processes_match_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    snapshot = tiny_snapshot(tmp_path / "snapshot", count=24)
    # One process: 2 micro-batches of 2 rows per step. Two processes: 1 micro-batch of 2 rows
    # each. Both take 4 rows per optimizer step. No dropout: each rank has its own RNG stream.
    single_doc = tiny_job(
        tiny_model_dir,
        snapshot,
        tmp_path / "single",
        lora={"dropout": 0.0},
        hyperparameters={"micro_batch_size": 2, "gradient_accumulation_steps": 2},
        checkpoints={"every_n_steps": 2},
    )
    single = run_training(parse_config(single_doc), work_dir=tmp_path / "w-single")

    with webhook_receiver() as receiver:
        dist_doc = tiny_job(
            tiny_model_dir,
            snapshot,
            tmp_path / "dist",
            lora={"dropout": 0.0},
            hyperparameters={"micro_batch_size": 2, "gradient_accumulation_steps": 1},
            checkpoints={"every_n_steps": 2},
            webhook=webhook_section(receiver),
        )
        job = write_job(tmp_path / "job.json", dist_doc)
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "services.trainer",
            "run",
            "--config",
            str(job),
            "--work-dir",
            str(tmp_path / "w-dist"),
        ]
        done = subprocess.run(
            command, cwd=REPO_ROOT, env=child_env(), capture_output=True, timeout=240, check=False
        )
        output = (done.stdout + done.stderr).decode(errors="replace")
        assert done.returncode == 0, output[-4000:]

    # Rank 0 alone reports and writes checkpoints; it knows it is one of two.
    started = receiver.of_kind("started")
    assert len(started) == 1
    assert started[0].world_size == 2
    assert len(receiver.of_kind("completed")) == 1
    saved_steps = [c.step for c in receiver.of_kind("checkpoint_saved")]
    assert saved_steps == list(range(2, single.steps + 1, 2))
    assert not (tmp_path / "w-dist" / "rank-1" / "checkpoint").exists()

    state = json.loads((tmp_path / "dist" / "final" / "trainer_state.json").read_text())
    assert len(state["history"]) == single.steps >= 3
    for one, two in zip(single.history, state["history"], strict=True):
        assert one["tokens"] == two["tokens"]  # the same rows, split over two ranks
        assert one["loss"] == pytest.approx(two["loss"], abs=TOLERANCE)
        assert one["grad_norm"] == pytest.approx(two["grad_norm"], abs=TOLERANCE)
    assert single.history[-1]["loss"] != single.history[0]["loss"]

    expected = load_file(tmp_path / "single" / "final" / "adapter_model.safetensors")
    got = load_file(tmp_path / "dist" / "final" / "adapter_model.safetensors")
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=TOLERANCE, rtol=1e-3)
