"""Which request targets the gateway sends on, and in what form (plain function calls)."""

from __future__ import annotations

import pytest

from services.ingest.gateway.targets import BadTarget, checked_path, checked_query


@pytest.mark.parametrize(
    ("raw", "sent"),
    [
        (b"/v1/models/ft:SmolLM2-135M-Instruct:acme:job-1", "/v1/models/ft:SmolLM2-135M-Instruct:acme:job-1"),
        (b"/v1/models/gemini-2.5-flash:generateContent", "/v1/models/gemini-2.5-flash:generateContent"),
        (b"/v1/models/%2A%C2%A4", "/v1/models/%2A%C2%A4"),  # escapes kept exactly as written
        (b"/v1/models/%2f", "/v1/models/%2f"),  # an escaped slash stays escaped
        (b"/v1/models/\xc2\xa4", "/v1/models/%C2%A4"),  # raw non-ASCII bytes are escaped
        (b"/v1/models/..x/.y", "/v1/models/..x/.y"),  # dots inside a name are no dot segment
    ],
)  # fmt: skip
def test_a_path_is_sent_as_written_with_non_ascii_escaped(raw: bytes, sent: str) -> None:
    assert checked_path(raw) == sent


@pytest.mark.parametrize(
    "raw",
    [
        b"/v1/responses/resp_1%0D%0Ax-injected:%20yes",
        b"/v1/responses/resp_1%0a",
        b"/v1/models/%2A%06%C2%A4",
        b"/v1/models/%00",
        b"/v1/models/%7f",
        b"/v1/models/a%20b",
        b"/v1/models/a b",
        b"/v1/models/a\tb",
        b"/v1/models/a\r\nx: y",
        b"/v1/models/../admin",
        b"/v1/models/%2e%2E/admin",
        b"/v1/models/./x",
        b"/v1/models/x/..",
    ],
)
def test_control_characters_spaces_and_dot_segments_are_refused_naming_the_path(
    raw: bytes,
) -> None:
    with pytest.raises(BadTarget, match=r"^path '/v1/") as refused:
        checked_path(raw)
    assert "\r" not in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_query_is_sent_as_written_and_refused_only_for_control_characters() -> None:
    assert checked_query(b"") == ""
    assert checked_query(b"alt=sse") == "alt=sse"
    assert checked_query(b"$alt=json;enum-encoding=int") == "$alt=json;enum-encoding=int"
    assert checked_query(b"q=a+b&r=%20c") == "q=a+b&r=%20c"  # spaces, as a query writes them
    assert checked_query(b"after=\xc3\xa9") == "after=%C3%A9"
    for raw in (b"a=%0d%0ab", b"a=%00", b"a=b c", b"a=\x7f"):
        with pytest.raises(BadTarget, match=r"^query"):
            checked_query(raw)
