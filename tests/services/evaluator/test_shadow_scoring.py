"""Shadow scoring against a real ingest process (the gateway, on real NATS, S3 and SQLite): served
names with a shadow are announced on the bus, calls go through the gateway with the openai SDK,
the gateway captures each pair, and the scorer reads them from ingest's service route and asks a
fake judge (OpenAI's chat-completions wire format) which answer is better.

One engine server answers for every version, each with its own text, so one judge gives each
served name its case: the shadow's longer answer preferred (`better`), the primary's (`worse`),
a judge with a position bias (both orders say A: ties, `undecided`), a judge answering 500
(judge_errors, nothing decided), a shadow answering 500 and one that cannot be reached (shadow
failures, never judged)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from services.evaluator.app import create_app
from services.evaluator.judge import JudgeClient
from services.evaluator.shadow import PairsReader, ShadowScorer
from shared import auth, bus, db
from shared.dev import localstack
from shared.events import Event, ServedNameChanged, ServedTarget, ShadowScored
from shared.settings import Settings
from tests.fakes.judge import FakeJudge
from tests.fakes.serving import ServedInThread
from tests.fakes.upstream import RunningUpstream, gateway_env
from tests.plugins.infra import RunningProcess, free_port, make_settings

pytestmark = pytest.mark.slow
SERVICE_TOKEN = "tuneloop-dev-service"
LONG, SHORT = "a longer answer that says more", "short"
# served name -> (primary's answer, shadow's answer)
CASES = {
    "prefers-shadow": (SHORT, LONG),
    "prefers-primary": (LONG, SHORT),
    "biased": ("POSITION_BIAS " + SHORT, "POSITION_BIAS " + LONG),
    "judge-fails": (SHORT, "ERROR500 " + LONG),
}
CALLS = {"prefers-shadow": 5, "prefers-primary": 5, "biased": 4, "judge-fails": 3, "gone": 2}


@dataclass
class Engines:
    """OpenAI chat completions for every version: `ft:<name>-<role>` answers its case's text;
    a shadow asked a question holding FAIL_SHADOW answers 500."""

    port: int

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        name, _, role = str(body["model"]).removeprefix("ft:").rpartition("-")
        question = str(body["messages"][-1]["content"])
        if role == "shadow" and "FAIL_SHADOW" in question:
            return JSONResponse({"error": {"message": "engine broke", "type": "server_error"}}, 500)
        text = CASES[name][0 if role == "primary" else 1]
        return JSONResponse(
            {
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )  # fmt: skip

    def target(self, name: str, role: str, port: int | None = None) -> ServedTarget:
        return ServedTarget(
            deployment_id=f"dep-{name}-{role}",
            endpoint_url=f"http://127.0.0.1:{port or self.port}/v1",
            version_id=f"mv-{name}-{role}",
            model=f"ft:{name}-{role}",
        )


@dataclass
class Stack:
    settings: Settings
    url: str
    tenant: str
    key: str
    engines: Engines


@pytest.fixture(scope="module")
def stack(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("shadow")
    settings = make_settings(tmp, infra=stack_settings)
    db.migrate(settings.database_url)
    with Session(db.make_engine(settings.database_url)) as session:
        auth.create_tenant(session, tenant_id="acme", name="acme")
        _, key = auth.issue_api_key(session, tenant_id="acme", name="tests")
    engines = Engines(free_port())
    served = ServedInThread(Starlette(routes=[Route("/v1/chat/completions", engines.chat,
                                                    methods=["POST"])]), engines.port, "engines")  # fmt: skip
    served.start()
    with RunningUpstream() as upstream:
        process = RunningProcess(
            localstack.component(settings, "ingest"),
            tmp / "logs" / "ingest.log",
            env=gateway_env(settings, upstream, tmp),
        )
        process.start()
        try:
            url = f"http://127.0.0.1:{settings.services.ingest_port}"
            yield Stack(settings, url, "acme", key, engines)
        finally:
            process.stop()
            served.stop()


def announced(stack: Stack) -> list[ServedNameChanged]:
    events = [
        ServedNameChanged(
            tenant=stack.tenant, name=name, revision=1,
            primary=stack.engines.target(name, "primary"),
            shadow=stack.engines.target(name, "shadow"), shadow_percent=100.0,
        )
        for name in CASES
    ]  # fmt: skip
    # A shadow nothing listens on: the gateway keeps its failure as the pair's shadow sample.
    gone = ServedNameChanged(
        tenant=stack.tenant, name="gone", revision=1,
        primary=stack.engines.target("prefers-shadow", "primary"),
        shadow=stack.engines.target("gone", "shadow", port=free_port()), shadow_percent=100.0,
    )  # fmt: skip
    return [*events, gone]


async def _publish(settings: Settings, events: list[ServedNameChanged]) -> None:
    broker = bus.make_broker(settings.nats, service="hoster-test")
    await bus.connect(broker, settings.nats)
    try:
        for event in events:
            await bus.publish(broker, event)
    finally:
        await broker.stop()


def pairs(stack: Stack) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{stack.url}/internal/tenants/{stack.tenant}/shadow_pairs",
        params={"limit": 500},
        headers={"Authorization": f"Bearer {SERVICE_TOKEN}"},
    )
    response.raise_for_status()
    return list(response.json()["data"])


def _call_everything(stack: Stack, client: openai.OpenAI) -> None:
    def answer(model: str, text: str) -> str:
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}]
        )
        return reply.choices[0].message.content or ""

    # The gateway follows the bus: wait until each name answers with its primary.
    def routed(name: str) -> bool:
        return _answers(answer, name) == CASES.get(name, CASES["prefers-shadow"])[0]

    for name in CALLS:
        assert localstack.wait_until(partial(routed, name), 30, interval_s=0.2), name
    for name, count in CALLS.items():
        for n in range(count):
            answer(name, f"question {n} for {name}")
    answer("prefers-shadow", "FAIL_SHADOW please")


def _answers(answer: Any, name: str) -> str | None:
    try:
        return str(answer(name, "warm-up"))
    except openai.APIError:
        return None


def test_pairs_are_judged_both_ways_and_counted_per_version_pair(
    stack: Stack, tmp_path: Path, sqlite_template: Path
) -> None:
    events = announced(stack)
    asyncio.run(_publish(stack.settings, events))
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.key, max_retries=0)
    _call_everything(stack, client)
    # Warm-up calls are pairs too: count what ingest holds once every call's pair is in.
    expected = sum(CALLS.values()) + 1 + len(CALLS)
    assert localstack.wait_until(lambda: len(pairs(stack)) >= expected, 60, interval_s=0.5)
    listed = pairs(stack)
    by_name: dict[str, int] = {}
    for pair in listed:
        by_name[pair["served_name"]] = by_name.get(pair["served_name"], 0) + 1
    assert sum(by_name.values()) == len(listed)

    # The evaluator's own database (migrated): the scorer's tables, and a key for its route.
    shutil.copyfile(sqlite_template, tmp_path / "tuneloop.db")
    evaluator_settings = make_settings(tmp_path)
    engine = db.make_engine(evaluator_settings.database_url)
    with Session(engine) as session:
        auth.create_tenant(session, tenant_id=stack.tenant, name=stack.tenant)
        _, key = auth.issue_api_key(session, tenant_id=stack.tenant, name="tests")
    published: list[Event] = []

    async def publish(event: Event) -> None:
        published.append(event)

    async def score(judge: FakeJudge) -> list[ShadowScored]:
        scorer = ShadowScorer(
            db=engine,
            client=JudgeClient(base_url=judge.base_url, api_key="k", max_retries=0),
            model="judge-model",
            reader=PairsReader(httpx.AsyncClient(), stack.url, SERVICE_TOKEN),
            publish=publish,
            min_pairs=3,
            page_size=7,  # several pages
        )
        for event in events:
            await scorer.served_name_changed(event)
        try:
            return await scorer.poll()
        finally:
            await scorer.stop()

    with FakeJudge() as judge:
        asyncio.run(score(judge))
        asked = len(judge.calls)
        again = asyncio.run(score(judge))  # nothing new: no question, no event
        assert (again, len(judge.calls)) == ([], asked)
    latest = {e.name: e for e in published if isinstance(e, ShadowScored)}
    expect = {
        # pairs, shadow wins, primary wins, ties, judge errors, shadow failures, verdict
        "prefers-shadow": (by_name["prefers-shadow"], by_name["prefers-shadow"] - 1, 0, 0, 0, 1,
                           "better"),
        "prefers-primary": (by_name["prefers-primary"], 0, by_name["prefers-primary"], 0, 0, 0,
                            "worse"),
        "biased": (by_name["biased"], 0, 0, by_name["biased"], 0, 0, "undecided"),
        "judge-fails": (by_name["judge-fails"], 0, 0, 0, by_name["judge-fails"], 0, "undecided"),
        "gone": (by_name["gone"], 0, 0, 0, 0, by_name["gone"], "undecided"),
    }  # fmt: skip
    got = {
        name: (s.score.pairs, s.score.shadow_wins, s.score.primary_wins, s.score.ties,
               s.score.judge_errors, s.score.shadow_failures, s.score.verdict)
        for name, s in latest.items()
    }  # fmt: skip
    assert got == expect
    assert by_name["prefers-shadow"] == CALLS["prefers-shadow"] + 2  # warm-up and FAIL_SHADOW
    biased = latest["biased"].score
    assert (biased.win_rate, biased.decided) == (0.5, by_name["biased"])
    assert latest["judge-fails"].score.win_rate is None
    better = latest["prefers-shadow"]
    assert (better.primary_version, better.shadow_version) == (
        "mv-prefers-shadow-primary",
        "mv-prefers-shadow-shadow",
    )
    assert better.score.low is not None
    assert better.score.low > 0.5
    # Two questions per judged pair (both orders); failed shadows are never asked about.
    judged = sum(by_name[n] for n in CASES) - 1
    assert asked == 2 * judged

    _read_route(evaluator_settings, key, by_name)


def _read_route(settings: Settings, key: str, by_name: dict[str, int]) -> None:
    """GET /v1/shadow_scores/{name} on the evaluator app: the stored counts, tenant-scoped; with
    no judge configured it says so."""
    client = TestClient(create_app(settings))  # no lifespan: the route needs the database only
    headers = {"Authorization": f"Bearer {key}"}
    found = client.get("/v1/shadow_scores/prefers-primary", headers=headers)
    assert found.status_code == 200, found.text
    body = found.json()
    assert body["judge"] == "not configured"
    [score] = body["data"]
    assert score["current"] is True
    assert score["score"]["primary_wins"] == by_name["prefers-primary"]
    assert score["score"]["verdict"] == "undecided"  # this app's SHADOW_MIN_PAIRS is 20
    assert client.get("/v1/shadow_scores/unknown", headers=headers).status_code == 404
    assert client.get("/v1/shadow_scores/biased").status_code == 401
