"""The SSE parser splits recorded streams as browsers do: any line ending, comments, multi-line
data, event names and ids, and a last event without its closing blank line."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.ingest.normalize.sse import SseEvent, parse_sse
from tests.services.ingest.normalize.normalize_cases import fixtures_dir


def test_data_lines_events_ids_and_comments() -> None:
    text = (
        ": keep-alive comment\n"
        "event: message_start\n"
        'data: {"a": 1}\n'
        "id: 7\n"
        "\n"
        "data:no space after the colon\n"
        "\n"
    )
    assert parse_sse(text) == [
        SseEvent("message_start", '{"a": 1}', "7", line=2),
        SseEvent(None, "no space after the colon", None, line=6),
    ]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_every_line_ending_separates_events(newline: str) -> None:
    text = newline.join(["data: one", "", "data: two", "", ""])
    assert [e.data for e in parse_sse(text)] == ["one", "two"]


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert parse_sse("data: first\ndata:\ndata: third\n\n")[0].data == "first\n\nthird"


def test_only_one_leading_space_is_dropped() -> None:
    assert parse_sse("data:   indented\n\n")[0].data == "  indented"


def test_events_without_data_are_not_dispatched() -> None:
    assert parse_sse("event: ping\n\n: comment\n\nretry: 10\n\n") == []


def test_a_last_event_without_its_blank_line_is_kept() -> None:
    # Recorded streams may be cut after the last line.
    assert [e.data for e in parse_sse("data: a\n\ndata: b")] == ["a", "b"]


def test_unicode_line_separators_inside_json_do_not_split_lines() -> None:
    payload = json.dumps({"text": "a\u2028b\x85c"}, ensure_ascii=False)
    assert json.loads(parse_sse(f"data: {payload}\n\n")[0].data) == {"text": "a\u2028b\x85c"}


def test_a_byte_order_mark_is_ignored() -> None:
    assert parse_sse("\ufeffdata: x\n\n") == [SseEvent(None, "x", line=1)]


def test_the_line_numbers_point_at_the_event() -> None:
    events = parse_sse("data: a\r\n\r\ndata: b\r\n\r\nevent: e\r\ndata: c\r\n\r\n")
    assert [(e.line, e.event, e.data) for e in events] == [
        (1, None, "a"),
        (3, None, "b"),
        (5, "e", "c"),
    ]


@pytest.mark.skipif(fixtures_dir() is None, reason="conformance fixtures not found")
def test_recorded_streams_split_into_their_json_chunks() -> None:
    root = fixtures_dir()
    assert root is not None
    counts = {}
    for path in sorted((root / "chat" / "derived").glob("*sse.pairs.json")):
        body = json.loads(path.read_text(encoding="utf-8"))[0]["response"]["body"]
        events = parse_sse(body)
        payloads = [e.data for e in events if e.data != "[DONE]"]
        assert all(isinstance(json.loads(p), dict) for p in payloads)
        counts[path.name[:4]] = (len(events), {e.event for e in events})
    # oa03: 18 chunks + [DONE]; an08: typed events; ge04: 3 chunks split by \r\n\r\n.
    assert counts["oa03"] == (19, {None})
    assert counts["an08"][1] == {
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop", "ping",
    }  # fmt: skip
    assert counts["ge04"] == (3, {None})


@given(st.text())
def test_any_text_parses_without_error(text: str) -> None:
    for event in parse_sse(text):
        assert event.line >= 1
        assert "\r" not in event.data
