"""Model fixtures: a tiny tokenizer and Llama built offline in milliseconds, and the real SmolLM2.

The tiny pair mirrors SmolLM2's conventions (ChatML, `<|im_start|>`/`<|im_end|>` as bos/eos, pad
equal to eos, tied embeddings) so code tested on it meets the same traps as on the real model.
Session fixtures hand out shared objects and directories: copy before changing them.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from services.trainer.rendering import CHATML_TOOLS_TEMPLATE
from shared.dev.base_models import SMOLLM2_DIR_NAME, convert_gguf_to_hf, smollm2_gguf_path

REPO_ROOT = Path(__file__).resolve().parents[2]
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 as in SmolLM2
TINY_VOCAB_SIZE = 512

# ChatML as SmolLM2 renders it, plus the Hermes/Qwen convention for tools (SmolLM2's own template
# has none): the trainer's fallback template, so the tiny model renders tools natively. Unlike
# SmolLM2 it adds no default system prompt, so expected strings in tests stay short.
CHAT_TEMPLATE = CHATML_TOOLS_TEMPLATE

_CORPUS_LINES = (
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "You are a helpful assistant. Answer briefly and politely.",
    "Please summarise the following support ticket for the on-call engineer.",
    "The customer reports that the invoice total is wrong after the refund.",
    "Translate to German: good morning, how are you today?",
    "def add(a, b):\n    return a + b\n",
    '{"name": "get_weather", "arguments": {"city": "Berlin", "unit": "celsius"}}',
    "<tool_call> get_weather city Berlin </tool_call> The weather in Berlin is sunny, 21 degrees.",
    "user assistant system tool: numbers 0 1 2 3 4 5 6 7 8 9 10 42 100 2024",
    "Classify the sentiment as positive, negative or neutral. Label: positive",
    "Extract the order id, the date and the amount from this e-mail message.",
    "Fine-tuning a small model on captured traffic makes it cheaper and faster.",
)


@lru_cache(maxsize=1)
def _tiny_tokenizer_json() -> str:
    """Train the tiny byte-level BPE once per process; the JSON is the deterministic artefact."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        # Every byte is in the vocabulary, so no text is ever unknown.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(_CORPUS_LINES) * 20, trainer=trainer)
    return tokenizer.to_str()


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh fast tokenizer with SmolLM2's special tokens and a ChatML template; no download."""
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tiny_tokenizer_json()),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
    )


def tiny_llama_config(vocab_size: int = TINY_VOCAB_SIZE) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )


def build_tiny_causal_lm(seed: int = 0) -> LlamaForCausalLM:
    """A random 2-layer Llama sized for the tiny tokenizer; the same seed gives the same weights."""
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(seed)
        model = LlamaForCausalLM(tiny_llama_config(len(build_tiny_tokenizer())))
    model.train(False)
    return model


def smollm2_model_dir() -> Path:
    """TUNELOOP_MODEL_DIR if set, else the default data dir under the repository root."""
    override = os.environ.get("TUNELOOP_MODEL_DIR")
    return Path(override) if override else REPO_ROOT / ".tuneloop" / "models" / SMOLLM2_DIR_NAME


def pytest_configure(config: pytest.Config) -> None:
    """No test may reach a model hub: there is none here, and a hit would mean a hidden download."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # for child processes
    huggingface_hub.constants.HF_HUB_OFFLINE = True  # read at call time by this process


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return build_tiny_tokenizer()


@pytest.fixture
def tiny_model() -> LlamaForCausalLM:
    """A fresh tiny model per test, free to train or mutate."""
    return build_tiny_causal_lm()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A HF directory (safetensors, config, tokenizer) of the tiny model; treat as read-only."""
    model_dir = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_causal_lm().save_pretrained(model_dir)
    build_tiny_tokenizer().save_pretrained(model_dir)
    return model_dir


@pytest.fixture(scope="session")
def tiny_stopping_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with an end-of-turn token it can learn to say. Llama's embedding zeroes the
    pad token's row, and pad is eos here (tied embeddings, as SmolLM2): `<|im_end|>`'s logit is 0
    whatever the hidden state, so a LoRA run (embeddings frozen) can never teach the model to
    stop, and every answer runs to max_tokens. Here that row is random like the others, as a
    trained model's is; a few dozen LoRA steps then learn a short answer and its end."""
    model = build_tiny_causal_lm()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(1)
        embeddings = model.get_input_embeddings().weight
        assert isinstance(embeddings, torch.Tensor)
        embeddings[model.config.eos_token_id].normal_(0.0, model.config.initializer_range)
    model_dir = tmp_path_factory.mktemp("tiny-llama-stopping")
    model.save_pretrained(model_dir)
    build_tiny_tokenizer().save_pretrained(model_dir)
    return model_dir


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct; converted here (~30 s) if `make` has not done it."""
    return convert_gguf_to_hf(smollm2_gguf_path(), smollm2_model_dir())
