"""A local stand-in for OpenAI, Anthropic and Gemini that answers with their recorded bytes.

Responses come from the real recordings in ../shared/fixtures (chat/derived/*.pairs.json), sent
with their recorded status and content type, SSE included, so the official SDKs parse them as
they would the provider's. The fake checks the provider key the gateway must add, and keeps
every request it received for assertions.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.plugins.infra import free_port

UPSTREAM_KEYS = {
    "openai": "sk-upstream-openai-0123456789",
    "anthropic": "sk-ant-upstream-0123456789",
    "gemini": "AIzaUpstreamGemini0123456789",
}


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
        self.received.append(Received(request.url.path, dict(request.headers), body))
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
        self.received.append(Received(request.url.path, dict(request.headers), body))
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
        self.received.append(
            Received(
                request.url.path + ("?" + request.url.query if request.url.query else ""),
                dict(request.headers),
                body,
            )
        )
        if (refused := await self._check_key(request, "gemini")) is not None:
            return refused
        streamed = request.path_params["model_action"].endswith(":streamGenerateContent")
        return self._reply(
            request=request,
            exchange=recorded(
                "ge04_genai_inlineData_urlsafe_b64_sse"
                if streamed
                else "ge05_genai_function_call_round_trip"
            ),
        )

    async def deployed(self, request: Request) -> Response:
        """A model we deployed ourselves: OpenAI-compatible, no provider key."""
        body = await _json(request)
        self.received.append(Received(request.url.path, dict(request.headers), body or {}))
        return self._reply(request=request, exchange=recorded("oa01_tool_calls_multiturn"))

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/deployed/v1/chat/completions", self.deployed, methods=["POST"]),
                Route("/v1/chat/completions", self.openai, methods=["POST"]),
                Route("/v1/messages", self.anthropic, methods=["POST"]),
                Route("/v1beta/models/{model_action}", self.gemini, methods=["POST"]),
            ]
        )


class RunningUpstream:
    """The fake served by uvicorn in a background thread."""

    def __init__(self) -> None:
        self.fake = FakeUpstream(port=free_port())
        config = uvicorn.Config(
            self.fake.app(),
            host="127.0.0.1",
            port=self.fake.port,
            log_level="warning",
            lifespan="off",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def __enter__(self) -> FakeUpstream:
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return self.fake
            threading.Event().wait(0.02)
        raise RuntimeError("fake upstream did not start")

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(5)


def upstreams_yaml(base_url: str) -> str:
    return f"""upstreams:
  - {{name: openai, api: openai, base_url: "{base_url}", api_key_env: FAKE_OPENAI_KEY, models: ["gpt-*"]}}
  - {{name: anthropic, api: anthropic, base_url: "{base_url}", api_key_env: FAKE_ANTHROPIC_KEY, models: ["claude-*"]}}
  - {{name: gemini, api: gemini, base_url: "{base_url}", api_key_env: FAKE_GEMINI_KEY, models: ["gemini-*"]}}
"""


def upstream_key_env() -> dict[str, str]:
    return {
        "FAKE_OPENAI_KEY": UPSTREAM_KEYS["openai"],
        "FAKE_ANTHROPIC_KEY": UPSTREAM_KEYS["anthropic"],
        "FAKE_GEMINI_KEY": UPSTREAM_KEYS["gemini"],
    }
