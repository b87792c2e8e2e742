"""A local stand-in for OpenAI, Anthropic and Gemini that answers with their recorded bytes.

Responses come from the real recordings in ../shared/fixtures (chat/derived/*.pairs.json), sent
with their recorded status and content type, SSE included, so the official SDKs parse them as
they would the provider's. The fake checks the provider key the gateway must add, and keeps
every request it received for assertions.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from shared.settings import Settings
from tests.fakes.serving import ServedInThread
from tests.plugins.infra import free_port, settings_env

UPSTREAM_KEYS = {
    "openai": "sk-upstream-openai-0123456789",
    "anthropic": "sk-ant-upstream-0123456789",
    "gemini": "AIzaUpstreamGemini0123456789",
}


# Answers to calls no recording among the fixtures covers (the Responses API, and what the
# gateway relays without capturing), as the providers' API references document them.
DOCUMENTED_ANSWERS: dict[str, dict[str, Any]] = {
    "/v1/embeddings": {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.0023064255, -0.009327292]}],
        "model": "text-embedding-3-small",
        "usage": {"prompt_tokens": 8, "total_tokens": 8},
    },
    "/v1/responses": {
        "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
        "object": "response",
        "created_at": 1741476542,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": "gpt-4.1-2025-04-14",
        "output": [
            {
                "type": "message",
                "id": "msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {
                        "type": "output_text",
                        "text": "In a peaceful grove beneath a silver moon...",
                        "annotations": [],
                    }
                ],
            }
        ],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": 36,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 87,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 123,
        },
        "user": None,
        "metadata": {},
    },
    "/v1/completions": {
        "id": "cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7",
        "object": "text_completion",
        "created": 1589478378,
        "model": "gpt-3.5-turbo-instruct",
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [
            {
                "text": "\n\nThis is indeed a test",
                "index": 0,
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
    },
    "/v1/messages/count_tokens": {"input_tokens": 2095},
}
_CATEGORIES = ("harassment", "hate", "illicit", "self-harm", "sexual", "violence")
MODERATION = {
    "id": "modr-0d9740456c391e43c445bf0f010940c7",
    "model": "omni-moderation-latest",
    "results": [
        {
            "flagged": False,
            "categories": dict.fromkeys(_CATEGORIES, False),
            "category_scores": dict.fromkeys(_CATEGORIES, 0.0001),
            "category_applied_input_types": {name: ["text"] for name in _CATEGORIES},
        }
    ],
}
INPUT_ITEMS = {
    "object": "list",
    "data": [
        {
            "id": "msg_abc123",
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Tell me a three sentence bedtime story."}],
        }
    ],
    "first_id": "msg_abc123",
    "last_id": "msg_abc123",
    "has_more": False,
}
GEMINI_DOCUMENTED_ANSWERS: dict[str, dict[str, Any]] = {
    "countTokens": {
        "totalTokens": 31,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 31}],
    },
    "embedContent": {"embedding": {"values": [0.013168523, -0.008711934, -0.046782676]}},
    "batchEmbedContents": {"embeddings": [{"values": [0.013168523, -0.008711934]}]},
}
# A Responses stream as OpenAI sends it: typed events, each with its sequence number.
RESPONSES_STREAM: list[dict[str, Any]] = [
    {"type": "response.created", "sequence_number": 0,
     "response": DOCUMENTED_ANSWERS["/v1/responses"] | {"status": "in_progress", "output": []}},
    {"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1",
     "output_index": 0, "content_index": 0, "delta": "In a peaceful grove"},
    {"type": "response.output_text.delta", "sequence_number": 2, "item_id": "msg_1",
     "output_index": 0, "content_index": 0, "delta": " beneath a silver moon..."},
    {"type": "response.completed", "sequence_number": 3,
     "response": DOCUMENTED_ANSWERS["/v1/responses"]},
]  # fmt: skip


ENGINE_ANSWER = "Ticket routed to billing."


def _engine_completion(model: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": ENGINE_ANSWER}
    return {
        "id": "chatcmpl-engine-1", "object": "chat.completion", "created": 1767225600,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
    }  # fmt: skip


def _engine_stream(model: str) -> bytes:
    """OpenAI's chat SSE: `data:` lines of chunks (the last with usage), then `[DONE]`."""
    base = {"id": "chatcmpl-engine-2", "object": "chat.completion.chunk",
            "created": 1767225600, "model": model}  # fmt: skip
    deltas = [{"role": "assistant", "content": ""}]
    words = ENGINE_ANSWER.split(" ")
    deltas += [{"content": word + " "} for word in words[:-1]] + [{"content": words[-1]}]
    chunks = [
        base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        for delta in deltas
    ]
    chunks.append(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append(
        base | {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5,
                                         "total_tokens": 14}}
    )  # fmt: skip
    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(
        f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events
    )


