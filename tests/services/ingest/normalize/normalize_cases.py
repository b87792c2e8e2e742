"""The recorded provider exchanges of ../shared/fixtures as normaliser inputs, the checks every
sample made from them must pass, and a JSON strategy for fuzzing the normalisers.

Fixture files are used unchanged. Gemini `responses/gr*` files are responses only: they are paired
with a one-line request; `requests/ge06*` is a request only: it is paired with a one-call answer.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from services.ingest.normalize import Exchange, Normalized, NormalizeError
from services.ingest.normalize import anthropic as anthropic_normalizer
from services.ingest.normalize import gemini as gemini_normalizer
from services.ingest.normalize import openai as openai_normalizer
from shared.chat import Sample, to_openai_messages

TENANT = "acme"
WHEN = datetime(2025, 8, 19, 14, 55, tzinfo=UTC)
PROVIDERS = {"oa": "openai", "an": "anthropic", "ge": "gemini", "gr": "gemini"}
NORMALIZERS: dict[str, Callable[[Exchange], Normalized]] = {
    "openai": openai_normalizer.normalize,
    "anthropic": anthropic_normalizer.normalize,
    "gemini": gemini_normalizer.normalize,
}
GEMINI_PROMPT = {"contents": [{"role": "user", "parts": [{"text": "Call the function, please."}]}]}
GE06_ANSWER = {
    "candidates": [
        {
            "content": {"role": "model", "parts": [{"functionCall": {"name": "enable_lights"}}]},
            "finishReason": "STOP",
        }
    ]
}
_MODEL_IN_PATH = re.compile(r"/models/([^/:]+):")
# An API key, an Anthropic key header or an Authorization header leaking into a sample.
_CREDENTIAL = re.compile(r"\bsk-|x-api-key|\bauthorization\b|\bbearer\s", re.IGNORECASE)


def fixtures_dir() -> Path | None:
    """../shared/fixtures next to the repository, or $TUNELOOP_FIXTURES_DIR."""
    candidates = [
        os.environ.get("TUNELOOP_FIXTURES_DIR"),
        str(Path(__file__).resolve().parents[5] / "shared" / "fixtures"),
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "chat" / "derived").is_dir():
            return Path(candidate)
    return None


@dataclass(frozen=True)
class Case:
    """One recorded exchange: `key` is `<fixture short name>#<exchange index>`."""

    key: str
    exchange: Exchange
    raw: dict[str, Any]  # {"request": body, "response": body or stream text}

    def normalize(self) -> Normalized:
        return NORMALIZERS[self.exchange.provider](self.exchange)


def _exchange(short: str, i: int, request: Any, status: int, body: Any, uri: str = "") -> Exchange:
    match = _MODEL_IN_PATH.search(uri)
    return Exchange(
        provider=PROVIDERS[short[:2]],  # type: ignore[arg-type]
        request=request,
        status=status,
        response=body if isinstance(body, dict) else None,
        stream=body if isinstance(body, str) else None,
        model_from_path=match.group(1) if match else None,
        tenant=TENANT,
        source_ref=f"{short}#{i}",
        created_at=WHEN,
        latency_ms=120.0,
        tags=["fixture"],
        metadata={"fixture": short},
    )


def _pairs(root: Path) -> list[Case]:
    cases = []
    for path in sorted((root / "chat" / "derived").glob("*.pairs.json")):
        short = path.name[:4]
        for i, pair in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            request, response = pair["request"], pair["response"]
            exchange = _exchange(
                short, i, request["body"], response["status"], response["body"], request["uri"]
            )
            cases.append(
                Case(
                    f"{short}#{i}",
                    exchange,
                    {"request": request["body"], "response": response["body"]},
                )
            )
    return cases


def _gemini_halves(root: Path) -> list[Case]:
    cases = []
    for path in sorted((root / "chat" / "gemini" / "responses").glob("gr*")):
        body: Any = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            body = json.loads(body)
        exchange = _exchange(path.name[:4], 0, GEMINI_PROMPT, 200, body)
        cases.append(
            Case(f"{path.name[:4]}#0", exchange, {"request": GEMINI_PROMPT, "response": body})
        )
    for path in sorted((root / "chat" / "gemini" / "requests").glob("ge06*.request.json")):
        request = json.loads(path.read_text(encoding="utf-8"))
        exchange = _exchange(
            "ge06", 0, request, 200, GE06_ANSWER, "/v1beta/models/gemini-2.0-flash:generateContent"
        )
        cases.append(Case("ge06#0", exchange, {"request": request, "response": GE06_ANSWER}))
    return cases


_NO_FIXTURES = "conformance fixtures not found (../shared/fixtures; set TUNELOOP_FIXTURES_DIR)"


def recorded(provider: str) -> list[Case]:
    """Every recorded exchange of `provider`; the test skips when the fixtures are absent."""
    root = fixtures_dir()
    if root is None:
        pytest.skip(_NO_FIXTURES)
    return [c for c in _pairs(root) + _gemini_halves(root) if c.exchange.provider == provider]


def cases(provider: str) -> list[Any]:
    """pytest params, one per recorded exchange of `provider` (one skipped param if absent)."""
    if fixtures_dir() is None:
        return [pytest.param(None, marks=pytest.mark.skip(reason=_NO_FIXTURES), id="no-fixtures")]
    return [pytest.param(c, id=c.key) for c in recorded(provider)]


@dataclass(frozen=True)
class Rejected:
    """The expected outcome of an exchange that cannot be a sample."""

    path: str
    says: str


Expectation = Callable[[Case, Normalized], None] | Rejected


def check_case(case: Case, expected: Expectation) -> None:
    """Normalise `case`; it must be rejected as `expected` says, or pass the common checks and
    then `expected`'s own."""
    if isinstance(expected, Rejected):
        with pytest.raises(NormalizeError) as info:
            case.normalize()
        assert info.value.path == expected.path
        assert expected.says in info.value.reason
        return
    result = case.normalize()
    assert result.samples
    for sample in result.samples:
        check_sample(case.exchange, sample)
    expected(case, result)


