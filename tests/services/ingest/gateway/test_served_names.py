"""Served names through a real gateway process (official openai SDK, real NATS): a canary takes
its share of 1,000 calls within ±5 points and a retry with the same X-Request-Id lands on the
same version; a canary answering 5xx is stopped at once and reported on the bus; switching the
primary under steady load drops no call. The engines are small fakes speaking OpenAI's chat
completions, each answering with its own name (the hoster's side: tests/services/hoster/)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import nats
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from services.ingest.gateway.served import BUCKETS, bucket
from shared import bus
from shared.dev import localstack
from shared.events import CanaryFailed, CanaryPolicy, ServedNameChanged, ServedTarget
from shared.settings import Settings
from tests.fakes.serving import ServedInThread
from tests.plugins.infra import free_port
from tests.services.ingest.conftest import Edge

pytestmark = pytest.mark.slow


@dataclass
class FakeEngine:
    """An OpenAI chat-completions server that answers with its name, or fails when told to."""

    name: str
    port: int
    failing: bool = False

    @property
    def target(self) -> ServedTarget:
        return ServedTarget(
            deployment_id=f"dep-{self.name}",
            endpoint_url=f"http://127.0.0.1:{self.port}/v1",
            version_id=f"mv-{self.name}",
            model=f"ft:{self.name}",
        )

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        if body["model"] != f"ft:{self.name}":  # as a real engine: its own names only
            error = {
                "message": f"model {body['model']!r} not found",
                "type": "invalid_request_error",
            }
            return JSONResponse({"error": error}, 404)
        if self.failing:
            return JSONResponse({"error": {"message": "engine broke", "type": "server_error"}}, 500)
        message = {"role": "assistant", "content": self.name}
        return JSONResponse(
            {
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )  # fmt: skip


@contextmanager
def engines(*names: str) -> Iterator[list[FakeEngine]]:
    made = [FakeEngine(name, free_port()) for name in names]
    servers = [ServedInThread(e.app(), e.port, f"engine {e.name}") for e in made]
    for server in servers:
        server.start()
    try:
        yield made
    finally:
        for server in servers:
            server.stop()


def announce(settings: Settings, event: ServedNameChanged) -> None:
    async def send() -> None:
        broker = bus.make_broker(settings.nats, service="hoster-test")
        await bus.connect(broker, settings.nats)
        try:
            await bus.publish(broker, event)
        finally:
            await broker.stop()

    asyncio.run(send())


def served(name: str, revision: int, primary: FakeEngine, canary: FakeEngine | None = None,
           percent: float = 0.0, policy: CanaryPolicy | None = None) -> ServedNameChanged:  # fmt: skip
    return ServedNameChanged(
        tenant="acme", name=name, revision=revision, primary=primary.target,
        canary=canary.target if canary else None, canary_percent=percent,
        rollback=policy or CanaryPolicy(),
    )  # fmt: skip


def ask(client: openai.OpenAI, model: str, text: str, request_id: str | None = None) -> str:
    headers = {"x-request-id": request_id} if request_id else None
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], extra_headers=headers
    )
    return answer.choices[0].message.content or ""


def wait_answered_by(client: openai.OpenAI, model: str, name: str) -> int:
    """Once the name is routed and `name` has answered; how many probes a failing engine
    answered 5xx meanwhile."""
    failed = 0

    def answered() -> bool:
        nonlocal failed
        try:
            return ask(client, model, f"are you there? {time.monotonic()}") == name
        except openai.NotFoundError:
            return False
        except openai.InternalServerError:
            failed += 1
            return False

    assert localstack.wait_until(answered, 15, interval_s=0.1)
    return failed


def test_the_split_is_a_stable_hash_of_the_key() -> None:
    keys = [f"call-{n}".encode() for n in range(20_000)]
    share = sum(bucket(key) < 10 * 100 for key in keys) / len(keys)
    assert 0.09 < share < 0.11
    assert all(bucket(key) == bucket(key) for key in keys[:100])
    assert {bucket(key) for key in keys} <= set(range(BUCKETS))


def test_a_canary_takes_its_share_and_a_retry_lands_on_the_same_version(edge: Edge) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    with engines("stable", "candidate") as (stable, candidate):
        announce(edge.settings, served("tickets", 1, stable, candidate, percent=10.0))
        wait_answered_by(client, "tickets", "stable")  # routed (the probe's body hashes to it)
        with ThreadPoolExecutor(8) as pool:
            answers = Counter(
                pool.map(lambda n: ask(client, "tickets", f"ticket {n}"), range(1000))
            )
        assert set(answers) == {"stable", "candidate"}
        assert 50 <= answers["candidate"] <= 150, answers  # 10 % ± 5 points of 1,000
        for request_id in ("req-a", "req-b", "req-c", "req-d"):
            first = ask(client, "tickets", "one", request_id)
            # A retry (another body, even) with the same id goes to the same version.
            assert {ask(client, "tickets", f"again {n}", request_id) for n in range(10)} == {first}
        # Another tenant's call naming the same served name is not routed to these engines.
        other = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.other_key, max_retries=0)
        with pytest.raises(openai.NotFoundError):
            ask(other, "tickets", "hello")


def test_a_failing_canary_is_stopped_at_once_and_reported_for_rollback(edge: Edge) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    reports: list[CanaryFailed] = []
    got = threading.Event()

    async def listen(stop: threading.Event) -> None:
        connection = await nats.connect(edge.settings.nats.url)

        async def heard(msg: nats.aio.msg.Msg) -> None:
            reports.append(CanaryFailed.model_validate(json.loads(msg.data)))
            got.set()

        await connection.subscribe(CanaryFailed.subject_for("acme"), cb=heard)
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await connection.drain()

    stop = threading.Event()
    listener = threading.Thread(target=lambda: asyncio.run(listen(stop)), daemon=True)
    listener.start()
    policy = CanaryPolicy(min_requests=20, max_error_rate=0.2)
    try:
        with engines("steady", "broken") as (steady, broken):
            broken.failing = True
            announce(edge.settings, served("support", 1, steady, broken, 50.0, policy))
            failed = wait_answered_by(client, "support", "steady")
            for n in range(400):
                try:
                    ask(client, "support", f"question {n}")
                except openai.InternalServerError:
                    failed += 1
                if got.is_set():
                    break
            assert got.wait(10), "no canary verdict was published"
            # Stopped at the window's end: 20 canary calls, every one failed.
            assert failed == 20
            assert all(ask(client, "support", f"after {n}") == "steady" for n in range(50))
    finally:
        stop.set()
        listener.join(5)
    [verdict] = reports
    assert (verdict.name, verdict.revision, verdict.deployment_id) == ("support", 1, "dep-broken")
    assert (verdict.requests, verdict.errors) == (20, 20)
    assert verdict.reason == "error rate 100.0% > 20.0%"


def test_switching_the_primary_under_steady_load_drops_no_call(edge: Edge) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    with engines("old", "new") as (old, new):
        announce(edge.settings, served("switch", 1, old))
        wait_answered_by(client, "switch", "old")
        answers: list[str] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def caller(n: int) -> None:
            while not stop.is_set():
                try:
                    answers.append(ask(client, "switch", f"load {n}"))
                except Exception as exc:  # counted: the test asserts there are none
                    errors.append(exc)

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        announce(edge.settings, served("switch", 2, new))
        assert localstack.wait_until(lambda: answers[-8:] == ["new"] * 8, 10, interval_s=0.05)
        time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join(10)
        # An older revision arriving late changes nothing.
        announce(edge.settings, served("switch", 1, old))
        time.sleep(0.5)
        assert ask(client, "switch", "late") == "new"
    assert errors == []
    assert {"old", "new"} <= set(answers)
    switched = answers.index("new")
    assert "old" not in answers[switched + 8 :]  # in flight at the switch at most


def test_a_shadow_is_mirrored_answered_calls_and_both_answers_are_kept_as_a_pair(
    edge: Edge,
) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    with engines("live", "mirror") as (live, mirror):
        state = served("mirrored", 1, live).model_copy(
            update={"shadow": mirror.target, "shadow_percent": 100.0}
        )
        announce(edge.settings, state)
        wait_answered_by(client, "mirrored", "live")
        assert [ask(client, "mirrored", f"shadowed {n}") for n in range(5)] == ["live"] * 5

        def pairs() -> list[dict[str, Any]]:
            return edge.samples(tag="purpose:shadow", limit=100)

        def mirrored(*texts: str) -> bool:
            return set(texts) <= {s["messages"][0]["content"][0]["text"] for s in pairs()}

        # Mirrored after the answer: wait for the five before the shadow starts failing.
        asked = [f"shadowed {n}" for n in range(5)]
        assert localstack.wait_until(lambda: mirrored(*asked), 40, interval_s=0.2)
        mirror.failing = True  # a failing shadow never reaches the caller
        assert ask(client, "mirrored", "while the shadow fails") == "live"
        failing = "while the shadow fails"
        assert localstack.wait_until(lambda: mirrored(failing), 40, interval_s=0.2)
    shadows = {s["messages"][0]["content"][0]["text"]: s for s in pairs()}
    for n in range(5):
        shadow = shadows[f"shadowed {n}"]
        [pair] = [t for t in shadow["tags"] if t.startswith("shadow_pair:")]
        assert "model_version:mv-mirror" in shadow["tags"]
        assert shadow["messages"][-1]["content"] == [{"type": "text", "text": "mirror"}]
        [primary] = [s for s in edge.samples(tag=pair) if "purpose:shadow" not in s["tags"]]
        assert "model_version:mv-live" in primary["tags"]
        assert primary["messages"][-1]["content"] == [{"type": "text", "text": "live"}]
    failed = shadows["while the shadow fails"]
    assert failed["response"]["status"] == "error"  # kept, and kept out of datasets
    with pytest.raises(openai.BadRequestError, match="reserved prefix 'shadow_pair:'"):
        client.chat.completions.create(
            model="mirrored", messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-tuneloop-tags": "shadow_pair:forged"},
        )  # fmt: skip
