"""The LLM judge against a local fake judge (tests/fakes/judge.py) through the official openai
SDK: valid verdicts, a malformed reply asked again (then valid, or a judge_error), a failure that
passes (503, 429 with Retry-After, a refused connection) tried again after a bounded backoff, a
refusal (400) not, a 500 and a slow judge as judge_errors, the bound on calls in flight, the
verdict cache, OpenAI's score_model / label_model shapes, and pairwise comparison both ways
round."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy.engine import Engine
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from services.evaluator.judge import (
    GraderMessage,
    JudgeClient,
    LabelModelGrader,
    ModelGrade,
    ScoreModelGrader,
    grade,
)
from services.evaluator.judge_records import DbVerdictCache
from services.evaluator.judge_replies import Unreadable, read_score
from services.evaluator.pairwise import compare
from shared.db import make_engine
from tests.fakes.judge import Call, FakeJudge
from tests.plugins.infra import free_port

REFERENCE = '{"id": 7, "team": "billing"}'
PROSE = "Sure! I would say it is a decent answer overall."  # the fake's malformed reply
GRADER = ScoreModelGrader(
    name="matches the reference",
    model="judge-model",
    input=[
        GraderMessage(role="system", content="Grade the answer from 0 to 10."),
        GraderMessage(
            role="user",
            content="Ticket {{item.ticket}}.\n\nThe reference answer:\n{{item.reference}}\n\n"
            "The answer to grade:\n{{sample.output_text}}",
        ),
    ],
    range=(0, 10),
    pass_threshold=7,
)


@pytest.fixture
def fake() -> Iterator[FakeJudge]:
    with FakeJudge(slow_s=1.0) as judge:
        yield judge


def client_of(fake: FakeJudge, **options: object) -> JudgeClient:
    settings: dict[str, object] = {"max_retries": 0, "timeout_s": 10.0, "concurrency": 4}
    settings.update(options)
    return JudgeClient(base_url=fake.base_url, api_key="judge-key", **settings)  # type: ignore[arg-type]


@pytest.fixture
async def client(fake: FakeJudge) -> AsyncIterator[JudgeClient]:
    judge = client_of(fake)
    yield judge
    await judge.aclose()


async def ask(
    client: JudgeClient, answer: str, *, rubric: str = "v1", tenant: str = "acme"
) -> ModelGrade:
    return await grade(
        client,
        GRADER,
        tenant=tenant,
        item={"ticket": 7, "reference": REFERENCE},
        sample={"output_text": answer},
        rubric=rubric,
    )


def test_a_score_is_read_from_prose_or_a_fence_and_refused_naming_the_field() -> None:
    assert read_score('ok: {"score": 7, "assessment": "fine"} done', 0, 10) == (7.0, "fine")
    assert read_score('```json\n{"score": "3", "assessment": "meh"}\n```', 0, 10)[0] == 3.0
    for reply, why in [
        ("Seven out of ten.", "no JSON object"),
        ('{"score": 11, "assessment": "x"}', "outside the range 0 to 10"),
        ('{"score": "high", "assessment": "x"}', "is not a number"),
        ('{"score": 5}', '"assessment": missing'),
    ]:
        with pytest.raises(Unreadable, match=why):
            read_score(reply, 0, 10)


def test_the_grader_shapes_refuse_what_openai_refuses() -> None:
    with pytest.raises(ValidationError, match="range"):
        ScoreModelGrader.model_validate({**GRADER.model_dump(), "range": [5, 1]})
    with pytest.raises(ValidationError, match="pass_threshold"):
        ScoreModelGrader.model_validate({**GRADER.model_dump(), "pass_threshold": 11})
    with pytest.raises(ValidationError, match="passing_labels"):
        LabelModelGrader(
            name="x", model="m", input=GRADER.input, labels=["a", "b"], passing_labels=["c"]
        )


async def test_a_valid_verdict_is_one_call_scaled_and_tagged_as_the_judge(
    client: JudgeClient, fake: FakeJudge
) -> None:
    right, wrong = await asyncio.gather(ask(client, REFERENCE), ask(client, "no idea"))
    assert (right.score, right.value, right.passed, right.error) == (0.9, 9.0, True, None)
    assert (wrong.score, wrong.passed) == (0.2, False)
    assert "against the reference" in right.assessment
    assert len(fake.calls) == 2
    call = fake.calls[0]
    assert call.headers["x-tuneloop-purpose"] == "judge"
    assert call.headers["authorization"] == "Bearer judge-key"
    assert (call.body["model"], call.body["temperature"]) == ("judge-model", 0)
    assert "Ticket 7." in call.body["messages"][1]["content"]
    assert call.body["messages"][-1]["content"].startswith("Reply with only a JSON object")


async def test_a_malformed_reply_is_asked_again_quoting_why(
    client: JudgeClient, fake: FakeJudge
) -> None:
    result = await ask(client, "MALFORMED_ONCE [score=6]")
    assert (result.score, result.attempts, result.error) == (0.6, 2, None)
    retry = fake.calls[1].body["messages"]
    assert retry[-2] == {"role": "assistant", "content": PROSE}
    assert "the reply holds no JSON object" in retry[-1]["content"]


async def test_malformed_twice_or_out_of_range_is_a_judge_error_never_a_score(
    client: JudgeClient, fake: FakeJudge
) -> None:
    prose, wild = await asyncio.gather(ask(client, "MALFORMED"), ask(client, "OUT_OF_RANGE"))
    for result, why in ((prose, "holds no JSON object"), (wild, "outside the range")):
        assert (result.score, result.passed, result.attempts) == (None, None, 2)
        assert result.error is not None
        assert why in result.error
        assert "unreadable twice" in result.error
    assert len(fake.calls) == 4


async def test_an_erroring_judge_is_a_judge_error_after_its_retries(fake: FakeJudge) -> None:
    judge = client_of(fake, max_retries=1, backoff_s=0.01)
    try:
        result = await ask(judge, "ERROR500")
    finally:
        await judge.aclose()
    assert result.score is None
    assert result.error is not None
    assert "judge endpoint: answered 500" in result.error
    assert "(2 tries)" in result.error
    assert len(fake.calls) == 2  # one try more, then the item's judge_error


@dataclass
class FlakyJudge(FakeJudge):
    """The fake judge behind an endpoint that fails first: each call takes the next of
    `failures` (an HTTP status, and a Retry-After or None) until none is left."""

    failures: list[tuple[int, str | None]] = field(default_factory=list)

    async def chat(self, request: Request) -> Response:
        if not self.failures:
            return await super().chat(request)
        self.calls.append(Call(await request.json(), dict(request.headers)))
        status, after = self.failures.pop(0)
        error = {"message": f"the judge is away ({status})", "type": "server_error"}
        headers = {"retry-after": after} if after is not None else None
        return JSONResponse({"error": error}, status_code=status, headers=headers)


async def test_a_failure_that_passes_is_tried_again_after_a_backoff() -> None:
    with FlakyJudge(failures=[(503, None), (429, "0.4")]) as flaky:
        judge = client_of(flaky, max_retries=3, backoff_s=0.01)
        started = time.monotonic()
        try:
            result = await ask(judge, REFERENCE)
        finally:
            await judge.aclose()
    # A 503, then a rate limit asking for 0.4 s (waited, not the 0.02 s backoff), then a verdict.
    assert (result.score, result.error, result.attempts) == (0.9, None, 1)
    assert len(flaky.calls) == 3
    assert time.monotonic() - started >= 0.4


async def test_a_refusal_is_a_judge_error_at_once_and_lasting_failures_are_bounded() -> None:
    with FlakyJudge(failures=[(400, None)] + [(503, "100")] * 5) as flaky:
        judge = client_of(flaky, max_retries=2, backoff_s=0.01, max_backoff_s=0.05)
        try:
            refused = await ask(judge, REFERENCE)
            calls = len(flaky.calls)
            started = time.monotonic()
            away = await ask(judge, REFERENCE)
            waited = time.monotonic() - started
        finally:
            await judge.aclose()
    assert refused.error is not None
    assert refused.error.startswith("judge endpoint: answered 400: ")
    assert refused.error.endswith("the judge is away (400)")  # no count: one try
    assert calls == 1  # a refusal is not asked again
    # Three tries, each wait the bound (0.05 s), not the 100 s the endpoint asked for.
    assert away.error is not None
    assert away.error.startswith("judge endpoint: answered 503: ")
    assert away.error.endswith("the judge is away (503) (3 tries)")
    assert (away.score, len(flaky.calls) - calls) == (None, 3)
    assert waited < 5


async def test_a_judge_that_cannot_be_reached_is_tried_again_then_a_judge_error(
    db: Engine,
) -> None:
    port = free_port()  # nothing listens there until the judge comes back
    judge = JudgeClient(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=3, backoff_s=0.01,
        cache=DbVerdictCache(db),
    )  # fmt: skip
    try:
        first = await ask(judge, REFERENCE)
        with FakeJudge(port=port) as back:
            again = await ask(judge, REFERENCE)  # the judge_error was not kept: asked again
    finally:
        await judge.aclose()
    assert first.error == "judge endpoint: APIConnectionError: Connection error. (4 tries)"
    assert (again.score, again.cached, len(back.calls)) == (0.9, False, 1)


async def test_a_slow_judge_times_out_as_a_judge_error(fake: FakeJudge) -> None:
    judge = client_of(fake, timeout_s=0.3)
    try:
        slow, quick = await asyncio.gather(ask(judge, "SLOW"), ask(judge, REFERENCE))
    finally:
        await judge.aclose()
    assert slow.error == "judge endpoint: timed out"
    assert quick.score == 0.9


async def test_calls_in_flight_never_pass_the_bound(fake: FakeJudge) -> None:
    fake.delay_s = 0.1
    judge = client_of(fake, concurrency=2)
    try:
        results = await asyncio.gather(*(ask(judge, f"answer {n}") for n in range(8)))
    finally:
        await judge.aclose()
    assert all(r.score == 0.2 for r in results)
    assert fake.most_in_flight == 2


@pytest.fixture
def db(tmp_path: Path, sqlite_template: Path) -> Iterator[Engine]:
    shutil.copyfile(sqlite_template, tmp_path / "tuneloop.db")
    engine = make_engine(f"sqlite:///{tmp_path / 'tuneloop.db'}")
    yield engine
    engine.dispose()


async def test_a_verdict_is_cached_by_rubric_version_input_output_and_model(
    fake: FakeJudge, db: Engine
) -> None:
    judge = client_of(fake)
    judge.cache = DbVerdictCache(db)
    try:
        first = await ask(judge, "[score=8] close")
        again = await ask(judge, "[score=8] close")
        assert (again.score, again.cached, again.attempts) == (first.score, True, 0)
        assert len(fake.calls) == 1  # the cache answered
        await ask(judge, "[score=8] close", rubric="v2")  # an edited rubric asks again
        await ask(judge, "[score=8] close", tenant="other")  # so does another tenant
        await ask(judge, "MALFORMED")  # failures are not kept ...
        await ask(judge, "MALFORMED")  # ... so they are asked again
    finally:
        await judge.aclose()
    assert len(fake.calls) == 1 + 1 + 1 + 2 + 2


async def test_label_model_passes_on_a_passing_label(client: JudgeClient) -> None:
    grader = LabelModelGrader(
        name="tone",
        model="judge-model",
        input=[GraderMessage(role="user", content="Is this polite? {{sample.output_text}}")],
        labels=["polite", "rude"],
        passing_labels=["polite"],
    )
    polite, rude = await asyncio.gather(
        grade(client, grader, tenant="acme", item={}, sample={"output_text": "[label=polite]"}),
        grade(client, grader, tenant="acme", item={}, sample={"output_text": "[label=rude]"}),
    )
    assert (polite.value, polite.passed, polite.score) == ("polite", True, 1.0)
    assert (rude.value, rude.passed, rude.score) == ("rude", False, 0.0)
    broken = await grade(client, grader, tenant="acme", item={}, sample={})
    assert broken.error is not None
    assert "sample.output_text is not in this item" in broken.error


async def test_pairwise_asks_both_ways_round_and_a_disagreement_is_a_tie(
    client: JudgeClient, fake: FakeJudge
) -> None:
    args = {"model": "judge-model", "rubric_text": "Be right.", "conversation": "user: hi"}
    long, short = "a long and complete answer", "short"
    better = await compare(client, first=short, second=long, **args)
    assert (better.winner, better.verdicts) == ("second", ("B", "A"))
    fake.pairwise = "first"  # a judge that always prefers the answer shown first
    biased = await compare(client, first=long + ".", second=short + ".", **args)
    assert (biased.winner, biased.verdicts) == ("tie", ("A", "A"))
    # Asked both ways at once: the calls may reach the judge in either order.
    contents = [c.body["messages"][1]["content"] for c in fake.calls[-2:]]
    orders = sorted(content.index(long) < content.index(short) for content in contents)
    assert orders == [False, True]


async def test_pairwise_failure_is_a_judge_error_not_a_tie() -> None:
    # Nothing listens on port 9: the judge's endpoint is away.
    judge = JudgeClient(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
    try:
        result = await compare(
            judge, model="m", rubric_text="r", conversation="c", first="a", second="b"
        )
    finally:
        await judge.aclose()
    assert result.winner == "judge_error"
    assert result.error is not None
    assert "judge endpoint" in result.error