def check_sample(exchange: Exchange, sample: Sample) -> None:
    """What holds for every sample: provenance from the exchange, an exact JSON round trip, an
    OpenAI export, and no credentials."""
    assert sample.tenant == exchange.tenant
    assert sample.source == exchange.source
    assert sample.source_ref == exchange.source_ref
    assert sample.created_at == exchange.created_at
    assert sample.tags == exchange.tags
    assert sample.metadata == exchange.metadata
    assert sample.response is not None
    assert sample.response.provider == exchange.provider
    assert sample.response.latency_ms == exchange.latency_ms
    data = sample.to_json_bytes()
    assert Sample.from_json_bytes(data) == sample
    assert _CREDENTIAL.search(data.decode()) is None
    to_openai_messages(sample)


# --- fuzzing -------------------------------------------------------------------------------------

_WORDS = [
    "user", "assistant", "system", "tool", "model", "developer", "text", "image", "image_url",
    "url", "data", "type", "role", "content", "parts", "function", "name", "arguments", "id",
    "args", "input", "source", "base64", "tool_use", "tool_result", "tool_calls", "thinking",
    "functionCall", "functionResponse", "inlineData", "fileData", "mimeType", "index", "delta",
    "", "data:image/png;base64,iVBORw0KGgo=", "https://example.com/a.png", "{}", '{"a": 1}',
    "iVBORw0KGgo=", "image/png", "STOP", "OBJECT",
]  # fmt: skip
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(_WORDS)
    | st.text(max_size=12)
)
_KEYS = st.sampled_from(_WORDS) | st.text(max_size=8)

json_values = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=5),
    max_leaves=24,
)
"""Arbitrary JSON, biased towards the words the providers' formats use so fuzzing gets deep."""


def normalize_or_reject(exchange: Exchange) -> Normalized | None:
    """The outcome of a fuzzed exchange: samples, or None for a NormalizeError. Anything else
    (KeyError, TypeError, ValidationError...) fails the test."""
    try:
        result = NORMALIZERS[exchange.provider](exchange)
    except NormalizeError:
        return None
    for sample in result.samples:
        Sample.from_json_bytes(sample.to_json_bytes())
    return result


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON value (long strings, such as base64 data, count as leaves)."""
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _paths(item, (*path, i))
    return found


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _replace(value[head], rest, new)
    return copy


def mutated(case: Case, data: st.DataObject) -> Exchange:
    """`case` with one field of its request, response or of one stream chunk replaced by
    arbitrary JSON: the real shapes, broken in one place."""
    exchange = case.exchange
    target = data.draw(st.sampled_from(["request", "response"]))
    if target == "request" or exchange.stream is None:
        body = exchange.request if target == "request" else exchange.response
        path = data.draw(st.sampled_from(_paths(body)))
        changed = _replace(body, path, data.draw(json_values))
        return replace(exchange, **{target: changed})
    lines = exchange.stream.splitlines(keepends=True)
    chunks = [i for i, line in enumerate(lines) if line.startswith("data: {")]
    i = data.draw(st.sampled_from(chunks))
    chunk = json.loads(lines[i][len("data: ") :])
    path = data.draw(st.sampled_from(_paths(chunk)))
    lines[i] = f"data: {json.dumps(_replace(chunk, path, data.draw(json_values)))}\n"
    return replace(exchange, stream="".join(lines))


# --- agreement with the schema's own expectations ------------------------------------------------


def hand_built(prefix: str) -> list[str]:
    """The fixtures tests/shared/test_chat.py turns into samples by hand, from the fixture files,
    to show what ingest should make of them."""
    from tests.shared.test_chat import FIXTURE_SAMPLES

    return sorted(short for short in FIXTURE_SAMPLES if short.startswith(prefix))


def check_against_hand_built(short: str) -> None:
    """The normaliser makes the samples the schema tests build by hand: same messages, tools,
    params and response metadata (ids, times and provenance are the test's own)."""
    from tests.shared.test_chat import FIXTURE_SAMPLES

    root = fixtures_dir()
    if root is None:
        pytest.skip(_NO_FIXTURES)

    def load(name: str) -> list[dict[str, Any]]:
        (path,) = (root / "chat" / "derived").glob(f"{name}_*.pairs.json")
        pairs: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
        return pairs

    expected = FIXTURE_SAMPLES[short](load)
    provider = PROVIDERS[short[:2]]
    made = [
        s
        for c in recorded(provider)
        if c.key.startswith(f"{short}#")
        for s in c.normalize().samples
    ]
    # The hand-built list may stop after the first exchange of a fixture.
    for ours, theirs in zip(made[: len(expected)], expected, strict=True):
        assert ours.messages == theirs.messages
        assert ours.tools == theirs.tools
        assert ours.params == theirs.params
        assert ours.response is not None
        assert theirs.response is not None
        assert ours.response.model_copy(update={"latency_ms": None}) == theirs.response
