"""A webhook receiver, as a tenant would run one (or as Slack's incoming webhooks answer): a
Starlette app in a thread that keeps every request and answers each path from a script
(statuses in order, then 200), so tests see retries, Retry-After and final refusals happen.

`verify` checks a Standard Webhooks signature from the spec's own words (standardwebhooks.com):
an implementation independent of services/scheduler/notifications/signing.py.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.serving import ServedInThread
from tests.plugins.infra import free_port


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time()
    answered: int

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    url: str
    # path -> statuses still to answer, in order (then 200); a status may carry headers.
    script: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    # path -> seconds to wait before answering (a receiver too slow to answer)
    delays: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, path: str, *statuses: int | tuple[int, dict[str, str]]) -> str:
        """Answer `path` with these statuses first; the URL to give a rule."""
        with self._lock:
            self.script[path] = [s if isinstance(s, tuple) else (s, {}) for s in statuses]
        return self.url + path

    def at(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path]

    def wait_for(self, path: str, count: int, timeout_s: float = 20.0) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while len(got := self.at(path)) < count:
            assert time.monotonic() < deadline, f"{path}: {len(got)} requests of {count}"
            time.sleep(0.05)
        return got

    async def _handle(self, request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        await asyncio.sleep(self.delays.get(path, 0.0))
        with self._lock:
            queue = self.script.get(path, [])
            status, headers = queue.pop(0) if queue else (200, {})
            self.received.append(Received(path, dict(request.headers), body, time.time(), status))
        return Response(status_code=status, headers=headers)


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    port = free_port()
    receiver = Receiver(url=f"http://127.0.0.1:{port}")
    app = Starlette(routes=[Route("/{path:path}", receiver._handle, methods=["POST"])])
    served = ServedInThread(app, port, "webhook receiver")
    served.start()
    try:
        yield receiver
    finally:
        served.stop()


def verify(secret: str, headers: Mapping[str, str], body: bytes, tolerance_s: int = 300) -> None:
    """Raise AssertionError unless the headers sign exactly `body` with `secret`."""
    message_id = headers["webhook-id"]
    timestamp = headers["webhook-timestamp"]
    assert abs(time.time() - int(timestamp)) <= tolerance_s, "timestamp outside the tolerance"
    assert secret.startswith("whsec_")
    key = base64.b64decode(secret[len("whsec_") :])
    content = message_id.encode() + b"." + timestamp.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest())
    offered = [
        part.split(",", 1)[1].encode()
        for part in headers["webhook-signature"].split(" ")
        if part.startswith("v1,")
    ]
    assert any(hmac.compare_digest(expected, sig) for sig in offered), "signature does not match"