def fixtures_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "shared" / "fixtures"


def recorded(name: str, index: int = 0) -> dict[str, Any]:
    pairs = json.loads((fixtures_dir() / "chat" / "derived" / f"{name}.pairs.json").read_text())
    return pairs[index]


async def _json(request: Request) -> dict[str, Any] | None:
    """The body as the provider would read it; None (-> 400, as the providers answer) if unreadable."""
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes = b""  # the body's bytes as they arrived
    target: bytes = b""  # the request line's target as it arrived (raw path and query)


@dataclass
class FakeUpstream:
    received: list[Received] = field(default_factory=list)
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _reply(self, exchange: dict[str, Any], request: Request) -> Response:
        response = exchange["response"]
        body = response["body"]
        content = (body if isinstance(body, str) else json.dumps(body)).encode()
        media_type = (response["content_type"] or "application/json").split(";")[0]
        headers = {}
        # Recorded gzip bodies go back gzipped, as the provider sent them.
        if response.get("content_encoding_in_cassette") == "gzip" and "gzip" in request.headers.get(
            "accept-encoding", ""
        ):
            content = gzip.compress(content)
            headers["content-encoding"] = "gzip"
        return Response(
            content, status_code=response["status"], media_type=media_type, headers=headers
        )

    async def _record(
        self, request: Request, body: dict[str, Any], *, path: str | None = None
    ) -> None:
        """Keep what arrived (the body parsed and as bytes) for the test's assertions."""
        raw = await request.body()
        query = request.scope["query_string"]
        target = request.scope["raw_path"] + (b"?" + query if query else b"")
        self.received.append(
            Received(path or request.url.path, dict(request.headers), body, raw, target)
        )

    async def _check_key(self, request: Request, api: str) -> Response | None:
        expected = UPSTREAM_KEYS[api]
        presented = {
            "openai": request.headers.get("authorization", "").removeprefix("Bearer "),
            "anthropic": request.headers.get("x-api-key", ""),
            "gemini": request.headers.get("x-goog-api-key", ""),
        }[api]
        if presented != expected:
            return JSONResponse(
                {"error": {"message": "fake upstream: wrong provider key"}}, status_code=401
            )
        return None

    async def openai(self, request: Request) -> Response:
        body = await _json(request)
        if body is None:
            return JSONResponse(
                {"error": {"message": "fake upstream: body is not a JSON object", "code": 400}},
                status_code=400,
            )
        await self._record(request, body)
        if (refused := await self._check_key(request, "openai")) is not None:
            return refused
        return self._reply(
            request=request,
            exchange=recorded(
                "oa03_streaming_parallel_tool_calls_sse"
                if body.get("stream")
                else "oa01_tool_calls_multiturn"
            ),
        )

    async def anthropic(self, request: Request) -> Response:
        body = await _json(request)
        if body is None:
            return JSONResponse(
                {"error": {"message": "fake upstream: body is not a JSON object", "code": 400}},
                status_code=400,
            )
        await self._record(request, body)
        if (refused := await self._check_key(request, "anthropic")) is not None:
            return refused
        return self._reply(
            request=request,
            exchange=recorded(
                "an08_streaming_tool_use_input_json_delta_sse"
                if body.get("stream")
                else "an03_parallel_tool_use_gzip"
            ),
        )

    async def gemini(self, request: Request) -> Response:
        body = await _json(request)
        if body is None:
            return JSONResponse(
                {"error": {"message": "fake upstream: body is not a JSON object", "code": 400}},
                status_code=400,
            )
        query = "?" + request.url.query if request.url.query else ""
        await self._record(request, body, path=request.url.path + query)
        if (refused := await self._check_key(request, "gemini")) is not None:
            return refused
        action = request.path_params["model_action"].rpartition(":")[2]
        if action in GEMINI_DOCUMENTED_ANSWERS:
            return JSONResponse(GEMINI_DOCUMENTED_ANSWERS[action])
        streamed = action == "streamGenerateContent"
        return self._reply(
            request=request,
            exchange=recorded(
                "ge04_genai_inlineData_urlsafe_b64_sse"
                if streamed
                else "ge05_genai_function_call_round_trip"
            ),
        )

    async def documented(self, request: Request) -> Response:
        """Calls no recording covers (Responses, embeddings, token counts): answered in each
        provider's documented shape."""
        body = await _json(request)
        if body is None:
            return JSONResponse({"error": {"message": "fake upstream: not a JSON object"}}, 400)
        path = request.url.path
        api = "anthropic" if path.startswith("/v1/messages") else "openai"
        await self._record(request, body)
        if (refused := await self._check_key(request, api)) is not None:
            return refused
        if path == "/v1/responses" and body.get("stream"):
            return Response(_sse(RESPONSES_STREAM), media_type="text/event-stream")
        return JSONResponse(DOCUMENTED_ANSWERS[path])

    async def stored_response(self, request: Request) -> Response:
        """The Responses API's calls about a stored response (no model in them)."""
        body = await _json(request) if request.method == "POST" else {}
        await self._record(request, body or {})
        if (refused := await self._check_key(request, "openai")) is not None:
            return refused
        response_id = request.path_params["response_id"]
        if request.url.path.endswith("/input_items"):
            return JSONResponse(INPUT_ITEMS)
        if request.method == "DELETE":
            return JSONResponse({"id": response_id, "object": "response", "deleted": True})
        stored = DOCUMENTED_ANSWERS["/v1/responses"] | {"id": response_id}
        if request.url.path.endswith("/cancel"):
            stored |= {"status": "cancelled", "background": True}
        return JSONResponse(stored)

    async def moderations(self, request: Request) -> Response:
        body = await _json(request)
        if body is None:
            return JSONResponse({"error": {"message": "fake upstream: not a JSON object"}}, 400)
        await self._record(request, body)
        if (refused := await self._check_key(request, "openai")) is not None:
            return refused
        return JSONResponse(MODERATION)

    async def deployed(self, request: Request) -> Response:
        """A model we deployed ourselves (an engine: vLLM, `transformers serve`): OpenAI's chat
        wire format, no provider key, answering as the model it was asked for (an engine serves
        the deployment's name itself), streamed when asked."""
        body = await _json(request) or {}
        await self._record(request, body)
        model = str(body.get("model", ""))
        if body.get("stream"):
            return Response(_engine_stream(model), media_type="text/event-stream")
        return JSONResponse(_engine_completion(model))

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/deployed/v1/chat/completions", self.deployed, methods=["POST"]),
                Route("/v1/chat/completions", self.openai, methods=["POST"]),
                Route("/v1/messages", self.anthropic, methods=["POST"]),
                *(Route(path, self.documented, methods=["POST"]) for path in DOCUMENTED_ANSWERS),
                Route("/v1beta/models/{model_action}", self.gemini, methods=["POST"]),
                # google-genai's default API version; the same methods, the same answers.
                Route("/v1/models/{model_action}", self.gemini, methods=["POST"]),
                Route(
                    "/v1/responses/{response_id}", self.stored_response, methods=["GET", "DELETE"]
                ),
                Route("/v1/responses/{response_id}/input_items", self.stored_response),
                Route("/v1/responses/{response_id}/cancel", self.stored_response, methods=["POST"]),
                Route("/v1/moderations", self.moderations, methods=["POST"]),
            ]
        )


