"""SmolLM2-135M-Instruct itself as the judge, served by the hoster's CPU engine: a small model's
real, messy replies are either read as verdicts (a score in range and an assessment) or recorded
as judge_errors after one retry, never a crash and never a made-up score; asked to write a
rubric, it gives one or the default template stands in, saying why."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.evaluator.graders import Answer
from services.evaluator.judge import JudgeClient, grade
from services.evaluator.rubric import (
    Rubric,
    item_namespace,
    sample_namespace,
    task_grader,
    write,
)
from services.evaluator.subset import item_of
from services.hoster.lora_engine import Engine, build_app
from tests.fakes.serving import ServedInThread
from tests.plugins.infra import free_port
from tests.services.evaluator.samples import reference, ticket

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
async def smollm2_judge(smollm2_dir: Path) -> AsyncIterator[JudgeClient]:
    port = free_port()
    served = ServedInThread(
        build_app(Engine(base_dir=smollm2_dir, base_name=MODEL, max_batch=8)), port, "SmolLM2"
    )
    served.start()
    client = JudgeClient(
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key="none",
        purpose=None,  # not our gateway
        concurrency=4,
        timeout_s=120,
        max_retries=0,
        max_tokens=48,
    )
    try:
        yield client
    finally:
        await client.aclose()
        served.stop()


async def test_smollm2_verdicts_are_read_or_recorded_as_judge_errors(
    smollm2_judge: JudgeClient,
) -> None:
    items = [item_of(n, ticket(n)) for n in range(3)]
    rubric = Rubric(criteria=["The team is right"], low="the wrong team", high="the right team")
    said = [reference(0), "I am not sure.", '{"id": 2, "team": "nobody"}']
    # At once: the engine decodes them as one batch.
    grades = await asyncio.gather(
        *(
            grade(
                smollm2_judge,
                task_grader(MODEL),
                tenant="acme",
                item=item_namespace(item, rubric),
                sample=sample_namespace(Answer(text)),
                rubric="smollm2@1",
            )
            for item, text in zip(items, said, strict=True)
        )
    )
    for g in grades:
        if g.error is None:
            assert g.score is not None
            assert 0.0 <= g.score <= 1.0
            assert g.assessment.strip()
        else:
            assert (g.score, g.passed, g.attempts) == (None, None, 2)
            assert g.error.startswith("unreadable twice: ")
            assert "(reply: " in g.error  # what the model said, for whoever reads the error
    print("SmolLM2 as judge:", [(g.value, g.error and g.error[:120]) for g in grades])


async def test_smollm2_writes_a_rubric_or_the_default_stands_in_saying_why(
    smollm2_judge: JudgeClient,
) -> None:
    items = [item_of(n, ticket(n)) for n in range(2)]
    rubric, source, note = await write(smollm2_judge, model=MODEL, items=items, max_tokens=96)
    assert rubric.criteria
    if source == "default":
        assert note is not None
        assert note.startswith("the judge could not write a rubric (unreadable twice")
    else:
        assert (source, note) == ("generated", None)
    print("SmolLM2 rubric:", source, note and note[:160], rubric.model_dump_json()[:400])
