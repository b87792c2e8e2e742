"""What each cleaning step did, kept with the dataset: counts that add up, and why."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class StepReport:
    """One step: `samples_in - removed` samples came out; `changed` of them were modified.

    `reasons` counts removals and changes by reason (a removed sample counts once, under the
    reason it was removed for; a changed one under each kind of change made to it).
    """

    step: str
    samples_in: int
    removed: int = 0
    changed: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def samples_out(self) -> int:
        return self.samples_in - self.removed

    @classmethod
    def of(
        cls,
        step: str,
        samples_in: int,
        removed: Counter[str],
        changed: int = 0,
        changes: Counter[str] | None = None,
    ) -> StepReport:
        reasons = dict(sorted((removed + (changes or Counter())).items()))
        return cls(step, samples_in, sum(removed.values()), changed, reasons)


@dataclass
class CleaningReport:
    """All steps in the order they ran; `input_count - sum(removed) == output_count`."""

    steps: list[StepReport] = field(default_factory=list)
    input_count: int = 0
    output_count: int = 0
    # Samples per flag kind (refusal, truncated, format_error), dropped or kept.
    flagged: dict[str, int] = field(default_factory=dict)
    # Redactions per PII kind (email, phone, card, secret).
    pii: dict[str, int] = field(default_factory=dict)
    # Set once split (output_count == train_count + eval_count).
    train_count: int | None = None
    eval_count: int | None = None

    @property
    def removed(self) -> int:
        return sum(step.removed for step in self.steps)

    def add(self, step: StepReport) -> None:
        self.steps.append(step)
        self.output_count = step.samples_out

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for step, report in zip(data["steps"], self.steps, strict=True):
            step["samples_out"] = report.samples_out
        data["removed"] = self.removed
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CleaningReport:
        steps = [
            StepReport(s["step"], s["samples_in"], s["removed"], s["changed"], dict(s["reasons"]))
            for s in data.get("steps", [])
        ]
        return cls(
            steps,
            data["input_count"],
            data["output_count"],
            dict(data.get("flagged", {})),
            dict(data.get("pii", {})),
            data.get("train_count"),
            data.get("eval_count"),
        )
