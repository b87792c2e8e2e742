"""The chat-completions request as the CPU engine reads it: the fields it honours, those it
refuses by name (a greedy decoder cannot sample), and OpenAI's error shape."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class EngineError(Exception):
    """An OpenAI-shaped error: status, message, the field it is about."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


# --- requests ------------------------------------------------------------------------------------


class ChatRequest(BaseModel):
    """The chat-completions fields this engine honours; any other field is refused by name."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: Any = None  # read by structured.schema_of, which names what is wrong
    seed: int | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None


# Accepted and harmless: they change nothing a greedy decoder would produce.
_NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "parallel_tool_calls": None}


def parse_request(body: Any) -> ChatRequest:
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise EngineError(400, f"{param}: {first['msg']}", param) from None
    for name, value in (request.model_extra or {}).items():
        if name in _NEUTRAL and value in (_NEUTRAL[name], None):
            continue
        raise EngineError(400, f"{name}: not supported by this CPU engine", name)
    if request.temperature not in (None, 0):
        raise EngineError(
            400,
            "temperature: this CPU engine decodes greedily; send 0 or leave it out "
            "(vLLM on GPU samples)",
            "temperature",
        )
    if request.top_p not in (None, 1):
        raise EngineError(400, "top_p: this CPU engine decodes greedily; send 1", "top_p")
    if request.n not in (None, 1):
        raise EngineError(400, "n: this engine answers one choice a request", "n")
    return request


def plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with text-part lists joined into strings (what a chat template renders)."""
    out = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise EngineError(
                        400, f"messages.{index}.content: {kind!r} parts are not supported",
                        f"messages.{index}.content",
                    )  # fmt: skip
                texts.append(str(part.get("text", "")))
            message = {**message, "content": "".join(texts)}
        out.append(message)
    return out
