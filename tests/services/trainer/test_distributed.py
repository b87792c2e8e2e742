"""The same entry point under torchrun and `accelerate launch`: 2 CPU processes (gloo) match one
process that takes the same global batch, step for step and in the final weights, with DDP and
with FSDP2; checkpoints written under one strategy resume under another."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from services.trainer.config import ConfigError, parse_config
from services.trainer.distributed import transformer_blocks
from services.trainer.loop import RunResult, TrainingFailed, run_training
from services.trainer.model_setup import build_model, lora_config
from tests.services.trainer.jobs import (
    REPO_ROOT,
    child_env,
    flip_bytes,
    tiny_job,
    tiny_snapshot,
    webhook_receiver,
    webhook_section,
    write_job,
)

TOLERANCE = 1e-4
# One process: 2 micro-batches of 2 rows per step. Two processes take the same 4 rows per step.
# No dropout: each rank draws from its own RNG stream.
# fp32 throughout: the runs are compared to 1e-4, and `auto` trains under bf16 autocast on a CPU
# with bf16 instructions, whose rounding depends on how the batch is split.
SINGLE = {"micro_batch_size": 2, "gradient_accumulation_steps": 2, "precision": "fp32"}
# 1 row per micro-batch, 2 micro-batches per rank: the first is accumulated without a gradient
# reduction (DDP's no_sync, FSDP2's set_requires_gradient_sync(False)).
TWO_RANKS = {"micro_batch_size": 1, "gradient_accumulation_steps": 2}
FSDP_LORA: dict[str, Any] = {
    "parallelism": "fsdp",
    "hyperparameters": TWO_RANKS,
    "output": {"merge_weights": True},
}


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_snapshot(tmp_path_factory.mktemp("snapshot"), count=24)


def _job(model_dir: Path, snapshot: Path, prefix: Path, **sections: Any) -> dict[str, Any]:
    hyperparameters = {**SINGLE, **sections.pop("hyperparameters", {})}
    checkpoints = {"every_n_steps": 2, "keep_last": 10, **sections.pop("checkpoints", {})}
    return tiny_job(
        model_dir,
        snapshot,
        prefix,
        lora={"dropout": 0.0},
        hyperparameters=hyperparameters,
        checkpoints=checkpoints,
        **sections,
    )


@pytest.fixture(scope="module")
def single_lora(
    tiny_model_dir: Path, snapshot: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[RunResult, Path]:
    """The one-process LoRA run every distributed LoRA run must match; its output dir."""
    root = tmp_path_factory.mktemp("single-lora")
    document = _job(tiny_model_dir, snapshot, root / "out", output={"merge_weights": True})
    result = run_training(parse_config(document), work_dir=root / "work")
    assert result.steps >= 4  # so a checkpoint at step 2 leaves steps to resume
    return result, root / "out"


@pytest.fixture(scope="module")
def fsdp_lora(
    tiny_model_dir: Path, snapshot: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], Path]:
    """Two FSDP2 ranks under torchrun; the job document and the output dir."""
    root = tmp_path_factory.mktemp("fsdp-lora")
    document = _job(tiny_model_dir, snapshot, root / "out", **FSDP_LORA)
    _launch("torchrun", write_job(root / "job.json", document), root / "work")
    return document, root / "out"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(launcher: str, job: Path, work_dir: Path, *, exit_code: int = 0) -> str:
    """`python -m services.trainer run` in 2 processes, by torchrun or `accelerate launch`."""
    if launcher == "torchrun":
        prefix = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    else:
        # `--cpu` would take accelerate's single-process launcher; `--multi_gpu` runs torchrun's
        # agent, which on a machine without GPUs starts CPU processes (the trainer picks gloo).
        prefix = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
        prefix += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        prefix += ["--main_process_port", str(_free_port())]
    command = [sys.executable, *prefix, "-m", "services.trainer", "run", "--config", str(job)]
    # A session of its own: on a timeout the launcher AND its ranks go, none is left behind.
    launched = subprocess.Popen(
        [*command, "--work-dir", str(work_dir)],
        cwd=REPO_ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        stdout, _ = launched.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(launched.pid, signal.SIGKILL)
        stdout, _ = launched.communicate()
        pytest.fail(
            f"{launcher} did not finish in 240 s:\n{stdout.decode(errors='replace')[-4000:]}"
        )
    output = stdout.decode(errors="replace")
    assert launched.returncode == exit_code, output[-4000:]
    if exit_code:
        return output
    # Each rank logs how it wraps the model: proof the sharded path ran (or did not).
    sharded = output.count("model sharded with FSDP2: 2 blocks + root over 2 ranks")
    assert sharded == (2 if json.loads(job.read_text()).get("parallelism") == "fsdp" else 0)
    return output


def _history(output: Path) -> list[dict[str, Any]]:
    state = json.loads((output / "final" / "trainer_state.json").read_text())
    history: list[dict[str, Any]] = state["history"]
    return history


def _assert_same_steps(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert len(got) == len(expected)
    for one, two in zip(expected, got, strict=True):
        assert one["tokens"] == two["tokens"]  # the same rows, split over two ranks
        assert one["loss"] == pytest.approx(two["loss"], abs=TOLERANCE), one["step"]
        assert one["grad_norm"] == pytest.approx(two["grad_norm"], abs=TOLERANCE), one["step"]


def _assert_same_tensors(got_file: Path, expected_file: Path) -> None:
    expected, got = load_file(expected_file), load_file(got_file)
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=TOLERANCE, rtol=1e-3, msg=name)


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def _assert_same_optimizer(got_file: Path, expected_file: Path) -> None:
    expected = torch.load(expected_file, weights_only=True)
    got = torch.load(got_file, weights_only=True)
    assert got["param_groups"] == expected["param_groups"]
    assert got["state"].keys() == expected["state"].keys()
    for index, values in expected["state"].items():
        assert got["state"][index].keys() == values.keys()
        for name, tensor in values.items():
            torch.testing.assert_close(
                got["state"][index][name], tensor, atol=TOLERANCE, rtol=1e-3, msg=name
            )


def test_two_gloo_processes_match_one_process(
    tiny_model_dir: Path, snapshot: Path, single_lora: tuple[RunResult, Path], tmp_path: Path
) -> None:
    single, single_out = single_lora
    with webhook_receiver() as receiver:
        dist_doc = _job(
            tiny_model_dir,
            snapshot,
            tmp_path / "dist",
            hyperparameters={"micro_batch_size": 2, "gradient_accumulation_steps": 1},
            checkpoints={"keep_last": 2},
            webhook=webhook_section(receiver),
        )
        _launch("torchrun", write_job(tmp_path / "job.json", dist_doc), tmp_path / "w-dist")

    # Rank 0 alone reports and writes checkpoints; it knows it is one of two.
    started = receiver.of_kind("started")
    assert len(started) == 1
    assert started[0].world_size == 2
    assert len(receiver.of_kind("completed")) == 1
    saved_steps = [c.step for c in receiver.of_kind("checkpoint_saved")]
    assert saved_steps == sorted({*range(2, single.steps + 1, 2), single.steps})
    assert not (tmp_path / "w-dist" / "rank-1" / "checkpoint").exists()

    _assert_same_steps(_history(tmp_path / "dist"), single.history)
    assert single.history[-1]["loss"] != single.history[0]["loss"]
    adapter = "final/adapter_model.safetensors"
    _assert_same_tensors(tmp_path / "dist" / adapter, single_out / adapter)


def test_fsdp_lora_matches_one_process(
    single_lora: tuple[RunResult, Path], fsdp_lora: tuple[dict[str, Any], Path]
) -> None:
    (single, single_out), (_, fsdp_out) = single_lora, fsdp_lora
    _assert_same_steps(_history(fsdp_out), single.history)
    # The artifact is the one an unsharded run writes: adapter, and merged from it.
    for name in ["final/adapter_model.safetensors", "final-merged/model.safetensors"]:
        _assert_same_tensors(fsdp_out / name, single_out / name)
    # Checkpoints too: the same files, the adapter alone, the optimizer state by parameter index.
    step2 = Path("checkpoints") / "step-00000002"
    assert _files(fsdp_out / step2) == _files(single_out / step2)
    _assert_same_tensors(
        fsdp_out / step2 / "model" / "adapter_model.safetensors",
        single_out / step2 / "model" / "adapter_model.safetensors",
    )
    _assert_same_optimizer(fsdp_out / step2 / "optimizer.pt", single_out / step2 / "optimizer.pt")


def test_ddp_resumes_an_fsdp_checkpoint_on_the_same_curve(
    single_lora: tuple[RunResult, Path], fsdp_lora: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    (single, single_out), (fsdp_doc, fsdp_out) = single_lora, fsdp_lora
    step2 = fsdp_out / "checkpoints" / "step-00000002"
    document = {
        **fsdp_doc,
        "parallelism": "ddp",
        "resume_from": str(step2),
        "output": {"prefix": str(tmp_path / "ddp")},
    }
    _launch("torchrun", write_job(tmp_path / "job.json", document), tmp_path / "work")

    state = json.loads((tmp_path / "ddp" / "final" / "trainer_state.json").read_text())
    assert state["resumed_from"] == str(step2)
    _assert_same_steps(state["history"], single.history)
    adapter = "final/adapter_model.safetensors"
    _assert_same_tensors(tmp_path / "ddp" / adapter, single_out / adapter)


def test_two_ranks_resume_together_from_the_newest_checkpoint_rank_0_verified(
    single_lora: tuple[RunResult, Path], fsdp_lora: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    (single, _), (fsdp_doc, fsdp_out) = single_lora, fsdp_lora
    checkpoints = tmp_path / "ddp" / "checkpoints"
    shutil.copytree(fsdp_out / "checkpoints", checkpoints)
    newer = sorted(p for p in checkpoints.iterdir() if p.name > "step-00000002")
    assert newer  # what `latest` tries, and skips, first
    for checkpoint in newer:
        flip_bytes(checkpoint / "model" / "adapter_model.safetensors")
    document = {**fsdp_doc, "parallelism": "ddp", "resume_from": "latest"}
    document["output"] = {"prefix": str(tmp_path / "ddp")}
    output = _launch("torchrun", write_job(tmp_path / "job.json", document), tmp_path / "work")

    state = json.loads((tmp_path / "ddp" / "final" / "trainer_state.json").read_text())
    assert state["resumed_from"] == str(checkpoints / "step-00000002")
    assert all(f"skipping checkpoint {checkpoint}" in output for checkpoint in newer)
    _assert_same_steps(state["history"], single.history)

    # None verifies: rank 0's error reaches the other rank, and both fail, none left waiting.
    for checkpoint in checkpoints.iterdir():
        flip_bytes(checkpoint / "model" / "adapter_model.safetensors")
    output = _launch("torchrun", tmp_path / "job.json", tmp_path / "work-2", exit_code=1)
    assert output.count("error (bad_config): resume_from: none of the") == 2, output[-4000:]


def test_a_checkpoint_of_two_ranks_is_refused_by_one_naming_the_process_count(
    fsdp_lora: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    # Its data position counts steps of the two-rank global batch: one process would go on
    # with other rows, silently off the curve.
    fsdp_doc, fsdp_out = fsdp_lora
    document = {
        **fsdp_doc,
        "resume_from": str(fsdp_out / "checkpoints" / "step-00000002"),
        "output": {"prefix": str(tmp_path / "one")},
    }
    with pytest.raises(
        TrainingFailed, match=r"written by 2 process\(es\), this run has 1"
    ) as caught:
        run_training(parse_config(document), work_dir=tmp_path / "work")
    assert caught.value.reason == "bad_config"


def test_fsdp_full_fine_tune_under_accelerate_matches_one_process_and_resumes(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    def job(name: str, **sections: Any) -> dict[str, Any]:
        hyperparameters = {"learning_rate": 1e-3, "max_steps": 4, **sections.pop("hp", {})}
        return _job(
            tiny_model_dir,
            snapshot,
            tmp_path / name,
            method="full",
            hyperparameters=hyperparameters,
            **sections,
        )

    single = run_training(parse_config(job("single")), work_dir=tmp_path / "w-single")
    fsdp_doc = job("fsdp", parallelism="fsdp", hp=TWO_RANKS)
    _launch("accelerate", write_job(tmp_path / "fsdp.json", fsdp_doc), tmp_path / "w-fsdp")

    _assert_same_steps(_history(tmp_path / "fsdp"), single.history)
    # Whole weights, by the same names (the lm_head tied to the embedding stored once, as
    # save_pretrained does), in its checkpoints and its final model.
    step2, step4 = Path("checkpoints/step-00000002"), Path("checkpoints/step-00000004")
    for name in [step2 / "model/model.safetensors", Path("final/model.safetensors")]:
        _assert_same_tensors(tmp_path / "fsdp" / name, tmp_path / "single" / name)
    _assert_same_optimizer(
        tmp_path / "fsdp" / step2 / "optimizer.pt", tmp_path / "single" / step2 / "optimizer.pt"
    )

    # FSDP2 resumes its own step-2 checkpoint: whole weights loaded before sharding, then the
    # whole optimizer state sharded on load; steps 3 and 4 come out as before.
    resumed_doc = job(
        "resumed", parallelism="fsdp", hp=TWO_RANKS, resume_from=str(tmp_path / "fsdp" / step2)
    )
    _launch("torchrun", write_job(tmp_path / "resumed.json", resumed_doc), tmp_path / "w-res")
    _assert_same_steps(_history(tmp_path / "resumed"), single.history)
    for name in [step4 / "model/model.safetensors", Path("final/model.safetensors")]:
        _assert_same_tensors(tmp_path / "resumed" / name, tmp_path / "single" / name)


def test_fsdp_shards_each_transformer_block_found_generically(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    layers = list(model.model.layers)
    assert transformer_blocks(model) == layers  # by _no_split_modules
    config = parse_config(_job(tiny_model_dir, tiny_model_dir, tiny_model_dir))
    peft_model = get_peft_model(model, lora_config(config))
    assert transformer_blocks(peft_model) == layers  # looked through to the base model
    model._no_split_modules = None
    assert transformer_blocks(model) == layers  # by model.model.layers
    with pytest.raises(ValueError, match="parallelism=fsdp"):
        transformer_blocks(torch.nn.Linear(2, 2))


def test_fsdp_with_qlora_is_refused_naming_the_field(tiny_model_dir: Path) -> None:
    document = _job(tiny_model_dir, tiny_model_dir, tiny_model_dir, parallelism="fsdp")
    config = parse_config({**document, "method": "qlora"})
    with pytest.raises(ConfigError, match="parallelism: fsdp"):
        build_model(config, tiny_model_dir, torch.device("cpu"))
