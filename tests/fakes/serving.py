"""A fake's ASGI app served by uvicorn in a background thread, for as long as a `with` lasts."""

from __future__ import annotations

import asyncio
import threading

import uvicorn
from starlette.types import ASGIApp


class ServedInThread:
    def __init__(self, app: ASGIApp, port: int, what: str) -> None:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
        self.what = what
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def start(self) -> None:
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return
            threading.Event().wait(0.02)
        raise RuntimeError(f"{self.what} did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(5)
