"""The canonical sample: one upstream exchange with its messages, tools, request parameters and
response metadata. See the package docstring for how provider shapes map onto it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal, Self

import orjson
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from shared.chat.finish import FinishReason, normalize_finish_reason
from shared.chat.identity import derive_sample_id, fingerprint
from shared.chat.parts import PART_TYPES, ChatModel, ContentPart, TextPart
from shared.tenancy import TenantId

SCHEMA_VERSION = 1

Role = Literal["system", "user", "assistant", "tool"]
Source = Literal["gateway", "upload", "otlp"]
Provider = Literal["openai", "anthropic", "gemini", "other"]
MetadataValue = str | int | float | bool | None


class ToolCall(ChatModel):
    """A function call the assistant made. `arguments` is a JSON string, exactly as OpenAI sends
    it; an object (Anthropic `input`, Gemini `args`) is encoded on the way in."""

    id: str | None = None
    name: str = Field(min_length=1)
    arguments: str = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _encode_object(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return json.dumps(value, ensure_ascii=False)
        return value

    @field_validator("arguments")
    @classmethod
    def _must_be_json(cls, value: str) -> str:
        try:
            orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"arguments must be a JSON-encoded string ({exc})") from None
        return value

    def parse_arguments(self) -> Any:
        return orjson.loads(self.arguments)


class ToolDef(ChatModel):
    """A function the model was offered. `parameters` is a JSON Schema object (ingest maps
    Gemini's enum types onto JSON Schema); absent when the tool takes none or did not say."""

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ReasoningBlock(ChatModel):
    """Model reasoning kept apart from the visible answer: Anthropic `thinking` (text +
    signature), `redacted_thinking` (opaque `redacted` data only), Gemini thought summaries and
    `thoughtSignature`s, OpenAI-compatible `reasoning_content`."""

    text: str = ""
    signature: str | None = None
    redacted: str | None = None

    @model_validator(mode="after")
    def _not_empty(self) -> Self:
        if not (self.text or self.signature or self.redacted):
            raise ValueError("a reasoning block needs text, signature or redacted data")
        return self


_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})
_ASSISTANT_ONLY = ("tool_calls", "reasoning", "refusal", "weight")
_TOOL_ONLY = ("tool_call_id", "is_error")


class Message(ChatModel):
    role: Role
    content: list[ContentPart] = Field(default_factory=list)
    # Participant name; on a tool message, the function whose result this is.
    name: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    is_error: bool = False
    reasoning: list[ReasoningBlock] = Field(default_factory=list)
    refusal: str | None = None
    # OpenAI fine-tuning's per-assistant-message training weight.
    weight: Literal[0, 1] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _wrap_text(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [{"type": "text", "text": value}]
        return value

    @model_validator(mode="after")
    def _check_role_fields(self) -> Self:
        # Runs for every message of every sample: the common, valid case is decided with a few
        # attribute reads; the loop below only runs to name the offending field.
        role = self.role
        if (
            (
                role == "assistant"
                or not (
                    self.tool_calls
                    or self.reasoning
                    or self.refusal is not None
                    or self.weight is not None
                )
            )
            and (role == "tool" or (self.tool_call_id is None and self.is_error is False))
            and (role != "tool" or self.tool_call_id is not None or self.name is not None)
            and len(self.tool_calls) < 2
        ):
            return self
        for fields, role in ((_ASSISTANT_ONLY, "assistant"), (_TOOL_ONLY, "tool")):
            for field in fields:
                value = getattr(self, field)
                if self.role != role and value is not None and value is not False and value != []:
                    raise ValueError(f"{field} is only allowed on {role} messages, not {self.role}")
        if self.role == "tool" and self.tool_call_id is None and self.name is None:
            raise ValueError("a tool message needs tool_call_id or name to pair it with its call")
        ids = [call.id for call in self.tool_calls if call.id is not None]
        if len(ids) != len(set(ids)):
            raise ValueError("tool_calls: ids must be unique within a message")
        return self

    def text(self, sep: str = "\n") -> str:
        """The visible text parts joined (reasoning and refusal excluded)."""
        return sep.join(part.text for part in self.content if isinstance(part, TextPart))

    def canonical(self) -> dict[str, Any]:
        """What identifies this message for exact dedup: provider call ids and reasoning
        signatures are left out, arguments compared as parsed JSON."""
        view: dict[str, Any] = {"role": self.role, "content": [p.canonical() for p in self.content]}
        if self.name is not None:
            view["name"] = self.name
        if self.tool_calls:
            view["tool_calls"] = [[c.name, c.parse_arguments()] for c in self.tool_calls]
        if self.reasoning:
            view["reasoning"] = [b.text.strip() for b in self.reasoning if b.text.strip()]
        if self.refusal is not None:
            view["refusal"] = self.refusal.strip()
        if self.is_error:
            view["is_error"] = True
        return view


class RequestParams(BaseModel):
    """Sampling parameters of the request. Open: provider-specific ones (Anthropic `thinking`,
    Gemini `safetySettings`, ...) are kept as extra keys. Ingest maps max_completion_tokens /
    maxOutputTokens onto `max_tokens` and `stopSequences` onto `stop`."""

    model_config = ConfigDict(extra="allow")

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    n: int | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    response_format: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    stream: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, value: Any) -> Any:
        # An explicit null means "not set": dropping it keeps (de)serialisation exact.
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if v is not None}
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class Usage(ChatModel):
    """Token counts with OpenAI semantics: `input_tokens` includes cached ones (Anthropic's
    cache reads/writes are added in), `output_tokens` includes reasoning ones (Gemini's
    thoughtsTokenCount is added in)."""

    input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)
    cached_input_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)


