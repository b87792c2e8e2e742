"""Export a sample as an OpenAI chat fine-tuning record: {"messages": [...], "tools": [...]}."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shared.chat.parts import AudioPart, ContentPart, FilePart, ImagePart, MediaPart, TextPart
from shared.chat.schema import Message, Sample, ToolDef

# Turns an s3:// ref into something the consumer can fetch (a presigned URL, a data URI).
RefResolver = Callable[[MediaPart], str]


class ExportError(ValueError):
    """The sample cannot be expressed in the target format; the message names the field."""


def to_openai_messages(
    sample: Sample, *, include_reasoning: bool = False, resolve_ref: RefResolver | None = None
) -> dict[str, Any]:
    """The sample as one line of an OpenAI chat fine-tuning file.

    Text-only content becomes a string (parts joined by newlines); media makes it a list of
    parts. Tool calls without ids (Gemini) get `call_<message>_<call>` ids and their results
    are paired by order, preferring the same function name. Reasoning is left out unless
    `include_reasoning`, which adds it as `reasoning_content` (vLLM / DeepSeek convention).
    OpenAI has no tool-error flag, so `is_error` is not exported.
    """
    call_ids, result_ids = _pair_tool_calls(sample.messages)
    messages = []
    for i, message in enumerate(sample.messages):
        out = _export_message(i, message, resolve_ref)
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call_ids[(i, j)],
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for j, call in enumerate(message.tool_calls)
            ]
        if message.role == "tool":
            out["tool_call_id"] = result_ids[i]
        if include_reasoning and (thoughts := [b.text for b in message.reasoning if b.text]):
            out["reasoning_content"] = "\n".join(thoughts)
        messages.append(out)
    record: dict[str, Any] = {"messages": messages}
    if sample.tools:
        record["tools"] = [_export_tool(tool) for tool in sample.tools]
    if sample.params.parallel_tool_calls is not None:
        record["parallel_tool_calls"] = sample.params.parallel_tool_calls
    return record


def _export_message(i: int, message: Message, resolve_ref: RefResolver | None) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role}
    if all(isinstance(part, TextPart) for part in message.content):
        # An assistant turn of only tool calls / a refusal has no content key, as OpenAI sends it.
        if message.content or not (message.tool_calls or message.refusal is not None):
            out["content"] = message.text()
    else:
        out["content"] = [
            _export_part(f"messages[{i}].content[{k}]", part, resolve_ref)
            for k, part in enumerate(message.content)
        ]
    if message.name is not None and message.role != "tool":
        out["name"] = message.name
    if message.refusal is not None:
        out["refusal"] = message.refusal
    if message.weight is not None:
        out["weight"] = message.weight
    return out


def _export_part(where: str, part: ContentPart, resolve_ref: RefResolver | None) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        image: dict[str, Any] = {"url": _uri(where, part, resolve_ref)}
        if part.detail is not None:
            image["detail"] = part.detail
        return {"type": "image_url", "image_url": image}
    if isinstance(part, AudioPart):
        if part.data is None or part.mime_type is None:
            raise ExportError(f"{where}: OpenAI takes audio only as inline data")
        audio_format = part.mime_type.split("/")[-1].removeprefix("x-").replace("mpeg", "mp3")
        return {"type": "input_audio", "input_audio": {"data": part.data, "format": audio_format}}
    return {"type": "file", "file": _export_file(where, part, resolve_ref)}


def _export_file(where: str, part: FilePart, resolve_ref: RefResolver | None) -> dict[str, Any]:
    if part.file_id is not None:
        return {"file_id": part.file_id}
    if part.url is not None or (part.ref is not None and resolve_ref is None):
        raise ExportError(f"{where}: OpenAI takes a file as file_id or inline data, not a URL")
    out = {"file_data": _uri(where, part, resolve_ref)}
    if part.filename is not None:
        out["filename"] = part.filename
    return out


def _uri(where: str, part: MediaPart, resolve_ref: RefResolver | None) -> str:
    if part.ref is not None and resolve_ref is not None:
        return resolve_ref(part)
    uri = part.as_uri()
    if uri is None:
        raise ExportError(f"{where}: the part has no URI to export")
    return uri


def _export_tool(tool: ToolDef) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _pair_tool_calls(
    messages: Sequence[Message],
) -> tuple[dict[tuple[int, int], str], dict[int, str]]:
    """Ids for every tool call (message index, call index) and every tool result (message index).

    A result without tool_call_id answers the first unanswered call of the latest assistant
    turn with the same name, else the first unanswered one.
    """
    call_ids: dict[tuple[int, int], str] = {}
    result_ids: dict[int, str] = {}
    pending: list[tuple[str, str]] = []  # (id, name) of calls not answered yet
    for i, message in enumerate(messages):
        if message.tool_calls:
            pending = []
            for j, call in enumerate(message.tool_calls):
                call_ids[(i, j)] = call.id or f"call_{i}_{j}"
                pending.append((call_ids[(i, j)], call.name))
        if message.role != "tool":
            continue
        if message.tool_call_id is not None:
            result_ids[i] = message.tool_call_id
            pending = [p for p in pending if p[0] != message.tool_call_id]
            continue
        match = next((p for p in pending if p[1] == message.name), pending[0] if pending else None)
        if match is None:
            raise ExportError(
                f"messages[{i}]: tool result has no tool_call_id and no call to answer"
            )
        result_ids[i] = match[0]
        pending.remove(match)
    return call_ids, result_ids
