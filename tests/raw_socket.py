"""HTTP/1.1 on a socket of the test's own, for requests a client library will not send: a body
declared and never finished, a chunked body cut off where the test chooses."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable
from typing import Any


def raw_post(
    host: str, port: int, path: str, headers: dict[str, str], chunks: Iterable[bytes]
) -> bytes:
    """POST `chunks` after the head (`connection: close`) and return all that comes back.

    The head goes out with the first chunk in one write: a server that answers from the head
    alone and closes must not find that chunk still unread, or the kernel resets the connection
    under its answer."""
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    start = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nconnection: close\r\n{head}\r\n"
    pieces = iter(chunks)
    with socket.create_connection((host, port), timeout=15) as sock:
        sock.sendall(start.encode() + next(pieces, b""))
        for chunk in pieces:
            sock.sendall(chunk)
        return sock.makefile("rb").read()


def chunked(chunks: Iterable[bytes], *, end: bool = True) -> Iterable[bytes]:
    """`chunks` framed for `transfer-encoding: chunked`; without `end`, never finished."""
    for chunk in chunks:
        yield b"%x\r\n%s\r\n" % (len(chunk), chunk)
    if end:
        yield b"0\r\n\r\n"


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def json_of(answer: bytes) -> Any:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])
