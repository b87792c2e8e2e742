"""Pairwise comparison by the judge (shadow pairs, one version against another): which of two
answers to the same prompt is better by the rubric.

A judge prefers the answer in one position more often than chance (position bias, KNOWLEDGE.md),
so it is asked twice with the answers swapped: the same winner both times wins, and a
disagreement counts as a tie. Either question failing is a judge_error, not a tie.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from services.evaluator.judge import JudgeClient, JudgeError, Outcome, cache_key
from services.evaluator.judge_replies import Unreadable, json_object

Winner = Literal["first", "second", "tie", "judge_error"]
_CHOICES = ("A", "B", "tie")

SYSTEM = (
    "You compare two answers to the same conversation and say which is better by the rubric "
    "below, or that they are equally good.\n\n{rubric}"
)
USER = (
    "The conversation:\n{conversation}\n\nAnswer A:\n{a}\n\nAnswer B:\n{b}\n\n"
    'Reply with only a JSON object: {{"winner": "A" or "B" or "tie", "assessment": "<why>"}}'
)


@dataclass(frozen=True)
class Comparison:
    winner: Winner
    # The two verdicts as asked: first as A, then second as A ("A", "B" or "tie" each).
    verdicts: tuple[str | None, str | None]
    assessments: tuple[str, str]
    error: str | None = None


def read_winner(text: str) -> tuple[float | str, str]:
    obj = json_object(text)
    winner = obj.get("winner")
    if not isinstance(winner, str) or winner.strip() not in _CHOICES:
        raise Unreadable(f'"winner": {winner!r} is not "A", "B" or "tie"')
    assessment = obj.get("assessment")
    if not isinstance(assessment, str) or not assessment.strip():
        raise Unreadable('"assessment": missing; write one or two sentences on why')
    return winner.strip(), assessment.strip()


def _messages(rubric_text: str, conversation: str, a: str, b: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM.format(rubric=rubric_text)},
        {"role": "user", "content": USER.format(conversation=conversation, a=a, b=b)},
    ]


async def _ask(
    client: JudgeClient, model: str, messages: list[dict[str, str]], tenant: str, rubric: str
) -> Outcome:
    key = cache_key(
        tenant=tenant, rubric=rubric, messages=messages, output="", model=model, asked="pairwise"
    )
    return await client.ask(
        model=model, messages=messages, read=read_winner, key=key, tenant=tenant, rubric=rubric
    )


_AS_ASKED: dict[str, Winner] = {"A": "first", "B": "second", "tie": "tie"}
_SWAPPED: dict[str, Winner] = {"A": "second", "B": "first", "tie": "tie"}


def combine(as_asked: str, swapped: str) -> Winner:
    """The winner from the two orders (`swapped`: the second answer was shown as A)."""
    first, second = _AS_ASKED[as_asked], _SWAPPED[swapped]
    return first if first == second else "tie"


def _value(outcome: Outcome) -> str | None:
    return None if isinstance(outcome, JudgeError) else str(outcome.value)


async def compare(
    client: JudgeClient,
    *,
    model: str,
    rubric_text: str,
    conversation: str,
    first: str,
    second: str,
    tenant: str = "",
    rubric: str = "",
) -> Comparison:
    """Which of `first` and `second` answers `conversation` better (asked both ways round)."""
    one, two = await asyncio.gather(
        _ask(client, model, _messages(rubric_text, conversation, first, second), tenant, rubric),
        _ask(client, model, _messages(rubric_text, conversation, second, first), tenant, rubric),
    )
    if isinstance(one, JudgeError) or isinstance(two, JudgeError):
        errors = "; ".join(o.error for o in (one, two) if isinstance(o, JudgeError))
        return Comparison("judge_error", (_value(one), _value(two)), ("", ""), errors)
    return Comparison(
        combine(str(one.value), str(two.value)),
        (str(one.value), str(two.value)),
        (one.assessment, two.assessment),
    )
