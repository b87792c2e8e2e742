"""A bare HTTP/1.1 server on a socket that keeps every request head exactly as its bytes arrived.

A framework server parses the request line and headers before a test could see them, and an
injected line break shows up there as a header that looks legitimate. This one records the
head's bytes unparsed and answers each request with the same small JSON body, so a test can
assert on the request line the gateway (or its relay) really wrote.
"""

from __future__ import annotations

import socketserver
import threading
from dataclasses import dataclass, field

ANSWER = b'{"object":"model","id":"recorded"}'


@dataclass
class RawRequest:
    head: bytes  # request line and headers, up to the blank line
    body: bytes

    @property
    def request_line(self) -> bytes:
        return self.head.split(b"\r\n", 1)[0]

    @property
    def header_names(self) -> list[bytes]:
        lines = self.head.split(b"\r\n")[1:]
        return [line.split(b":", 1)[0].strip().lower() for line in lines if line]


@dataclass
class RawRecorder:
    host: str
    port: int
    received: list[RawRequest] = field(default_factory=list)
    _server: socketserver.ThreadingTCPServer | None = None

    def __enter__(self) -> RawRecorder:
        recorder = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = self.rfile.readline(65536)
                    if not line:
                        return
                    head += line
                recorder.received.append(RawRequest(head[:-4], self._body(head)))
                self.wfile.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(ANSWER), ANSWER)
                )

            def _body(self, head: bytes) -> bytes:
                fields = dict(
                    (name.strip().lower(), value.strip())
                    for name, _, value in (line.partition(b":") for line in head.split(b"\r\n"))
                )
                if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
                    body = b""
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        body += self.rfile.read(size + 2)[:-2]
                    self.rfile.readline()  # the blank line after the last chunk
                    return body
                return self.rfile.read(int(fields.get(b"content-length", b"0")))

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
