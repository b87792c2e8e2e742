"""The training loop on the tiny model: reports, artifact, loss normalisation, methods."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from services.trainer.config import parse_config
from services.trainer.loop import run_training
from shared.settings import Settings
from shared.storage import ObjectStore
from tests.plugins.infra import settings_env
from tests.services.trainer.jobs import (
    tiny_job,
    tiny_snapshot,
    webhook_receiver,
    webhook_section,
)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_snapshot(tmp_path_factory.mktemp("snapshot"), count=24)


def _adapter(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "adapter_model.safetensors")


def test_run_reports_over_signed_webhooks_and_writes_the_artifact(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with webhook_receiver() as receiver:
        document = tiny_job(tiny_model_dir, snapshot, out, webhook=webhook_section(receiver))
        result = run_training(parse_config(document), work_dir=tmp_path / "work")

    assert result.status == "completed"
    assert receiver.refused == []  # every report was signed, fresh and not a replay
    kinds = receiver.kinds()
    assert kinds[0] == "started"
    assert kinds[-1] == "completed"
    assert [r.seq for r in receiver.reports] == sorted(r.seq for r in receiver.reports)
    started = receiver.of_kind("started")[0]
    assert (started.world_size, started.method, started.total_steps) == (1, "lora", result.steps)

    progress = receiver.of_kind("progress")
    assert progress[0].step == 1
    assert progress[-1].step == result.steps
    assert all(p.tokens_per_s and p.tokens_per_s > 0 for p in progress)
    assert all(p.grad_norm is not None and p.grad_norm > 0 for p in progress)
    assert progress[-1].eta_s == 0
    assert progress[-1].epoch == pytest.approx(1.0)

    saved = receiver.of_kind("checkpoint_saved")
    # Every 2 steps, and the last step whatever the cadence.
    assert [c.step for c in saved] == sorted({*range(2, result.steps + 1, 2), result.steps})
    assert all("loss" in c.metrics for c in saved)
    completed = receiver.of_kind("completed")[0]
    assert completed.artifact_uri == str(out / "final")
    assert completed.steps == result.steps
    assert completed.last_checkpoint_uri == saved[-1].uri

    # The final dir is a PEFT adapter with the curve recorded beside it.
    final = out / "final"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in final.iterdir()}
    state = json.loads((final / "trainer_state.json").read_text())
    assert [h["step"] for h in state["history"]] == list(range(1, result.steps + 1))
    # Retention kept the last two checkpoints (plus the best, which may be one of them).
    kept = sorted(p.name for p in (out / "checkpoints").iterdir() if not p.name.startswith("."))
    assert f"step-{result.steps:08d}" in kept
    assert len(kept) <= 3


def test_step_loss_and_update_do_not_depend_on_micro_batching(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    """One micro-batch of 4 rows vs 4 accumulated micro-batches of 1 row: the same step."""

    def run(name: str, micro: int, accumulate: int) -> tuple[list[dict[str, float]], Path]:
        document = tiny_job(
            tiny_model_dir,
            snapshot,
            tmp_path / name,
            lora={"dropout": 0.0},
            # fp32: compared to 1e-4; bf16 autocast (`auto` on CPUs with bf16 instructions)
            # rounds differently when the batch is split differently.
            hyperparameters={
                "micro_batch_size": micro,
                "gradient_accumulation_steps": accumulate,
                "precision": "fp32",
            },
            checkpoints={"every_n_steps": 1000},
        )
        result = run_training(parse_config(document), work_dir=tmp_path / f"work-{name}")
        return result.history, tmp_path / name / "final"

    one, one_dir = run("one", 4, 1)
    many, many_dir = run("many", 1, 4)
    assert len(one) == len(many) >= 3
    for a, b in zip(one, many, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["tokens"] == b["tokens"]
    assert one[-1]["loss"] != one[0]["loss"]  # it did train
    for name, tensor in _adapter(one_dir).items():
        torch.testing.assert_close(tensor, _adapter(many_dir)[name], atol=1e-5, rtol=1e-4)


def test_base_model_dataset_and_output_all_on_s3(
    tiny_model_dir: Path,
    snapshot: Path,
    tmp_path: Path,
    object_store: ObjectStore,
    stack_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in settings_env(stack_settings).items():
        monkeypatch.setenv(name, value)  # credentials come from the environment, never the config
    object_store.put_dir(tiny_model_dir, "models/tiny/")
    object_store.put_dir(snapshot, "datasets/snap-1/")
    base, prefix = object_store.uri("models/tiny"), object_store.uri("jobs/job-1")
    document = tiny_job(
        base,
        object_store.uri("datasets/snap-1"),
        prefix,
        hyperparameters={"max_steps": 2},
        output={"prefix": prefix, "merge_weights": True},
    )
    result = run_training(parse_config(document), work_dir=tmp_path / "work")

    assert result.artifact is not None
    assert result.artifact.uri == prefix + "/final"
    assert result.artifact.merged_uri == prefix + "/final-merged"
    assert result.last_checkpoint_uri == prefix + "/checkpoints/step-00000002"
    adapter = tmp_path / "adapter"
    object_store.get_dir(result.artifact.uri + "/", adapter)
    assert (
        json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == base
    )  # the location the job gave, not the trainer's download dir
    merged = tmp_path / "merged"
    object_store.get_dir(result.artifact.merged_uri + "/", merged)
    assert AutoModelForCausalLM.from_pretrained(merged, local_files_only=True) is not None


def test_full_finetune_writes_a_plain_model(
    tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    document = tiny_job(
        tiny_model_dir,
        snapshot,
        out,
        method="full",
        hyperparameters={"max_steps": 2, "learning_rate": 1e-3},
        checkpoints={"every_n_steps": 1},
    )
    result = run_training(parse_config(document), work_dir=tmp_path / "work")
    assert result.status == "completed"
    assert result.steps == 2
    trained = AutoModelForCausalLM.from_pretrained(out / "final", local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    moved = [
        name
        for name, param in trained.state_dict().items()
        if not torch.equal(param, base.state_dict()[name])
    ]
    assert moved  # every layer is trainable in a full fine-tune
    # A full-weights checkpoint is a model dir, not an adapter.
    checkpoint = out / "checkpoints" / "step-00000002" / "model"
    assert (checkpoint / "model.safetensors").is_file()
