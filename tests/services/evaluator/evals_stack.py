"""The Evals API as the SDK tests drive it: real ingest (the gateway) and evaluator processes on
nats-server, SeaweedFS and SQLite, a fake OpenAI upstream that answers each question its own way
(per model, when a test says so), two tenants' keys, and the eval the tests share. A test module
starts one stack in its own module-scoped fixture: `with running(...) as stack: yield stack`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from sqlalchemy.engine import make_url
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shared import db
from shared.dev import localstack
from shared.settings import Settings
from tests.fakes.serving import ServedInThread
from tests.fakes.upstream import upstream_key_env, upstreams_yaml
from tests.plugins.infra import RunningProcess, free_port, make_settings, settings_env
from tests.plugins.tenants import tenant_key

ANSWERS: dict[str, str | None] = {
    "capital of France": "Paris",
    "2 + 2": "4",
    "largest planet": "Jupiter is the largest planet.",
    "cat backwards": "Tac",
}
QUESTIONS = [
    {"question": "What is the capital of France?", "answer": "Paris"},
    {"question": "What is 2 + 2?", "answer": "5"},
    {"question": "Name the largest planet.", "answer": "Jupiter"},
    {"question": "Spell cat backwards.", "answer": "tac"},
    {"question": "REFUSE to answer this.", "answer": "no"},
]
ITEM_SCHEMA = {
    "type": "object",
    "properties": {"question": {"type": "string"}, "answer": {"type": "string"}},
    "required": ["question", "answer"],
}
CRITERIA: list[Any] = [
    {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
     "reference": "{{item.answer}}", "operation": "eq"},
    {"type": "string_check", "name": "mentions", "input": "{{sample.output_text}}",
     "reference": "{{item.answer}}", "operation": "ilike"},
    {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
     "reference": "{{item.answer}}", "evaluation_metric": "fuzzy_match", "pass_threshold": 0.6},
    {"type": "text_similarity", "name": "rouge", "input": "{{sample.output_text}}",
     "reference": "{{item.answer}}", "evaluation_metric": "rouge_l", "pass_threshold": 0.5},
]  # fmt: skip
PROMPT = {
    "type": "template",
    "template": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "{{item.question}}"},
    ],
}


@dataclass
class Upstream:
    """OpenAI's chat completions, answering by the question (ANSWERS, overridden per model by
    `answers`), or, for a model in `judges`, by what that function makes of the whole
    conversation; `REFUSE` in the question, or an answer of None, gets OpenAI's 400. A call
    whose model, or a text in whose question, is in `held` is not answered until a test takes
    it out."""

    port: int = field(default_factory=free_port)
    requests: list[dict[str, Any]] = field(default_factory=list)
    answers: dict[str, dict[str, str | None]] = field(default_factory=dict)
    judges: dict[str, Callable[[list[dict[str, Any]]], str]] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)

    def _held(self, model: str, question: str) -> bool:
        return model in self.held or any(text in question for text in self.held)

    def sent_to(self, model: str) -> list[dict[str, Any]]:
        """The requests that asked `model`, in order."""
        return [body for body in self.requests if body["model"] == model]

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        question = body["messages"][-1]["content"]
        while self._held(body["model"], question):
            await asyncio.sleep(0.05)
        table = ANSWERS | self.answers.get(body["model"], {})
        judge = self.judges.get(body["model"])
        text = (
            judge(body["messages"])
            if judge is not None
            else next((a for q, a in table.items() if q in question), "I do not know.")
        )
        if "REFUSE" in question or text is None:
            error = {"message": "This prompt was refused.", "type": "invalid_request_error",
                     "param": "messages", "code": None}  # fmt: skip
            return JSONResponse({"error": error}, status_code=400)
        return JSONResponse({
            "id": "chatcmpl-eval", "object": "chat.completion", "created": 1741569952,
            "model": body["model"], "system_fingerprint": "fp_eval",
            "choices": [{"index": 0, "logprobs": None, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text, "refusal": None}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23,
                      "prompt_tokens_details": {"cached_tokens": 0}},
        })  # fmt: skip


@dataclass
class Stack:
    url: str
    client: openai.OpenAI
    other: openai.OpenAI  # another tenant's
    key: str
    upstream: Upstream
    evaluator: RunningProcess  # a test may restart it (stop, start: same ports, same database)
    database: Path  # the stack's SQLite file


@contextmanager
def running(tmp: Path, infra: Settings, extra_env: dict[str, str] | None = None) -> Iterator[Stack]:
    """Ingest and the evaluator as processes in `tmp`, the gateway routing `gpt-*` to the fake;
    `infra`: the session's nats-server and S3 settings; `extra_env`: more settings for both (e.g.
    `TUNELOOP_EVALUATOR_EVALS_MAX_ITEMS`)."""
    settings = make_settings(tmp, infra=infra)
    db.migrate(settings.database_url)
    upstream = Upstream()
    served = ServedInThread(
        Starlette(routes=[Route("/v1/chat/completions", upstream.chat, methods=["POST"])]),
        upstream.port,
        "fake OpenAI",
    )
    served.start()
    (tmp / "upstreams.yaml").write_text(upstreams_yaml(f"http://127.0.0.1:{upstream.port}"))
    env = settings_env(settings) | upstream_key_env()
    env["TUNELOOP_INGEST_UPSTREAMS_FILE"] = str(tmp / "upstreams.yaml")
    env |= extra_env or {}
    processes = []
    try:
        for name in ("ingest", "evaluator"):
            process = RunningProcess(
                localstack.component(settings, name), tmp / "logs" / f"{name}.log", env=env
            )
            process.start(timeout_s=90)
            processes.append(process)
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        key, other = tenant_key(url, "acme"), tenant_key(url, "globex")
        yield Stack(
            url,
            openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0),
            openai.OpenAI(base_url=f"{url}/v1", api_key=other, max_retries=0),
            key,
            upstream,
            processes[-1],
            Path(make_url(settings.database_url).database or ""),
        )
    finally:
        for process in reversed(processes):
            process.stop()
        served.stop()


def until_done(client: openai.OpenAI, eval_id: str, run_id: str) -> Any:
    deadline = time.monotonic() + 60
    while True:
        run = client.evals.runs.retrieve(run_id, eval_id=eval_id)
        if run.status not in ("queued", "in_progress"):
            return run
        assert time.monotonic() < deadline, run
        time.sleep(0.3)


def create_eval(client: openai.OpenAI) -> str:
    created = client.evals.create(
        name="capitals",
        metadata={"team": "qa"},
        data_source_config={
            "type": "custom",
            "item_schema": ITEM_SCHEMA,
            "include_sample_schema": True,
        },
        testing_criteria=CRITERIA,
    )
    return created.id


def completions_run(
    client: openai.OpenAI, eval_id: str, model: str, items: list[dict[str, Any]]
) -> Any:
    """A run of `model` answering `items` with PROMPT."""
    return client.evals.runs.create(
        eval_id,
        name=f"{model} on capitals",
        data_source={
            "type": "completions",
            "model": model,
            "source": {"type": "file_content", "content": [{"item": i} for i in items]},
            "input_messages": PROMPT,
            "sampling_params": {"temperature": 0, "max_completion_tokens": 32},
        },
    )


def scores(item: Any) -> dict[str, tuple[float, bool]]:
    return {r.name: (round(r.score, 4), r.passed) for r in item.results}
