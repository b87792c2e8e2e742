"""Map each provider's finish/stop reason onto our small enum; the raw value is kept beside it."""

from __future__ import annotations

from typing import Literal

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "error", "other"]

_BY_NAME: dict[str, FinishReason] = {
    # OpenAI
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
    # OpenAI Responses: the response's status, or why it is incomplete
    "completed": "stop",
    "max_output_tokens": "length",
    # Anthropic
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "other",
    # Gemini (REST names)
    "safety": "content_filter",
    "recitation": "content_filter",
    "blocklist": "content_filter",
    "prohibited_content": "content_filter",
    "spii": "content_filter",
    "image_safety": "content_filter",
    "language": "other",
    "malformed_function_call": "error",
    "unexpected_tool_call": "error",
    # OTel GenAI semconv
    "tool_call": "tool_calls",
    "error": "error",
}

# Vertex with `enum-encoding=int` sends google.cloud.aiplatform FinishReason numbers (ge01).
_GEMINI_INT: dict[int, str] = {
    1: "stop",
    2: "max_tokens",
    3: "safety",
    4: "recitation",
    5: "other",
    6: "blocklist",
    7: "prohibited_content",
    8: "spii",
    9: "malformed_function_call",
    10: "image_safety",
}


def normalize_finish_reason(
    raw: str | int | None, *, has_tool_calls: bool = False
) -> FinishReason | None:
    """`raw` as the provider sent it -> our enum; unknown values become "other", None stays None.

    Gemini says STOP even when the answer is function calls, so pass `has_tool_calls`.
    """
    if raw is None:
        return None
    name = _GEMINI_INT.get(raw, "other") if isinstance(raw, int) else raw.strip().lower()
    reason = _BY_NAME.get(name.removeprefix("finish_reason_"), "other")
    if reason == "stop" and has_tool_calls:
        return "tool_calls"
    return reason
