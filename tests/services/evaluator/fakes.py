"""Stand-ins for what the hoster provides while the real one is being built: its three internal
eval-engine routes and what serves a served name, exactly as the contract (/work notes loop.md) states them, and an engine
speaking OpenAI chat completions whose answers are as good as each model's `skill`.

The engine reads the ticket number from the prompt ("Ticket N: ...") and answers the reference
for item N when N % 16 < skill * 16 (or when `right(model, N)`, if a test scripts that), else a
sentence that is not JSON (scores 0). Everything received is kept for the tests' assertions.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.plugins.infra import free_port
from tests.services.evaluator.samples import reference

SERVICE_TOKEN = "tuneloop-dev-service"
_TICKET = re.compile(r"Ticket (\d+):")


@dataclass
class HosterCall:
    method: str
    path: str
    body: dict[str, Any] | None
    authorization: str


@dataclass
class FakeHoster:
    port: int = field(default_factory=free_port)
    # model name -> share of items answered right
    skill: dict[str, float] = field(default_factory=dict)
    # (model, ticket number) -> answered right; when set, it decides instead of `skill`
    right: Callable[[str, int], bool] | None = None
    # steps whose first load answers 503 (the engine is still loading)
    loading_once: set[int] = field(default_factory=set)
    calls: list[HosterCall] = field(default_factory=list)
    completions: list[dict[str, Any]] = field(default_factory=list)
    engines: dict[str, str] = field(default_factory=dict)  # job id -> engine id
    # (tenant, served name) -> its primary, as GET /internal/tenants/{t}/served_names/{n}
    # answers it; a name not here has none
    serving: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    in_flight: int = 0
    most_in_flight: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def calls_to(self, method: str, prefix: str) -> list[HosterCall]:
        return [c for c in self.calls if c.method == method and c.path.startswith(prefix)]

    async def _record(self, request: Request) -> tuple[HosterCall, Response | None]:
        body = await request.json() if request.method == "POST" else None
        call = HosterCall(
            request.method, request.url.path, body, request.headers.get("authorization", "")
        )
        self.calls.append(call)
        if call.authorization != f"Bearer {SERVICE_TOKEN}":
            return call, JSONResponse({"detail": "service token is not valid"}, status_code=401)
        return call, None

    async def create_engine(self, request: Request) -> Response:
        call, refused = await self._record(request)
        if refused is not None:
            return refused
        assert call.body is not None
        missing = [k for k in ("tenant", "job_id", "base_model") if not call.body.get(k)]
        if missing:
            return JSONResponse({"detail": f"{missing[0]}: field required"}, status_code=422)
        engine_id = self.engines.setdefault(call.body["job_id"], f"eng-{uuid.uuid4().hex[:8]}")
        return JSONResponse(
            {
                "engine_id": engine_id,
                "base_url": f"{self.url}/engines/{engine_id}/v1",
                "base_model_name": "base",
            }
        )

    async def load_checkpoint(self, request: Request) -> Response:
        call, refused = await self._record(request)
        if refused is not None:
            return refused
        if request.path_params["engine_id"] not in self.engines.values():
            return JSONResponse({"detail": "engine_id: no such engine"}, status_code=404)
        assert call.body is not None
        step = int(call.body["step"])
        if step in self.loading_once:
            self.loading_once.discard(step)
            return JSONResponse({"detail": "engine is loading"}, status_code=503)
        if call.body.get("version_id"):  # a registered version: named for it, not a step
            return JSONResponse({"model": f"ver-{call.body['version_id']}"})
        return JSONResponse({"model": f"ckpt-{step}"})

    async def delete_engine(self, request: Request) -> Response:
        _, refused = await self._record(request)
        if refused is not None:
            return refused
        engine_id = request.path_params["engine_id"]
        if engine_id not in self.engines.values():
            return JSONResponse({"detail": "engine_id: no such engine"}, status_code=404)
        self.engines = {j: e for j, e in self.engines.items() if e != engine_id}
        return Response(status_code=204)

    async def served_name(self, request: Request) -> Response:
        _, refused = await self._record(request)
        if refused is not None:
            return refused
        tenant, name = request.path_params["tenant"], request.path_params["name"]
        return JSONResponse({"name": name, "primary": self.serving.get((tenant, name))})

    def _answer(self, model: str, prompt: str) -> str:
        found = _TICKET.search(prompt)
        n = int(found.group(1)) if found else 0
        if self.right is not None:
            return reference(n) if self.right(model, n) else "I am not sure."
        if n % 16 < self.skill.get(model, 0.0) * 16:
            return reference(n)
        return "I am not sure which team should take this ticket."

    async def chat_completions(self, request: Request) -> Response:
        body = await request.json()
        self.completions.append(body)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)  # let concurrent requests overlap
        finally:
            self.in_flight -= 1
        prompt = " ".join(str(m.get("content", "")) for m in body["messages"])
        text = self._answer(body["model"], prompt)
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32},
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/internal/engines", self.create_engine, methods=["POST"]),
                Route(
                    "/internal/engines/{engine_id}/checkpoints",
                    self.load_checkpoint,
                    methods=["POST"],
                ),
                Route("/internal/engines/{engine_id}", self.delete_engine, methods=["DELETE"]),
                Route(
                    "/internal/tenants/{tenant}/served_names/{name}",
                    self.served_name,
                    methods=["GET"],
                ),
                Route(
                    "/engines/{engine_id}/v1/chat/completions",
                    self.chat_completions,
                    methods=["POST"],
                ),
            ]
        )


class RunningHoster:
    """The fake served by uvicorn in a background thread."""

    def __init__(self, fake: FakeHoster) -> None:
        self.fake = fake
        config = uvicorn.Config(
            fake.app(), host="127.0.0.1", port=fake.port, log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def __enter__(self) -> FakeHoster:
        self.thread.start()
        for _ in range(250):
            if self.server.started:
                return self.fake
            threading.Event().wait(0.02)
        raise RuntimeError("fake hoster did not start")

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(5)
