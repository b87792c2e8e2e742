"""`tuneloop teacher`: a stand-in for a frontier model that answers the demo task (support tickets
to JSON) correctly and deterministically, in OpenAI's chat-completions wire format.

It reads the fields off the ticket by the generator's own templates, so its answers are the
ground truth; it is labelled a stand-in (`system_fingerprint`, the `x-tuneloop-stand-in` header,
`owned_by`) so nobody mistakes it for a real model. A request that is not a demo ticket gets a
400 in OpenAI's error shape naming why: a made-up fallback answer would slip into captured
traffic and then into training data.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from shared.dev.demo.tickets import (
    CATEGORY_TEMPLATES,
    PRIORITY_PHRASES,
    PRODUCTS,
    REFUND_PHRASES,
    SENTIMENT_PHRASES,
    TEACHER_MODEL,
    TicketFields,
    answer_json,
)

MODELS: Final = (TEACHER_MODEL,)
FINGERPRINT: Final = "tuneloop-teacher-stand-in"
STAND_IN_HEADER: Final = {"x-tuneloop-stand-in": "rule-based stand-in for a frontier model"}
_CREATED: Final = 1_767_225_600  # 2026-01-01, fixed: the model list is deterministic too
_NAME: Final = re.compile(r"^From: (.+)$", re.MULTILINE)
_ORDER: Final = re.compile(r"\bORD-\d{6}\b")
_PLACEHOLDER: Final = re.compile(r"\\\{(product|order)\\\}")


class NotATicket(ValueError):
    """The request is not a demo ticket; the message says what is missing."""


def _template_pattern(body: str) -> re.Pattern[str]:
    # The body's fixed words must all be there; the product and order phrase are captured apart.
    return re.compile(_PLACEHOLDER.sub(".*?", re.escape(body)))


_CATEGORY_PATTERNS: Final = [
    (category, _template_pattern(body))
    for category, templates in CATEGORY_TEMPLATES.items()
    for _subject, body in templates
]


def _one(text: str, phrases: dict[Any, tuple[str, ...]], field: str) -> Any:
    found = {value for value, options in phrases.items() for p in options if p and p in text}
    if len(found) != 1:
        raise NotATicket(f"{field}: expected one of the demo's phrases, found {len(found)}")
    return found.pop()


def extract(text: str) -> TicketFields:
    """The fields of a demo ticket, read by rules; NotATicket when text is not one."""
    name = _NAME.search(text)
    if name is None or not text.startswith("Subject: "):
        raise NotATicket("a demo ticket starts with 'Subject:' and has a 'From:' line")
    categories = {c for c, pattern in _CATEGORY_PATTERNS if pattern.search(text)}
    products = [p for p in PRODUCTS if p in text]
    if len(categories) != 1 or len(products) != 1:
        raise NotATicket("category/product: the body matches none of the demo's templates")
    refund = any(p in text for p in REFUND_PHRASES[True])
    order = _ORDER.search(text)
    return TicketFields(
        category=categories.pop(),
        priority=_one(text, PRIORITY_PHRASES, "priority"),
        product=products[0],
        order_id=order.group() if order else None,
        customer_name=name.group(1).strip(),
        sentiment=_one(text, SENTIMENT_PHRASES, "sentiment"),
        refund_requested=refund,
    )


def _ticket_text(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise NotATicket("messages: a non-empty list is required")
    last = messages[-1]
    content = last.get("content") if isinstance(last, dict) else None
    if isinstance(content, list):  # content parts: the text ones, joined
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(last, dict) or last.get("role") != "user" or not isinstance(content, str):
        raise NotATicket("messages: the last message must be the user's ticket text")
    return content


def _error(status: int, message: str, param: str | None, code: str) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return JSONResponse({"error": error}, status_code=status, headers=STAND_IN_HEADER)


def _usage(body: dict[str, Any], content: str, n: int) -> dict[str, int]:
    # No tokenizer here: OpenAI's rule of thumb of 4 characters a token, stated in the docs.
    prompt = sum(len(json.dumps(m.get("content"))) for m in body["messages"] if isinstance(m, dict))
    prompt_tokens, completion_tokens = (prompt + 3) // 4, n * ((len(content) + 3) // 4)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _completion(body: dict[str, Any], content: str, n: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body["model"],
        "system_fingerprint": FINGERPRINT,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
            for i in range(n)
        ],
        "usage": _usage(body, content, n),
    }


def _chunks(body: dict[str, Any], content: str, n: int) -> Iterator[str]:
    """The SSE stream of one answer: a role chunk, the content in pieces, a finish chunk per
    choice, a usage chunk when stream_options asks for it, then [DONE]."""
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body["model"],
        "system_fingerprint": FINGERPRINT,
    }
    options = body.get("stream_options")
    with_usage = isinstance(options, dict) and options.get("include_usage") is True
    pieces = [content[i : i + 16] for i in range(0, len(content), 16)]
    deltas: list[tuple[dict[str, Any], str | None]] = [
        ({"role": "assistant", "content": ""}, None),
        *(({"content": piece}, None) for piece in pieces),
        ({}, "stop"),
    ]
    for i in range(n):
        for delta, finish in deltas:
            choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
            chunk = base | {"choices": [choice]} | ({"usage": None} if with_usage else {})
            yield f"data: {json.dumps(chunk)}\n\n"
    if with_usage:
        yield f"data: {json.dumps(base | {'choices': [], 'usage': _usage(body, content, n)})}\n\n"
    yield "data: [DONE]\n\n"


def create_app() -> FastAPI:
    app = FastAPI(title="tuneloop teacher (a stand-in for a frontier model)")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> JSONResponse:
        data = [
            {"id": m, "object": "model", "created": _CREATED, "owned_by": FINGERPRINT}
            for m in MODELS
        ]
        return JSONResponse({"object": "list", "data": data}, headers=STAND_IN_HEADER)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "The request body is not valid JSON.", None, "invalid_json")
        if not isinstance(body, dict):
            return _error(400, "The request body must be a JSON object.", None, "invalid_json")
        if body.get("model") not in MODELS:
            served = ", ".join(MODELS)
            message = (
                f"The model {body.get('model')!r} does not exist; the teacher serves {served}."
            )
            return _error(404, message, "model", "model_not_found")
        n = body.get("n") or 1
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 8:
            return _error(400, "n must be an integer from 1 to 8.", "n", "invalid_value")
        try:
            content = answer_json(extract(_ticket_text(body)))
        except NotATicket as exc:
            return _error(400, f"Not a demo ticket: {exc}.", "messages", "not_a_demo_ticket")
        if body.get("stream") is True:
            return StreamingResponse(
                _chunks(body, content, n), media_type="text/event-stream", headers=STAND_IN_HEADER
            )
        return JSONResponse(_completion(body, content, n), headers=STAND_IN_HEADER)

    return app


def serve(host: str, port: int) -> None:
    """Run the teacher until interrupted."""
    import uvicorn

    uvicorn.run(create_app(), host=host, port=port, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    import argparse

    from shared.settings import get_settings

    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m shared.dev.demo.teacher", description=__doc__)
    parser.add_argument("--host", default=settings.app.bind_host)
    parser.add_argument("--port", type=int, default=settings.services.teacher_port)
    args = parser.parse_args(argv)
    serve(args.host, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
