"""The reply of a Gemini generateContent call: its candidates (one sample each), a blocked prompt,
usage; and a streamGenerateContent stream merged back into one response first.

Stream chunks come as SSE `data:` lines (`?alt=sse`, separated by `\\r\\n\\r\\n` or `\\n\\n`) or
as one JSON array; each is a GenerateContentResponse whose candidates add parts to the
candidates of the same index: text parts concatenate, the rest append; the last chunk's
finishReason and usageMetadata win.
"""

from __future__ import annotations

from typing import Any

from services.ingest.normalize import Exchange, NormalizeError
from services.ingest.normalize._gemini_content import content_messages
from services.ingest.normalize._json import (
    JsonObject,
    arr,
    at,
    count,
    loads,
    obj,
    one_or_many,
    opt_arr,
    opt_obj,
    opt_text,
    pick,
)
from services.ingest.normalize._sample import (
    Answer,
    Notes,
    Reply,
    check_unique_indices,
    error_reply,
    response_source,
)
from services.ingest.normalize.sse import parse_sse
from shared.chat import ProviderError, Usage

# A chunk holding none of these is not a GenerateContentResponse (gr08).
_RESPONSE_KEYS = frozenset(
    {
        "candidates",
        "promptFeedback",
        "prompt_feedback",
        "usageMetadata",
        "usage_metadata",
        "modelVersion",
        "model_version",
        "responseId",
        "response_id",
    }
)
# BlockReason numbers, for Vertex's enum-encoding=int.
_BLOCK_REASONS = {
    1: "SAFETY",
    2: "OTHER",
    3: "BLOCKLIST",
    4: "PROHIBITED_CONTENT",
    5: "IMAGE_SAFETY",
}
# Candidate fields whose content a sample has no place for.
_NOT_CARRIED = (
    "citationMetadata",
    "groundingMetadata",
    "urlContextMetadata",
    "logprobsResult",
    "finishMessage",
)


def reply(exchange: Exchange, notes: Notes) -> Reply:
    if exchange.status >= 400:
        return error_reply(exchange)
    source = response_source(exchange)
    base = "response"
    if isinstance(source, str):
        source, base = merge_stream(source), "stream"
    if "error" in source and "candidates" not in source:
        return error_reply(exchange, source)
    model_path, model = pick(source, base, "modelVersion")
    id_path, response_id = pick(source, base, "responseId")
    usage_path, usage = pick(source, base, "usageMetadata")
    result = Reply(
        model=opt_text(model, model_path),
        response_id=opt_text(response_id, id_path),
        usage=_usage(usage, usage_path, notes),
    )
    candidates_path, candidates = pick(source, base, "candidates")
    candidates = opt_arr(candidates, candidates_path)
    if not candidates:
        _blocked(result, source, base)
        return result
    result.answers = [
        _answer(at(candidates_path, i), i, raw, notes) for i, raw in enumerate(candidates)
    ]
    check_unique_indices(result.answers, candidates_path)
    return result


def _blocked(result: Reply, source: JsonObject, base: str) -> None:
    """Fill in the error of a reply without candidates: the prompt was blocked (gr04)."""
    feedback_path, feedback = pick(source, base, "promptFeedback")
    feedback = opt_obj(feedback, feedback_path) or {}
    reason_path, reason = pick(feedback, feedback_path, "blockReason")
    if reason is None:
        raise NormalizeError(
            at(base, "candidates"),
            "the response has no candidates and no promptFeedback.blockReason",
        )
    if not isinstance(reason, str | int) or isinstance(reason, bool):
        raise NormalizeError(reason_path, "must be a block reason name or number")
    code = _BLOCK_REASONS.get(reason, str(reason)) if isinstance(reason, int) else reason
    message_path, message = pick(feedback, feedback_path, "blockReasonMessage")
    result.error = ProviderError(
        type="prompt_blocked",
        code=code,
        message=opt_text(message, message_path) or f"the prompt was blocked ({code})",
    )
    result.error_finish, result.error_finish_raw = "content_filter", reason


