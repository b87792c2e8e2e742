"""Request parameters, token usage, provider and finish reasons of a GenAI span, across the
attribute names each convention uses (semconv current and older, OpenLLMetry, OpenInference).

Values arrive as ints, floats or strings (lf07 sends token counts as "174"); anything that does
not read as the expected type is skipped rather than failing the span: it is metadata, not
content. `-1` or `0` for max_tokens means "not set" (OpenLit, lf01).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import orjson

from shared.chat import Provider

_USAGE_KEYS: dict[str, tuple[str, ...]] = {
    "input_tokens": (
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.prompt_tokens",
        "llm.token_count.prompt",
    ),
    "output_tokens": (
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.completion_tokens",
        "llm.token_count.completion",
    ),
    "total_tokens": (
        "gen_ai.usage.total_tokens",
        "llm.usage.total_tokens",
        "llm.token_count.total",
    ),
    "cached_input_tokens": (
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.cache_read_input_tokens",
        "llm.token_count.prompt_details.cache_read",
    ),
    "reasoning_tokens": (
        "gen_ai.usage.reasoning.output_tokens",
        "gen_ai.usage.reasoning_tokens",
        "llm.token_count.completion_details.reasoning",
    ),
}
_PROVIDER_KEYS = ("gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")
_FINISH_KEYS = ("gen_ai.response.finish_reasons", "llm.finish_reason")


def _count(value: Any) -> int | None:
    """A token count or other non-negative integer, from int, integral float or digit string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        return int(value) if value.isdecimal() and value.isascii() else None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


def _positive(value: Any) -> int | None:
    count = _count(value)
    return count if count else None  # 0 / -1: "not set"


def _integer(value: Any) -> int | None:
    if isinstance(value, str) and value.strip().lstrip("-").isdecimal():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _stop(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value] if value else None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    return None


def _typed(kind: type) -> Callable[[Any], Any]:
    return lambda value: value if isinstance(value, kind) else None


# Canonical RequestParams field -> reader; the same readers serve semconv attributes and
# OpenInference's `llm.invocation_parameters` JSON.
_PARAM_READERS: dict[str, Callable[[Any], Any]] = {
    "temperature": _number,
    "top_p": _number,
    "top_k": _positive,
    "max_tokens": _positive,
    "stop": _stop,
    "n": _positive,
    "seed": _integer,
    "presence_penalty": _number,
    "frequency_penalty": _number,
    "response_format": _typed(dict),
    "tool_choice": lambda v: v if isinstance(v, str | dict) else None,
    "parallel_tool_calls": _typed(bool),
    "reasoning_effort": _typed(str),
    "stream": _typed(bool),
}
_SEMCONV_PARAMS = {
    "gen_ai.request.temperature": "temperature",
    "gen_ai.request.top_p": "top_p",
    "gen_ai.request.top_k": "top_k",
    "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.request.stop_sequences": "stop",
    "gen_ai.request.choice.count": "n",
    "gen_ai.request.seed": "seed",
    "gen_ai.request.presence_penalty": "presence_penalty",
    "gen_ai.request.frequency_penalty": "frequency_penalty",
    "gen_ai.request.is_stream": "stream",
    "gen_ai.is_streaming": "stream",
    "llm.is_streaming": "stream",
}
# Provider spellings of max_tokens in invocation parameters.
_PARAM_ALIASES = {"max_completion_tokens": "max_tokens", "max_output_tokens": "max_tokens"}


def usage(attrs: dict[str, Any]) -> dict[str, int] | None:
    """Token usage with canonical field names; total derived when only the parts are given."""
    found: dict[str, int] = {}
    for field, keys in _USAGE_KEYS.items():
        for key in keys:
            value = attrs.get(key)
            if value is None:  # most of the spellings are absent: skip the call
                continue
            count = _count(value)
            if count is not None:
                found[field] = count
                break
    if "total_tokens" not in found and {"input_tokens", "output_tokens"} <= found.keys():
        found["total_tokens"] = found["input_tokens"] + found["output_tokens"]
    return found or None


def invocation_parameters(attrs: dict[str, Any]) -> dict[str, Any]:
    """OpenInference's JSON `llm.invocation_parameters`, or {} when absent or unreadable."""
    raw = attrs.get("llm.invocation_parameters")
    if isinstance(raw, str):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {}
    return raw if isinstance(raw, dict) else {}


def request_params(attrs: dict[str, Any]) -> dict[str, Any]:
    """RequestParams fields: semconv `gen_ai.request.*` first, then invocation parameters."""
    params: dict[str, Any] = {}
    for key, field in _SEMCONV_PARAMS.items():
        if field not in params and key in attrs:
            value = _PARAM_READERS[field](attrs[key])
            if value is not None:
                params[field] = value
    for key, raw in invocation_parameters(attrs).items():
        field = _PARAM_ALIASES.get(key, key)
        reader = _PARAM_READERS.get(field)
        if reader is not None and field not in params:
            value = reader(raw)
            if value is not None:
                params[field] = value
    return params


def requested_model(attrs: dict[str, Any]) -> str | None:
    model = attrs.get("gen_ai.request.model") or invocation_parameters(attrs).get("model")
    model = model or attrs.get("model_name")  # pydantic-ai agent span (lf07)
    return model if isinstance(model, str) and model else None


def response_model(attrs: dict[str, Any]) -> str | None:
    model = attrs.get("gen_ai.response.model") or attrs.get("llm.model_name")
    return model if isinstance(model, str) and model else None


def provider(attrs: dict[str, Any]) -> tuple[Provider, str | None]:
    """(canonical provider, the name as the span spelled it)."""
    raw = None
    for key in _PROVIDER_KEYS:
        value = attrs.get(key)
        if isinstance(value, str) and value:
            raw = value
            break
    name = (raw or "").lower()
    if "openai" in name:  # openai, OpenAI, azure.ai.openai
        return "openai", raw
    if "anthropic" in name:
        return "anthropic", raw
    if any(word in name for word in ("gemini", "vertex", "google", "gcp.")):
        return "gemini", raw
    return "other", raw


def finish_reasons(attrs: dict[str, Any]) -> list[str]:
    """Span-level finish reasons: a string array, a JSON-string array (lf04) or one string."""
    for key in _FINISH_KEYS:
        value = attrs.get(key)
        if isinstance(value, str) and value.startswith("["):
            with contextlib.suppress(orjson.JSONDecodeError):
                value = orjson.loads(value)
        if isinstance(value, str) and value:
            return [value]
        if isinstance(value, list):
            return [v for v in value if isinstance(v, str)]
    return []
