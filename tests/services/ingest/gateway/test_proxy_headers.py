"""What the gateway sends upstream besides the body: the caller's headers minus its credentials
and the connection's own, the provider key in that provider's header, the query minus ?key=."""

from __future__ import annotations

import pytest

from services.ingest.gateway.proxy import (
    Incoming,
    upstream_accept_encoding,
    upstream_headers,
    upstream_target,
)
from services.ingest.gateway.routing import Upstream

CALLER = [
    (b"authorization", b"Bearer tl_caller_key"),
    (b"x-api-key", b"tl_caller_key"),
    (b"cookie", b"session=1"),
    (b"host", b"gateway"),
    (b"content-length", b"2"),
    (b"expect", b"100-continue"),
    (b"connection", b"keep-alive"),
    (b"x-tuneloop-tags", b"a,b"),
    (b"user-agent", b"OpenAI/Python 3.57.0"),
    (b"anthropic-version", b"2023-06-01"),
]


@pytest.mark.parametrize(
    ("api", "header"),
    [
        ("openai", (b"authorization", b"Bearer sk-provider")),
        ("anthropic", (b"x-api-key", b"sk-provider")),
        ("gemini", (b"x-goog-api-key", b"sk-provider")),
    ],
)
def test_the_caller_keeps_its_headers_but_not_its_credentials(
    api: str, header: tuple[bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVIDER_KEY", "sk-provider\n")  # as read from a file: newline stripped
    route = Upstream("p", api, "https://p.example", ("*",), "PROVIDER_KEY").route()
    sent = upstream_headers(Incoming("POST", "/", "", CALLER), route)
    assert sent == [
        (b"user-agent", b"OpenAI/Python 3.57.0"),
        (b"anthropic-version", b"2023-06-01"),
        (b"accept-encoding", b"gzip, deflate"),
        header,
    ]


def test_a_key_with_a_line_break_inside_is_never_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVIDER_KEY", "sk-a\r\nx-injected: 1")
    route = Upstream("p", "openai", "https://p.example", ("*",), "PROVIDER_KEY").route()
    with pytest.raises(ValueError, match="line break"):
        upstream_headers(Incoming("POST", "/", "", []), route)


def test_the_callers_key_in_the_query_stays_behind() -> None:
    def target(query: str) -> str:
        return upstream_target(Incoming("POST", "/m:x", query, []))

    assert target("") == "/m:x"
    assert target("key=tl_secret") == "/m:x"
    assert target("alt=sse&key=tl_secret") == "/m:x?alt=sse"
    assert target("$alt=json;enum-encoding=int&key=k") == "/m:x?$alt=json;enum-encoding=int"


@pytest.mark.parametrize(
    ("accepted", "asked"),
    [
        (None, b"gzip, deflate"),  # no header: anything goes, and the capture reads gzip
        (b"gzip, deflate, br, zstd", b"gzip, deflate"),  # httpx with brotli/zstd installed
        (b"identity", b"identity"),  # a client that cannot decompress gets plain bytes
        (b"br", b"identity"),  # nothing the capture reads: plain bytes rather than brotli
        (b"GZip;q=0.5, br;q=1.0", b"GZip;q=0.5"),
        (b"deflate, gzip;q=0", b"deflate, gzip;q=0"),  # a refusal is passed on too
        (b"*;q=0.3", b"gzip;q=0.3, deflate;q=0.3"),
        (b"", b"identity"),  # an empty header means identity only (RFC 9110 12.5.3)
    ],
)
def test_upstream_is_asked_only_for_encodings_both_the_caller_and_the_capture_read(
    accepted: bytes | None, asked: bytes
) -> None:
    assert upstream_accept_encoding(accepted) == asked
    route = Upstream("p", "openai", "https://p.example", ("*",)).route()
    caller = [] if accepted is None else [(b"accept-encoding", accepted)]
    assert (b"accept-encoding", asked) in upstream_headers(Incoming("POST", "/", "", caller), route)