def _answer(path: str, position: int, raw: Any, notes: Notes) -> Answer:
    raw = obj(raw, path)
    index = count(raw.get("index"))
    content_path, content = pick(raw, path, "content")
    content = opt_obj(content, content_path)
    message = None
    if content:
        (message,) = content_messages(content_path, content, "assistant", notes)
    for camel in _NOT_CARRIED:
        key_path, value = pick(raw, path, camel)
        if value not in (None, "", {}, []):
            notes.drop(key_path, f"{camel} is not carried")
    finish_path, finish = pick(raw, path, "finishReason")
    if finish is not None and (not isinstance(finish, str | int) or isinstance(finish, bool)):
        notes.drop(
            finish_path, "a finish reason that is neither a name nor a number is not carried"
        )
        finish = None
    return Answer(index=position if index is None else index, message=message, finish_raw=finish)


def _usage(value: Any, path: str, notes: Notes) -> Usage | None:
    """Gemini counts thoughts apart from candidates; our output_tokens include them."""
    if value is None:
        return None
    if not isinstance(value, dict):
        notes.drop(path, "usageMetadata is not an object")
        return None
    counts = {
        camel: count(pick(value, path, camel)[1])
        for camel in (
            "promptTokenCount",
            "toolUsePromptTokenCount",
            "candidatesTokenCount",
            "thoughtsTokenCount",
            "cachedContentTokenCount",
            "totalTokenCount",
        )
    }
    return Usage(
        input_tokens=_sum(counts["promptTokenCount"], counts["toolUsePromptTokenCount"]),
        output_tokens=_sum(counts["candidatesTokenCount"], counts["thoughtsTokenCount"]),
        total_tokens=counts["totalTokenCount"],
        cached_input_tokens=counts["cachedContentTokenCount"],
        reasoning_tokens=counts["thoughtsTokenCount"],
    )


def _sum(*values: int | None) -> int | None:
    given = [v for v in values if v is not None]
    return sum(given) if given else None


# --- streams ----------------------------------------------------------------------------------


def _chunks(stream: str) -> list[tuple[str, JsonObject]]:
    """(where, chunk) for each chunk: SSE `data:` lines, or a JSON array (no `alt=sse`)."""
    if stream.lstrip().startswith("["):
        items = arr(loads(stream, "stream"), "stream")
        return [(at("stream", i), obj(item, at("stream", i))) for i, item in enumerate(items)]
    chunks = []
    for event in parse_sse(stream):
        where = f"stream line {event.line}"
        chunks.append((where, obj(loads(event.data, where), where)))
    return chunks


def merge_stream(stream: str) -> JsonObject:
    """One GenerateContentResponse from the chunks of a stream, or the error chunk that ended it."""
    chunks = _chunks(stream)
    if not chunks:
        raise NormalizeError("stream", "holds no data chunks")
    merged: JsonObject = {}
    candidates: dict[int, JsonObject] = {}
    for where, chunk in chunks:
        if "error" in chunk:
            return chunk
        if not _RESPONSE_KEYS & chunk.keys():
            raise NormalizeError(
                where,
                "is not a GenerateContentResponse (no candidates, promptFeedback or usageMetadata)",
            )
        merged.update({k: v for k, v in chunk.items() if k != "candidates"})
        for position, raw in enumerate(opt_arr(chunk.get("candidates"), at(where, "candidates"))):
            path = at(at(where, "candidates"), position)
            raw = obj(raw, path)
            index = count(raw.get("index"))
            target = candidates.setdefault(position if index is None else index, {})
            _merge_candidate(target, raw, path)
    if candidates:
        merged["candidates"] = [candidates[i] for i in sorted(candidates)]
    return merged


def _merge_candidate(target: JsonObject, raw: JsonObject, path: str) -> None:
    for key, value in raw.items():
        if key != "content":
            target[key] = value
            continue
        content = obj(value, at(path, "content"))
        into = target.setdefault("content", {"parts": []})
        if "role" in content:
            into["role"] = content["role"]
        parts_path, parts = pick(content, at(path, "content"), "parts")
        for where, part in one_or_many(parts if parts is not None else [], parts_path):
            _merge_part(into["parts"], dict(obj(part, where)))


def _merge_part(parts: list[JsonObject], part: JsonObject) -> None:
    """Append `part`, or join it to the last part when both are text of the same kind."""
    last = parts[-1] if parts else None
    if (
        last is not None
        and isinstance(last.get("text"), str)
        and isinstance(part.get("text"), str)
        and bool(last.get("thought")) == bool(part.get("thought"))
        and "thoughtSignature" not in last
    ):
        last["text"] += part.pop("text")
        last.update(part)
        return
    parts.append(part)