class ProviderError(ChatModel):
    """Summary of a failed upstream call's error body."""

    status_code: int | None = None
    type: str | None = None
    code: str | None = None
    message: str = ""


class ResponseMeta(ChatModel):
    """What the upstream said about one choice of its answer."""

    provider: Provider
    model_requested: str | None = None
    model: str | None = None
    response_id: str | None = None
    # Index of the choice this sample holds (n>1 gives one sample per choice).
    choice_index: int = Field(default=0, ge=0)
    finish_reason: FinishReason | None = None
    finish_reason_raw: str | int | None = None
    # Of the whole call: sibling choices share it.
    usage: Usage | None = None
    latency_ms: float | None = Field(default=None, ge=0)
    time_to_first_token_ms: float | None = Field(default=None, ge=0)
    status: Literal["ok", "error"] = "ok"
    error: ProviderError | None = None

    @model_validator(mode="after")
    def _check_status(self) -> Self:
        if self.status == "error" and self.error is None:
            raise ValueError("error: a failed call (status 'error') needs the error summary")
        if self.status == "ok" and self.error is not None:
            raise ValueError("error: only a failed call (status 'error') carries an error")
        if self.finish_reason is None:
            self.finish_reason = (
                "error"
                if self.status == "error"
                else normalize_finish_reason(self.finish_reason_raw)
            )
        return self


class Sample(ChatModel):
    schema_version: int = SCHEMA_VERSION
    # Empty means "derive it": from source_ref when given, else from the content.
    id: str = ""
    tenant: TenantId
    source: Source
    # gateway: request id; upload: "<file id>:<line>"; otlp: "<trace id>/<span id>" (hex).
    source_ref: str | None = None
    created_at: AwareDatetime
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] = Field(default_factory=list)
    params: RequestParams = Field(default_factory=RequestParams)
    response: ResponseMeta | None = None
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, MetadataValue] = Field(default_factory=dict)

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {value} is not supported (this code reads {SCHEMA_VERSION})"
            )
        return value

    @field_validator("created_at")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        return value.astimezone(UTC)

    @field_validator("metadata", mode="before")
    @classmethod
    def _scalar_metadata(cls, value: Any) -> Any:
        # One clear error instead of one per member of the value union. The exact-type test
        # settles nearly every value at C speed; subclasses (an IntEnum) take the loop.
        if isinstance(value, dict):
            if _SCALAR_TYPES.issuperset(map(type, value.values())):
                return value
            for key, item in value.items():
                if item is not None and not isinstance(item, str | int | float | bool):
                    kind = type(item).__name__
                    raise ValueError(
                        f"{key!r} must be a string, number, boolean or null, not {kind}"
                    )
        return value

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, value: list[ToolDef]) -> list[ToolDef]:
        names = [tool.name for tool in value]
        if len(set(names)) == len(names):
            return value
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"duplicate tool names: {', '.join(dupes)}")
        return value

    @model_validator(mode="after")
    def _derive_id(self) -> Self:
        if not self.id:
            choice = self.response.choice_index if self.response else 0
            ref = self.source_ref or f"content:{self.content_fingerprint()}"
            self.id = derive_sample_id(self.tenant, self.source, ref, choice)
        return self

    def completion(self) -> Message | None:
        """The final assistant message: what the model answered. None for a failed call or a
        conversation that does not end with the assistant."""
        last = self.messages[-1]
        return last if last.role == "assistant" else None

    def prompt_messages(self) -> list[Message]:
        """Everything before the final assistant turn (all messages when there is none)."""
        return self.messages[:-1] if self.completion() is not None else list(self.messages)

    def content_fingerprint(self) -> str:
        """sha256 of the normalised messages and tools, for exact dedup: ids, times, params and
        provider call ids do not count."""
        tools = [[t.name, t.description, t.parameters] for t in self.tools]
        return fingerprint([[m.canonical() for m in self.messages], tools])

    def prompt_fingerprint(self) -> str:
        """content_fingerprint of the prompt only: finds one prompt in both train and eval."""
        tools = [[t.name, t.description, t.parameters] for t in self.tools]
        return fingerprint([[m.canonical() for m in self.prompt_messages()], tools])

    def to_json_bytes(self) -> bytes:
        """Compact JSON (nulls and empty per-message defaults left out) for from_json_bytes."""
        data = self.model_dump(mode="python", exclude_none=True)
        for message in data["messages"]:
            for key in ("tool_calls", "reasoning"):
                if not message[key]:
                    del message[key]
            if not message["is_error"]:
                del message["is_error"]
        return orjson.dumps(data)

    @classmethod
    def from_json_bytes(cls, data: bytes | str) -> Sample:
        return cls.model_validate(orjson.loads(data))


def error_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a path: ("messages", 0, "tool_calls", 1, "arguments") ->
    "messages[0].tool_calls[1].arguments". The union tag after content[i] is left out."""
    path = ""
    for i, item in enumerate(loc):
        if isinstance(item, int):
            path += f"[{item}]"
        elif (
            i >= 2
            and loc[i - 2] == "content"
            and isinstance(loc[i - 1], int)
            and item in PART_TYPES
        ):
            continue
        else:
            path += f".{item}" if path else item
    return path


def describe_errors(exc: ValidationError) -> list[str]:
    """One "path: message" line per error, for a 422 body or a log line."""
    return [f"{error_path(err['loc'])}: {err['msg']}" for err in exc.errors()]
