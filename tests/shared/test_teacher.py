"""The teacher: a real `tuneloop teacher` process answers every demo ticket correctly in OpenAI's
wire format (plain and streamed, through the official SDK), says it is a stand-in, refuses what
is not a ticket, and serves the gateway's `teacher-*` route with the calls captured as samples."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from shared import db
from shared.chat import Message, Sample, TextPart
from shared.dev import localstack
from shared.dev.demo.teacher import FINGERPRINT, NotATicket, extract
from shared.dev.demo.tickets import (
    SYSTEM_PROMPT,
    TEACHER_MODEL,
    Ticket,
    answer_json,
    field_accuracy,
    generate,
    generate_all,
)
from shared.settings import ServicePorts, Settings, load_settings
from tests.plugins.infra import RunningProcess, free_port, make_settings, settings_env
from tests.plugins.tenants import tenant_key

UPSTREAMS = Path(__file__).resolve().parents[2] / "deploy" / "local" / "upstreams.yaml"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The teacher as `make up` starts it (its stack.yaml component), on a free port."""
    tmp = tmp_path_factory.mktemp("teacher")
    settings = load_settings(
        app={"env": "test", "data_dir": tmp}, services={"teacher_port": free_port()}
    )
    process = RunningProcess(localstack.component(settings, "teacher"), tmp / "teacher.log")
    process.start()
    try:
        yield f"http://127.0.0.1:{settings.services.teacher_port}"
    finally:
        process.stop()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_the_rules_read_every_ticket_right() -> None:
    train, heldout = generate_all()
    assert all(extract(t.text) == t.answer for t in train + heldout)


@pytest.mark.parametrize(
    "text",
    ["What is the capital of France?", "Subject: hi\nFrom: Bob\n\nMy toaster is broken."],
)
def test_text_that_is_not_a_ticket_is_refused(text: str) -> None:
    with pytest.raises(NotATicket):
        extract(text)


def test_it_answers_every_held_out_ticket_correctly(teacher: str) -> None:
    client = _client(teacher)
    for ticket in generate("heldout"):
        completion = client.chat.completions.create(**ticket.request())
        content = completion.choices[0].message.content
        assert content == answer_json(ticket.answer)
        assert field_accuracy(ticket.answer, content) == 1.0


def test_a_completion_is_openai_shaped_and_labelled_a_stand_in(teacher: str) -> None:
    ticket = generate("heldout")[0]
    raw = _client(teacher).chat.completions.with_raw_response.create(**ticket.request(), n=2)
    assert "stand-in" in raw.headers["x-tuneloop-stand-in"]
    completion = raw.parse()
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.created > 0
    assert completion.model == TEACHER_MODEL
    assert completion.system_fingerprint == FINGERPRINT
    assert [c.index for c in completion.choices] == [0, 1]
    assert all(c.finish_reason == "stop" for c in completion.choices)
    assert all(c.message.role == "assistant" for c in completion.choices)
    usage = completion.usage
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    models = _client(teacher).models.list()
    assert [m.id for m in models.data] == [TEACHER_MODEL]
    assert models.data[0].owned_by == FINGERPRINT


