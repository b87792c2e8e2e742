"""The final artifact loads in plain transformers / peft with no export step, locally and from S3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from services.trainer.artifacts import MODEL_INFO_FILE, STATE_FILE, ModelInfo, write_final
from services.trainer.config import parse_config
from services.trainer.model_setup import build_model
from shared.storage import ObjectStore

BASE_LOCATION = "s3://models/tiny-llama"  # what the job said; recorded in the adapter config


def _info(base_model: str, step: int = 7) -> ModelInfo:
    return ModelInfo(
        base_model=base_model, method="lora", job_id="j", attempt_id="a1", tenant="acme", step=step
    )


def _trained_lora(base_dir: Path, method: str = "lora") -> torch.nn.Module:
    config = parse_config(
        {
            "job_id": "j",
            "tenant": "acme",
            "base_model": str(base_dir),
            "dataset": "unused",
            "method": method,
            "lora": {"rank": 4, "alpha": 8, "dropout": 0.0},
            "output": {"prefix": "unused"},
        }
    )
    model = build_model(config, base_dir, torch.device("cpu"))
    # LoRA starts as a no-op (B = 0): move every trainable weight so the adapter matters.
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    return model


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def _prompt(tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    return torch.tensor([tokenizer(text)["input_ids"]])


def test_lora_artifact_and_merged_weights_load_and_generate(
    tiny_model_dir: Path, tiny_tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    model = _trained_lora(tiny_model_dir)
    ids = _prompt(tiny_tokenizer)
    expected = _logits(model, ids)
    out = tmp_path / "out"
    artifacts = write_final(
        model,
        tiny_tokenizer,
        info=_info(BASE_LOCATION),
        base_dir=tiny_model_dir,
        output_prefix=str(out),
        merge=True,
        quantized=False,
        state={"step": 7, "losses": [1.0, 0.5]},
        work_dir=tmp_path / "work",
        store=None,
    )
    adapter_dir, merged_dir = Path(artifacts.uri), Path(artifacts.merged_uri or "")
    assert adapter_dir == out / "final"
    assert merged_dir == out / "final-merged"
    assert {"adapter_config.json", "adapter_model.safetensors", STATE_FILE} <= {
        p.name for p in adapter_dir.iterdir()
    }
    adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == BASE_LOCATION
    assert json.loads((adapter_dir / STATE_FILE).read_text())["step"] == 7
    info = json.loads((adapter_dir / MODEL_INFO_FILE).read_text())
    assert (info["artifact"], info["base_model"], info["base_model_kind"]) == (
        "adapter",
        BASE_LOCATION,
        "s3",
    )
    assert json.loads((merged_dir / MODEL_INFO_FILE).read_text())["artifact"] == "merged"

    # Plain peft on a plain transformers base: same outputs as the trained model.
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    reloaded = PeftModel.from_pretrained(base, adapter_dir)
    torch.testing.assert_close(_logits(reloaded, ids), expected, atol=1e-4, rtol=1e-4)

    # The merged dir is a complete model: no peft, tokenizer included.
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(merged_dir, local_files_only=True)
    assert not list(merged_dir.glob("adapter_*"))
    torch.testing.assert_close(_logits(merged, ids), expected, atol=1e-4, rtol=1e-4)
    generated = merged.generate(ids, max_new_tokens=8, do_sample=False)
    assert generated.shape[1] == ids.shape[1] + 8
    assert isinstance(tokenizer.decode(generated[0, ids.shape[1] :]), str)


def test_full_finetune_artifact_is_a_model_dir(
    tiny_model_dir: Path, tiny_tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    model = _trained_lora(tiny_model_dir, method="full")
    ids = _prompt(tiny_tokenizer)
    expected = _logits(model, ids)
    artifacts = write_final(
        model,
        tiny_tokenizer,
        info=_info(str(tiny_model_dir)),
        base_dir=tiny_model_dir,
        output_prefix=str(tmp_path / "out"),
        merge=True,  # nothing to merge for a full fine-tune: no second dir
        quantized=False,
        state={"step": 1},
        work_dir=tmp_path / "work",
        store=None,
    )
    assert artifacts.merged_uri is None
    loaded = AutoModelForCausalLM.from_pretrained(artifacts.uri, local_files_only=True)
    torch.testing.assert_close(_logits(loaded, ids), expected, atol=1e-5, rtol=1e-5)


def test_artifact_on_s3_is_committed_and_loads(
    tiny_model_dir: Path,
    tiny_tokenizer: PreTrainedTokenizerBase,
    object_store: ObjectStore,
    tmp_path: Path,
) -> None:
    model = _trained_lora(tiny_model_dir)
    ids = _prompt(tiny_tokenizer)
    expected = _logits(model, ids)
    prefix = object_store.uri("runs/job-1")
    artifacts = write_final(
        model,
        tiny_tokenizer,
        info=_info(BASE_LOCATION),
        base_dir=tiny_model_dir,
        output_prefix=prefix,
        merge=False,
        quantized=False,
        state={"step": 3},
        work_dir=tmp_path / "work",
        store=object_store,
    )
    assert artifacts.uri == prefix + "/final"
    assert artifacts.merged_uri is None
    assert object_store.is_committed(artifacts.uri + "/")
    local = tmp_path / "downloaded"
    object_store.get_dir(artifacts.uri + "/", local)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    reloaded = PeftModel.from_pretrained(base, local)
    torch.testing.assert_close(_logits(reloaded, ids), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["final", "final-merged"])
def test_rerun_replaces_a_local_artifact(tmp_path: Path, name: str) -> None:
    from services.trainer.artifacts import publish_dir

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "old.txt").write_text("old")
    (second / "new.txt").write_text("new")
    dest = str(tmp_path / "out" / name)
    publish_dir(first, dest, None)
    publish_dir(second, dest, None)
    assert sorted(p.name for p in Path(dest).iterdir()) == ["new.txt"]
