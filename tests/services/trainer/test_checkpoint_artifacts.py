"""Every checkpoint is a complete, servable artifact naming its base by catalogue id; the last
step is always checkpointed and reported; jobs with evals keep every checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.trainer.artifacts import MODEL_INFO_FILE
from services.trainer.config import parse_config
from services.trainer.loop import RunResult, TrainingFailed, run_training
from services.trainer.rendering import serving_template
from shared import catalogue
from shared.reports import TrainerReport
from tests.services.trainer.jobs import tiny_job, tiny_snapshot, webhook_receiver, webhook_section

CATALOGUE_ID = catalogue.SMOLLM2_135M_INSTRUCT.id
EVERY = 3  # the cadence; the run's step count is not a multiple of it (checked below)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_snapshot(tmp_path_factory.mktemp("snapshot"), count=24)


@pytest.fixture
def data_dir(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data dir whose catalogue entry is prepared, holding the tiny model under its id."""
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_model_dir, catalogue.SMOLLM2_135M_INSTRUCT.local_dir(data_dir))
    monkeypatch.setenv("TUNELOOP_DATA_DIR", str(data_dir))
    return data_dir


def _run(
    snapshot: Path, out: Path, work: Path, **sections: object
) -> tuple[RunResult, list[TrainerReport]]:
    with webhook_receiver() as receiver:
        document = tiny_job(
            CATALOGUE_ID,
            snapshot,
            out,
            checkpoints={"every_n_steps": EVERY, "keep_last": 100, "keep_best": False},
            webhook=webhook_section(receiver),
            **sections,
        )
        result = run_training(parse_config(document), work_dir=work)
    return result, list(receiver.reports)


def test_checkpoints_are_complete_artifacts_kept_and_the_last_step_reported(
    data_dir: Path, snapshot: Path, tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    out = tmp_path / "out"
    result, reports = _run(snapshot, out, tmp_path / "work")
    steps = result.steps
    # peft never looked the catalogue id up on the Hub (it does to decide on saving embeddings).
    assert not [w for w in recwarn if CATALOGUE_ID in str(w.message)]
    assert steps % EVERY != 0, "pick a cadence the run's length is not a multiple of"

    # The cadence, plus the last step; keep_best off and keep_last >= the count: all stay.
    expected = [*range(EVERY, steps + 1, EVERY), steps]
    saved = [r for r in reports if r.kind == "checkpoint_saved"]
    assert [r.step for r in saved] == expected
    kept = sorted(p.name for p in (out / "checkpoints").iterdir() if not p.name.startswith("."))
    assert kept == [f"step-{step:08d}" for step in expected]
    completed = [r for r in reports if r.kind == "completed"]
    assert len(completed) == 1
    assert completed[0].last_checkpoint_uri == saved[-1].uri == result.last_checkpoint_uri
    assert completed[0].trained_tokens == sum(h["tokens"] for h in result.history) > 0

    tokenizer_files = {"tokenizer.json", "tokenizer_config.json"}
    for report in saved:
        model_dir = Path(report.uri) / "model"
        names = {p.name for p in model_dir.iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors", MODEL_INFO_FILE} <= names
        assert tokenizer_files <= names
        adapter_config = json.loads((model_dir / "adapter_config.json").read_text())
        assert adapter_config["base_model_name_or_path"] == CATALOGUE_ID  # not a work-dir path
        info = json.loads((model_dir / MODEL_INFO_FILE).read_text())
        assert info == {
            "format": 1,
            "artifact": "adapter",
            "base_model": CATALOGUE_ID,
            "base_model_kind": "catalogue",
            "method": "lora",
            "job_id": "job-1",
            "attempt_id": "attempt-1",
            "tenant": "acme",
            "step": report.step,
        }
    # The last checkpoint holds the final adapter.
    last = load_file(Path(saved[-1].uri) / "model" / "adapter_model.safetensors")
    final = load_file(out / "final" / "adapter_model.safetensors")
    assert last.keys() == final.keys()
    for name, tensor in final.items():
        torch.testing.assert_close(last[name], tensor)
    assert json.loads((out / "final" / MODEL_INFO_FILE).read_text())["step"] == steps


def test_a_checkpoint_merges_onto_its_catalogue_base_and_generates(
    data_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    """What the hoster does with a checkpoint: peft onto the base the id names, merge, save, and
    serve the merged dir with plain transformers."""
    out = tmp_path / "out"
    result, _ = _run(snapshot, out, tmp_path / "work", hyperparameters={"max_steps": EVERY})
    model_dir = Path(result.last_checkpoint_uri or "") / "model"
    info = json.loads((model_dir / MODEL_INFO_FILE).read_text())
    base_dir = catalogue.locate(info["base_model"], data_dir=data_dir)

    base = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    training_tokenizer = AutoTokenizer.from_pretrained(base_dir, local_files_only=True)
    assert tokenizer.chat_template == serving_template(training_tokenizer)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        base_logits = base(input_ids=ids).logits
    peft_model = PeftModel.from_pretrained(base, model_dir)  # the base dir given explicitly
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
    assert not torch.allclose(expected, base_logits, atol=1e-4)  # the adapter trained

    merged_dir = tmp_path / "merged"
    peft_model.merge_and_unload().save_pretrained(merged_dir)
    tokenizer.save_pretrained(merged_dir)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, local_files_only=True)
    merged_tokenizer = AutoTokenizer.from_pretrained(merged_dir, local_files_only=True)
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-4, rtol=1e-4)
    prompt = merged_tokenizer(text, return_tensors="pt")
    generated = merged.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 4


def test_a_full_finetune_checkpoint_is_a_servable_model_dir(
    data_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result, _ = _run(
        snapshot,
        out,
        tmp_path / "work",
        method="full",
        hyperparameters={"max_steps": 2, "learning_rate": 1e-3},
    )
    model_dir = Path(result.last_checkpoint_uri or "") / "model"
    info = json.loads((model_dir / MODEL_INFO_FILE).read_text())
    assert (info["artifact"], info["base_model"], info["step"]) == ("full", CATALOGUE_ID, 2)
    assert json.loads((model_dir / "config.json").read_text())["use_cache"] is True
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    prompt = tokenizer("Hello", return_tensors="pt")
    assert model.generate(**prompt, max_new_tokens=2, do_sample=False).shape[1] > 1


def test_a_catalogue_id_not_prepared_here_is_a_bad_config(
    snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNELOOP_DATA_DIR", str(tmp_path / "empty"))
    document = tiny_job(CATALOGUE_ID, snapshot, tmp_path / "out")
    with pytest.raises(TrainingFailed) as failed:
        run_training(parse_config(document), work_dir=tmp_path / "work")
    assert failed.value.reason == "bad_config"
    assert failed.value.message.startswith(f"base_model: {CATALOGUE_ID} is not prepared")
    assert "make model" in failed.value.message


def test_an_unknown_model_name_is_a_bad_config_naming_the_catalogue(
    snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no directory of that name here
    document = tiny_job("Llama-9-Nonexistent", snapshot, tmp_path / "out")
    with pytest.raises(TrainingFailed) as failed:
        run_training(parse_config(document), work_dir=tmp_path / "work")
    assert failed.value.reason == "bad_config"
    assert "base_model: 'Llama-9-Nonexistent' is neither a catalogue id" in failed.value.message
    assert CATALOGUE_ID in failed.value.message
