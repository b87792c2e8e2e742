"""Structured output on the CPU engine: OpenAI's `response_format` honoured by constrained decoding.

A team that sends `response_format` to a frontier model today sends the same request to its
fine-tuned version through the same gateway tomorrow; refusing the field would break its app at
the switch. outlines-core (the Rust core of vLLM's `outlines` guided-decoding backend; no
dependencies of its own) turns a JSON schema into an automaton over the model's vocabulary. At
each decode step the logits of the tokens the automaton does not allow are set to -inf, so the
answer parses and matches the schema, unless `max_tokens` cuts it short (finish reason
`length`, as OpenAI's). On GPU, vLLM does the same with its own backends.

What is ours: reading `response_format` (errors name the field), the vocabulary as bytes per
token (byte-level BPE as GPT-2 maps bytes to characters, SentencePiece's `▁` and `<0xNN>`), a
cache of compiled automata, and the logits processor that steps each batch member's automaton.
Compiling is the cost: ~15 ms for a small schema, ~7 s for `json_object` (any JSON object) on
SmolLM2's 49k tokens, once per engine and vocabulary, as the first such request waits.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from outlines_core import Guide, Index, Vocabulary
from outlines_core.json_schema import build_regex_from_schema
from transformers import LogitsProcessor

# At most one space between JSON tokens: outlines' default allows any run of whitespace, which a
# small greedy model can fill until max_tokens.
WHITESPACE = r"[ ]?"
ANY_OBJECT = {"type": "object"}
CACHED_AUTOMATA = 32


class FormatRefused(ValueError):
    """A `response_format` this engine cannot honour: the field it is about and why."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def schema_of(response_format: Any) -> dict[str, Any] | None:
    """The JSON schema an answer must match (None: free text), from OpenAI's `response_format`:
    `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}}`."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise FormatRefused("response_format", "must be an object with a `type`")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind != "json_schema":
        raise FormatRefused("response_format.type", "must be text, json_object or json_schema")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise FormatRefused("response_format.json_schema", "must be an object with a `schema`")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise FormatRefused("response_format.json_schema.schema", "must be a JSON schema object")
    return schema


def regex_of(schema: dict[str, Any]) -> str:
    try:
        return str(build_regex_from_schema(json.dumps(schema), WHITESPACE))
    except Exception as exc:  # the Rust core raises ValueError and others for what it cannot read
        raise FormatRefused("response_format.json_schema.schema", str(exc)) from None


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as a printable character; this maps them back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return {c: b for b, c in chars.items()}


_BYTE_LEVEL = _byte_level_alphabet()


def token_bytes(token: str, *, byte_level: bool) -> bytes:
    """The bytes a token stands for: a byte-level BPE token's characters mapped back, else
    SentencePiece's conventions (`<0x0A>` one byte, `▁` a space)."""
    if byte_level and all(c in _BYTE_LEVEL for c in token):
        return bytes(_BYTE_LEVEL[c] for c in token)
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace("▁", " ").encode()


def is_byte_level(vocab: dict[str, int]) -> bool:
    """Whether tokens spell bytes as GPT-2 does: SentencePiece marks spaces `▁` and falls back
    to `<0xNN>` byte tokens; byte-level BPE has neither."""
    return "<0x0A>" not in vocab and not any("▁" in token for token in vocab)


@dataclass(frozen=True)
class _Vocab:
    eos_id: int
    tokens: dict[bytes, list[int]]
    fingerprint: str


def _vocab(tokenizer: Any) -> _Vocab:
    special = set(tokenizer.all_special_ids)
    byte_level = is_byte_level(tokenizer.get_vocab())
    tokens: dict[bytes, list[int]] = {}
    for token_id in range(len(tokenizer)):
        if token_id in special:
            continue
        token = tokenizer.convert_ids_to_tokens(token_id)
        if token is not None:
            tokens.setdefault(token_bytes(token, byte_level=byte_level), []).append(token_id)
    digest = hashlib.sha256(repr((tokenizer.eos_token_id, sorted(tokens.items()))).encode())
    return _Vocab(int(tokenizer.eos_token_id), tokens, digest.hexdigest())


class Grammars:
    """The compiled automata of one vocabulary, the most recently used kept."""

    def __init__(self, vocab: _Vocab) -> None:
        self.vocabulary = Vocabulary(vocab.eos_id, vocab.tokens)
        self.eos_id = vocab.eos_id
        self._indexes: OrderedDict[str, Index] = OrderedDict()
        self._lock = threading.Lock()

    def guide(self, schema: dict[str, Any]) -> Guide:
        """A fresh automaton for the schema (compiling it the first time: seconds for a broad
        one, so callers run this off the event loop)."""
        regex = regex_of(schema)
        with self._lock:
            index = self._indexes.get(regex)
            if index is not None:
                self._indexes.move_to_end(regex)
        if index is None:
            try:
                index = Index(regex, self.vocabulary)
            except Exception as exc:  # e.g. a pattern no sequence of these tokens can spell
                raise FormatRefused("response_format.json_schema.schema", str(exc)) from None
            with self._lock:
                self._indexes[regex] = index
                while len(self._indexes) > CACHED_AUTOMATA:
                    self._indexes.popitem(last=False)
        return Guide(index)


_GRAMMARS: dict[str, Grammars] = {}
_GRAMMARS_LOCK = threading.Lock()


def grammars_for(tokenizer: Any) -> Grammars:
    """One `Grammars` per distinct vocabulary: a base and its adapters' copies of its tokenizer
    share their compiled automata."""
    vocab = _vocab(tokenizer)
    with _GRAMMARS_LOCK:
        grammars = _GRAMMARS.get(vocab.fingerprint)
        if grammars is None:
            grammars = _GRAMMARS[vocab.fingerprint] = Grammars(vocab)
        return grammars


class Member(Protocol):
    """A batch member as the processor sees it (batching.Request)."""

    guide: Guide | None
    done: bool


class Guided(LogitsProcessor):
    """For each batch member with an automaton: advance it by the token chosen last step, then
    allow only the tokens it accepts next (the end-of-sequence token among them once the answer
    may end). Members without one, or finished (their end token or limit), are left alone."""

    def __init__(self, batch: Sequence[Member]) -> None:
        self.batch = batch
        self.first = True

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        vocab_size = scores.shape[1]
        words = np.empty((vocab_size + 31) // 32, dtype=np.int32)
        for row, member in enumerate(self.batch):
            guide = member.guide
            if guide is None or member.done:
                continue
            if not self.first:
                guide.advance(int(input_ids[row, -1]))
            guide.write_mask_into(words.ctypes.data, words.size, words.itemsize)
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size]
            scores[row, torch.from_numpy(bits == 0)] = -torch.inf
        self.first = False
        return scores
