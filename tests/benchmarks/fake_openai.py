"""A minimal, fast OpenAI stand-in for the gateway benchmark: every request gets the same chat
completion. Raw asyncio on uvloop, HTTP/1.1 keep-alive, no framework: the benchmark measures the
gateway, not this. (tests/fakes/upstream.py is the faithful fake the tests use; it is too slow
to sit behind a load test.)

    python -m tests.benchmarks.fake_openai --port 8999
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

import orjson
import uvloop

COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-bench0001",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Paris.", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 27, "completion_tokens": 2, "total_tokens": 29},
        "system_fingerprint": "fp_bench",
    }
)
RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(COMPLETION)).encode() + b"\r\n\r\n" + COMPLETION
)
CLOSING = RESPONSE.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1)


class OneAnswer(asyncio.Protocol):
    """Reads requests (headers + content-length body) and answers each with RESPONSE."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            close = b"\r\nconnection: close" in head
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                line_end = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : line_end if line_end >= 0 else len(head)])
            if len(self.buffer) < end + 4 + length:
                return  # the body is still coming
            self.buffer = self.buffer[end + 4 + length :]
            if close:
                self.transport.write(CLOSING)
                self.transport.close()
                self.transport = None
            else:
                self.transport.write(RESPONSE)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(OneAnswer, host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