class RunningUpstream:
    """The fake served by uvicorn in a background thread."""

    def __init__(self) -> None:
        self.fake = FakeUpstream(port=free_port())
        self.served = ServedInThread(self.fake.app(), self.fake.port, "fake upstream")

    def __enter__(self) -> FakeUpstream:
        self.served.start()
        return self.fake

    def __exit__(self, *_: object) -> None:
        self.served.stop()


def upstreams_yaml(base_url: str) -> str:
    return f"""upstreams:
  - {{name: openai, api: openai, base_url: "{base_url}", api_key_env: FAKE_OPENAI_KEY, models: ["gpt-*", "text-embedding-*"]}}
  - {{name: anthropic, api: anthropic, base_url: "{base_url}", api_key_env: FAKE_ANTHROPIC_KEY, models: ["claude-*"]}}
  - {{name: gemini, api: gemini, base_url: "{base_url}", api_key_env: FAKE_GEMINI_KEY, models: ["gemini-*"]}}
"""


def gateway_env(settings: Settings, upstream: FakeUpstream, directory: Path) -> dict[str, str]:
    """The environment of an ingest process on `settings` that routes every model to the fake
    (its upstreams file is written to `directory`), with the provider keys the fake expects."""
    upstreams = directory / "upstreams.yaml"
    upstreams.write_text(upstreams_yaml(upstream.base_url))
    env = settings_env(settings) | upstream_key_env()
    return env | {"TUNELOOP_INGEST_UPSTREAMS_FILE": str(upstreams)}


def upstream_key_env() -> dict[str, str]:
    return {
        "FAKE_OPENAI_KEY": UPSTREAM_KEYS["openai"],
        "FAKE_ANTHROPIC_KEY": UPSTREAM_KEYS["anthropic"],
        "FAKE_GEMINI_KEY": UPSTREAM_KEYS["gemini"],
    }
