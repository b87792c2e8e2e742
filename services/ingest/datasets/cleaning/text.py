"""Text views of a sample shared by the cleaning steps: what dedup and decontamination compare.

Words are lowercased, ASCII punctuation counts as space ("year." is "year"), and they are split
on whitespace. Word n-grams are hashed in numpy over one flat array of all samples' words,
so 100,000 samples cost one Python pass over the words, not one per n-gram.
"""

from __future__ import annotations

import hashlib
import string
import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np
import orjson

from shared.chat import Message, Sample, TextPart

# Odd 64-bit multipliers for combining word hashes into n-gram hashes (wrapping uint64).
_MIX = np.uint64(0x9E3779B97F4A7C15)
_MIX2 = np.uint64(0xBF58476D1CE4E5B9)


def message_text(message: Message) -> str:
    """Visible text of a message plus its tool calls (`name arguments`), reasoning excluded."""
    parts = [part.text for part in message.content if isinstance(part, TextPart)]
    parts.extend(f"{call.name} {call.arguments}" for call in message.tool_calls)
    if message.refusal:
        parts.append(message.refusal)
    return "\n".join(parts)


def dialogue_text(sample: Sample) -> str:
    """The conversation without system messages: a long shared system prompt would make every
    pair of samples look alike to near-dup and decontamination."""
    return "\n".join(message_text(m) for m in sample.messages if m.role != "system")


def _norm(text: str) -> str:
    # NFC first, so the key is never finer than Message.canonical() (see prompt_key).
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    return " ".join(text.lower().split())


def _message_key(message: Message) -> str:
    text = "\x1d".join(
        _norm(p.text) if isinstance(p, TextPart) else orjson.dumps(p.canonical()).decode()
        for p in message.content
    )
    calls = (
        orjson.dumps(
            [[c.name, orjson.loads(c.arguments)] for c in message.tool_calls],
            option=orjson.OPT_SORT_KEYS,
        ).decode()
        if message.tool_calls
        else ""
    )
    refusal = _norm(message.refusal) if message.refusal else ""
    return f"{message.role}\x1f{message.name or ''}\x1f{text}\x1f{calls}\x1f{refusal}"


def exact_key(sample: Sample, messages: Sequence[Message] | None = None) -> bytes:
    """Digest of the whitespace- and case-normalised messages and tools, for exact dedup."""
    key = "\x1e".join(_message_key(m) for m in (sample.messages if messages is None else messages))
    if sample.tools:
        tools = [[t.name, t.description, t.parameters] for t in sample.tools]
        key += "\x1e" + orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode()
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


# ASCII punctuation becomes a space, so "year." and "year" are one word (bytes.translate is
# C-fast; punctuation outside ASCII is left as it is).
_PUNCTUATION = bytes(ord(" ") if chr(b) in string.punctuation else b for b in range(256))


def prompt_key(sample: Sample) -> bytes:
    """exact_key of the prompt (tools + messages before the final assistant turn). Coarser than
    Sample.prompt_fingerprint() (case and inner whitespace ignored, reasoning left out) and
    several times cheaper, so equal prompt fingerprints always give equal prompt keys."""
    return exact_key(sample, sample.prompt_messages())


class _WordHashes(dict[bytes, int]):
    """Stable 64-bit word hashes, computed once per distinct word (Python's hash() is salted per
    process, and dedup decisions must not change between runs)."""

    def __missing__(self, word: bytes) -> int:
        value = int.from_bytes(hashlib.blake2b(word, digest_size=8).digest(), "little")
        self[word] = value
        return value


class WordCache:
    """Word hashes per text, kept for the whole build: near-dup and decontamination read the
    same conversations, and splitting words is the costly part of both."""

    def __init__(self) -> None:
        self._table = _WordHashes()
        self._rows: dict[str, np.ndarray] = {}

    def words(self, text: str) -> np.ndarray:
        row = self._rows.get(text)
        if row is None:
            words = text.lower().encode().translate(_PUNCTUATION).split()
            row = np.fromiter(map(self._table.__getitem__, words), np.uint64, len(words))
            self._rows[text] = row
        return row

    def flat(self, texts: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' word hashes in one uint64 array, and row offsets (len(texts) + 1)."""
        rows = [self.words(text) for text in texts]
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum([len(r) for r in rows], out=offsets[1:])
        flat = np.concatenate(rows) if rows else np.empty(0, np.uint64)
        return flat, offsets


def _mix(hashes: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        hashes ^= hashes >> np.uint64(31)
        hashes *= _MIX2
        hashes ^= hashes >> np.uint64(29)
    return hashes


def ngram_hashes(
    words: np.ndarray, offsets: np.ndarray, n: int, *, whole_short_rows: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of every run of n consecutive words inside a row, and the row of each (rows in
    ascending order).

    `whole_short_rows`: a row with fewer than n words (but some) gives one hash of all its
    words, so short texts still have a shingle.
    """
    lengths = np.diff(offsets)
    count = max(0, len(words) - n + 1)
    hashes = words[:count].copy()
    with np.errstate(over="ignore"):
        for k in range(1, n):  # slices, not gathers: n passes over contiguous memory
            hashes *= _MIX
            hashes += words[k : k + count]
    # A gram is valid unless it runs past its row's end: mask the last n-1 starts of each row
    # (n small passes over the rows, not over the words).
    valid = np.ones(count, bool)
    for k in range(1, n):
        starts = offsets[1:] - k
        inside = (starts >= offsets[:-1]) & (starts < count)
        valid[starts[inside]] = False
    hashes = _mix(hashes[valid])
    rows = np.repeat(np.arange(len(lengths)), np.maximum(lengths - n + 1, 0))
    if whole_short_rows:
        short = np.flatnonzero((lengths > 0) & (lengths < n))
        if len(short):
            extra = np.array([_combine(words[offsets[r] : offsets[r + 1]]) for r in short])
            hashes = np.concatenate([hashes, _mix(extra.astype(np.uint64))])
            rows = np.concatenate([rows, short])
            order = np.argsort(rows, kind="stable")
            hashes, rows = hashes[order], rows[order]
    return hashes, rows


def _combine(row: np.ndarray) -> int:
    value = 0
    for word in row.tolist():
        value = (value * int(_MIX) + word) % (1 << 64)
    return value