def _streamed(url: str, ticket: Ticket) -> tuple[str, list[openai.types.chat.ChatCompletionChunk]]:
    stream = _client(url).chat.completions.create(
        **ticket.request(), stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return content, chunks


def test_streaming_sends_chunks_then_usage_then_done(teacher: str) -> None:
    ticket = generate("heldout")[1]
    content, chunks = _streamed(teacher, ticket)
    assert content == answer_json(ticket.answer)
    assert len(chunks) > 3
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert set(finishes[:-1]) == {None}
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0

    with httpx.stream(
        "POST", f"{teacher}/v1/chat/completions", json=ticket.request() | {"stream": True}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert {e["object"] for e in events} == {"chat.completion.chunk"}
    assert "usage" not in events[-1]  # only when stream_options asks for it


def test_what_is_not_a_ticket_gets_an_openai_error(teacher: str) -> None:
    client = _client(teacher)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=TEACHER_MODEL, messages=[{"role": "user", "content": "Write a poem."}]
        )
    assert refused.value.code == "not_a_demo_ticket"
    assert refused.value.param == "messages"
    assert "Not a demo ticket" in refused.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(**generate("heldout")[0].request("gpt-4o"))
    assert unknown.value.code == "model_not_found"


def test_tuneloop_teacher_serves_on_the_port_it_is_given(tmp_path: Path) -> None:
    port = free_port()
    tuneloop = Path(sys.executable).parent / "tuneloop"
    log = (tmp_path / "teacher.log").open("wb")
    process = subprocess.Popen(
        [str(tuneloop), "teacher", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        url = f"http://127.0.0.1:{port}"
        assert localstack.wait_until(localstack.http_ready(f"{url}/healthz", [200]), 30), (
            tmp_path / "teacher.log"
        ).read_text()
        assert [m.id for m in _client(url).models.list().data] == [TEACHER_MODEL]
    finally:
        process.terminate()
        process.wait(10)
        log.close()
    assert "stand-in" in (tmp_path / "teacher.log").read_text()


def test_the_shipped_upstream_entry_points_at_the_teachers_default_port() -> None:
    entry = _teacher_upstream()
    assert entry["api"] == "openai"
    assert entry["base_url"] == f"http://127.0.0.1:{ServicePorts().teacher_port}"
    assert "teacher-*" in entry["models"]


def _teacher_upstream() -> dict[str, object]:
    upstreams = yaml.safe_load(UPSTREAMS.read_text())["upstreams"]
    entry: dict[str, object] = next(u for u in upstreams if u["name"] == "teacher")
    return entry


# --- through the gateway ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(
    teacher: str,
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str]]:
    """The ingest service routing `teacher-*` by the shipped upstreams entry (its port this
    test's teacher's); yields its URL and a tenant key."""
    tmp = tmp_path_factory.mktemp("gateway")
    settings = make_settings(tmp, infra=stack_settings)
    db.migrate(settings.database_url)
    upstreams = tmp / "upstreams.yaml"
    upstreams.write_text(
        yaml.safe_dump({"upstreams": [_teacher_upstream() | {"base_url": teacher}]})
    )
    env = settings_env(settings) | {"TUNELOOP_INGEST_UPSTREAMS_FILE": str(upstreams)}
    process = RunningProcess(
        localstack.component(settings, "ingest"), tmp / "logs" / "ingest.log", env=env
    )
    process.start()
    url = f"http://127.0.0.1:{settings.services.ingest_port}"
    try:
        yield url, tenant_key(url, "acme")
    finally:
        process.stop()


def test_the_gateway_serves_the_teacher_and_captures_the_calls(
    gateway: tuple[str, str],
) -> None:
    url, key = gateway
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    plain, streamed = generate("train")[:2]
    completion = client.chat.completions.create(
        **plain.request(), extra_headers={"x-tuneloop-tags": "demo"}
    )
    assert completion.choices[0].message.content == answer_json(plain.answer)
    stream = client.chat.completions.create(
        **streamed.request(), stream=True, extra_headers={"x-tuneloop-tags": "demo"}
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == answer_json(
        streamed.answer
    )

    def samples() -> list[dict[str, object]]:
        response = httpx.get(
            f"{url}/v1/samples",
            params={"tag": "demo"},
            headers={"Authorization": f"Bearer {key}"},
        )
        response.raise_for_status()
        data: list[dict[str, object]] = response.json()["data"]
        return data

    assert localstack.wait_until(lambda: len(samples()) >= 2, 40, interval_s=0.2), samples()
    captured = [Sample.model_validate(s) for s in samples()]
    assert len(captured) == 2
    by_text = {_text(s.prompt_messages()[-1]): s for s in captured}
    for ticket in (plain, streamed):
        sample = by_text[ticket.text]
        assert _text(sample.prompt_messages()[0]) == SYSTEM_PROMPT
        completion = sample.completion()
        assert completion is not None
        assert _text(completion) == answer_json(ticket.answer)
        assert sample.response is not None
        assert sample.response.model_requested == TEACHER_MODEL


def _text(message: Message) -> str:
    return "".join(p.text for p in message.content if isinstance(p, TextPart))
