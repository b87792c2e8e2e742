"""A fake LLM judge: an OpenAI-compatible `/v1/chat/completions` that answers the evaluator's
judge prompts (services/evaluator/rubric.py, pairwise.py) as a scripted judge would.

What it says is decided by the answer it is shown:
- `[score=N]` in the answer: that score; otherwise 9 when the answer is the reference, else 2;
- `MALFORMED_ONCE`: prose first, then a valid verdict when asked again; `MALFORMED`: prose
  every time; `OUT_OF_RANGE`: a score of 42; `SLOW`: answers after `slow_s`; `ERROR500`: 500.
`[label=x]` answers a label question with x. A rubric request gets `rubric_reply`; a pairwise one prefers the longer answer (`pairwise`
"longer"), or always answer A ("first": a judge with a position bias, also when either answer
holds `POSITION_BIAS`); either answer holding `ERROR500` gets a 500. Every request body and
its headers are kept, and how many were in flight at most.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.serving import ServedInThread
from tests.plugins.infra import free_port

VALID_RUBRIC = {
    "criteria": ["Routes the ticket to the right team", "Gives the ticket's id"],
    "low": "the wrong team, or no JSON",
    "high": "the same id and team as the reference",
    "examples": [
        {"input": "Ticket 1", "answer": '{"id": 1, "team": "shipping"}', "score": 10, "why": "ok"},
        {"input": "Ticket 2", "answer": "no idea", "score": 0, "why": "no answer"},
        {"input": "Ticket 3", "answer": "{}", "score": "high", "why": "a bad example, dropped"},
    ],
}
_SECTIONS = re.compile(
    r"The reference answer:\n(?P<reference>.*)\n\nThe answer to grade:\n(?P<answer>.*)\Z", re.DOTALL
)
_PAIR = re.compile(r"Answer A:\n(?P<a>.*)\n\nAnswer B:\n(?P<b>.*)\n\nReply", re.DOTALL)
_FORCED = re.compile(r"\[score=(\d+(?:\.\d+)?)\]")


@dataclass
class Call:
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class FakeJudge:
    port: int = field(default_factory=free_port)
    rubric_reply: str = json.dumps(VALID_RUBRIC)
    pairwise: str = "longer"
    slow_s: float = 2.0
    delay_s: float = 0.0  # every answer waits this long (so concurrent calls overlap)
    calls: list[Call] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def graded(self) -> list[Call]:
        """The calls that asked for a score (not a rubric, not a comparison)."""
        return [c for c in self.calls if "The answer to grade:" in _user(c.body["messages"])]

    def _verdict(self, messages: list[dict[str, Any]]) -> tuple[str, int]:
        """(reply text, HTTP status) for a score question."""
        found = _SECTIONS.search(_user(messages))
        if found is None:
            return "I cannot find the answer to grade.", 200
        answer, reference = found["answer"].strip(), found["reference"].strip()
        retried = any(m["role"] == "assistant" for m in messages)
        if "ERROR500" in answer:
            return "", 500
        always_bad = "MALFORMED" in answer.replace("MALFORMED_ONCE", "")
        if always_bad or ("MALFORMED_ONCE" in answer and not retried):
            return "Sure! I would say it is a decent answer overall.", 200
        if "OUT_OF_RANGE" in answer:
            return json.dumps({"score": 42, "assessment": "very good"}), 200
        forced = _FORCED.search(answer)
        score = float(forced.group(1)) if forced else 9.0 if answer == reference else 2.0
        body = {"score": score, "assessment": f"scored {score:g} against the reference"}
        return f"Here is my verdict:\n```json\n{json.dumps(body)}\n```", 200

    def _pair(self, messages: list[dict[str, Any]]) -> tuple[str, int]:
        found = _PAIR.search(_user(messages))
        assert found is not None
        a, b = found["a"].strip(), found["b"].strip()
        if "ERROR500" in a + b:
            return "", 500
        if self.pairwise == "first" or "POSITION_BIAS" in a + b:
            winner = "A"
        else:
            winner = "tie" if len(a) == len(b) else "A" if len(a) > len(b) else "B"
        return json.dumps({"winner": winner, "assessment": "compared"}), 200

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.calls.append(Call(body, dict(request.headers)))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            messages = body["messages"]
            status = 200
            if messages[0]["content"].startswith("You write grading rubrics"):
                text = self.rubric_reply
            elif "Answer A:" in _user(messages):
                text, status = self._pair(messages)
            elif '{"label"' in str(messages[-1]["content"]):
                text = _label(messages)
            else:
                text, status = self._verdict(messages)
                if "SLOW" in _user(messages):
                    await asyncio.sleep(self.slow_s)
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        if status != 200:
            error = {"message": "the judge fell over", "type": "server_error"}
            return JSONResponse({"error": error}, status_code=status)
        return JSONResponse(_completion(body["model"], text))

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    def __enter__(self) -> FakeJudge:
        self._served = ServedInThread(self.app(), self.port, "fake judge")
        self._served.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._served.stop()


def _user(messages: list[dict[str, Any]]) -> str:
    """The first user message: the question (later ones are the format ask and retries)."""
    return next((str(m["content"]) for m in messages if m["role"] == "user"), "")


def _label(messages: list[dict[str, Any]]) -> str:
    """A label_model question: the label `[label=x]` in the prompt names, else the first."""
    forced = re.search(r"\[label=(\w+)\]", _user(messages))
    labels = json.loads(re.search(r"one of (\[.*?\])", str(messages[-1]["content"]))[1])
    label = forced.group(1) if forced else labels[0]
    return json.dumps({"label": label, "assessment": f"it reads as {label}"})


def _completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70},
    }
