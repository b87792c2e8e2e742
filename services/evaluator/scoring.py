"""Grade a point's answers against the subset's references and lay them out for storage.

A point's score is the mean of its items' scores (each in [0, 1], from graders.grader_for the
task kind). An item the engine refused scores 0; a reference the grader cannot read (a json
task whose reference is not an object) scores 0 with the reason, rather than failing the point.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.evaluator.engine_client import Output
from services.evaluator.graders import grader_for
from services.evaluator.subset import EvalItem
from shared.tasks import TaskKind


@dataclass(frozen=True)
class ItemResult:
    item: EvalItem
    output: Output
    score: float
    detail: dict[str, Any]


def grade(kind: TaskKind, items: list[EvalItem], outputs: list[Output]) -> list[ItemResult]:
    grader = grader_for(kind)
    results = []
    for item, output in zip(items, outputs, strict=True):
        if output.error is not None:
            results.append(ItemResult(item, output, 0.0, {"error": output.error}))
            continue
        try:
            grade = grader(item.reference, output.answer)
        except ValueError as exc:
            results.append(ItemResult(item, output, 0.0, {"error": str(exc)}))
            continue
        results.append(ItemResult(item, output, grade.score, grade.detail))
    return results


def mean_score(results: list[ItemResult]) -> float:
    return sum(r.score for r in results) / len(results) if results else 0.0


def outputs_jsonl(results: list[ItemResult]) -> bytes:
    """One line an item: its input, reference, output, score and latency (what users download)."""
    lines = []
    for r in results:
        record = {
            "position": r.item.position,
            "sample_id": r.item.sample_id,
            "input": {"messages": r.item.messages, "tools": r.item.tools},
            "reference": {
                "text": r.item.reference.text,
                "tool_calls": [list(c) for c in r.item.reference.tool_calls],
            },
            "output": {
                "text": r.output.answer.text,
                "tool_calls": [list(c) for c in r.output.answer.tool_calls],
            },
            "score": r.score,
            "detail": r.detail,
            "latency_ms": round(r.output.latency_ms, 1),
            "error": r.output.error,
        }
        lines.append(json.dumps(record, ensure_ascii=False, sort_keys=True))
    return ("\n".join(lines) + "\n").encode()
