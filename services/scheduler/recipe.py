"""The recipe: a dataset profile and the user's choices in, hyperparameters and a plan out.

Every value is a `Decision` with a one-line reason that names the rule it used (KNOWLEDGE.md's
tables, OpenAI's published `auto` rule, the measured throughput row), kept on the job and
published in its events, so a user can see why a run trains for N steps at learning rate X.
Values the user gave win; they are validated where the API takes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from services.scheduler.analysis import DatasetProfile, task_kind
from services.scheduler.throughput import Throughput
from shared.tasks import TaskKind

# KNOWLEDGE.md, "How many epochs": the table row each task kind belongs to, (low, high).
EPOCH_TABLE: dict[TaskKind, tuple[float, float, str]] = {
    "json": (0.5, 2.0, "structured extraction / format: 0.5-2 epochs"),
    "short_label": (0.5, 2.0, "classification / format: 0.5-2 epochs"),
    "free_text": (1.0, 3.0, "general chat / assistant: 1-3 epochs"),
    "tool_calls": (3.0, 5.0, "multi-step reasoning / tool use: 3-5 epochs"),
}
# LoRA converges in a few hundred steps; below ~100 a small model has not learnt the format
# (KNOWLEDGE.md: field accuracy 0.70 at step 25, 0.97 at step 100 on the 400-example task).
MIN_STEPS = 100
MAX_EPOCHS = 10  # KNOWLEDGE.md: never above 10, whatever the floor asks
EVAL_POINTS = 8  # 6-10 evaluations a run: enough points to pick a best step
MIN_EVAL_POINTS = 6
LORA_LR = 2e-4  # the usual LoRA range for small models is 1e-4 - 3e-4
SHORT_RUN_LORA_LR = 3e-4  # ~15x a full fine-tune's rate for runs under ~100 steps
FULL_LR = 2e-5
LORA_RANK = 16
START_UP_S = 45.0  # model load and first step, before the step clock applies
ROW_MARGIN = 1.03  # the builder counts template tokens per message; a little for the rest
ROW_ROUNDING = 16  # rows in multiples of 16 tokens: padding is computed like any token


@dataclass(frozen=True)
class Decision:
    name: str
    value: Any
    reason: str
    source: Literal["auto", "user"] = "auto"


@dataclass(frozen=True)
class UserChoices:
    """What the job request fixed; None is OpenAI's `"auto"`."""

    n_epochs: float | None = None
    batch_size: int | None = None
    learning_rate_multiplier: float | None = None
    max_duration_s: float | None = None
    method: Literal["lora", "full"] = "lora"


@dataclass
class Plan:
    """The resolved run. `trainer` holds JobConfig sections (hyperparameters, lora, checkpoints)."""

    task_kind: TaskKind
    n_epochs: float
    batch_size: int  # examples an optimizer step, OpenAI's meaning
    learning_rate_multiplier: float
    steps: int
    eval_every: int
    eval_points: int
    estimated_s: float
    trainer: dict[str, Any]
    decisions: list[Decision] = field(default_factory=list)

    def reasons(self) -> dict[str, str]:
        return {d.name: d.reason for d in self.decisions}


def openai_epochs(n: int) -> int:
    """OpenAI's published `n_epochs: "auto"` (its cookbook's estimate)."""
    if n * 3 < 100:
        return min(25, 100 // max(n, 1))
    if n * 3 > 25_000:
        return max(1, 25_000 // n)
    return 3


def _epochs(profile: DatasetProfile, kind: TaskKind, user: UserChoices) -> Decision:
    if user.n_epochs is not None:
        return Decision("n_epochs", user.n_epochs, "given by the request", "user")
    low, high, row = EPOCH_TABLE[kind]
    openai = openai_epochs(profile.n_train)
    value = min(max(float(openai), low), high)
    if value == openai:
        reason = f"OpenAI's auto rule gives {openai} for {profile.n_train} examples, inside {row}"
    else:
        # Tie-break: the table is about the task, OpenAI's rule about the data size; the table
        # bounds, OpenAI's rule picks the point inside it.
        reason = (
            f"{row} (KNOWLEDGE.md) bounds OpenAI's auto rule ({openai} for "
            f"{profile.n_train} examples): clamped to {value:g}"
        )
    return Decision("n_epochs", value, reason)


def _row_length(profile: DatasetProfile, device: Throughput, context_len: int) -> Decision:
    needed = max(128, math.ceil(profile.example.p99 * ROW_MARGIN / ROW_ROUNDING) * ROW_ROUNDING)
    if device.device == "cpu":
        # A packed row pays attention over its whole length on CPU (1024-token rows: ~205
        # tokens/s vs ~245 for 256), and its padding costs like tokens: rows just long enough
        # for the longest common example (384-token rows for 216-token examples were 43 % pads).
        value, rule = needed, "short rows on CPU: the example p99"
    else:
        value, rule = max(needed, 2048), "rows of >= 2048 tokens packed on GPU"
    value = min(value, context_len)
    reason = (
        f"{rule} ({profile.example.p99} tokens, +3 %, in multiples of {ROW_ROUNDING}), "
        f"within context {context_len}"
    )
    return Decision("max_seq_len", value, reason)


def _examples_per_row(profile: DatasetProfile, row_len: int, user: UserChoices) -> int:
    """Examples a row holds: packed, about row_len / the median example; one when the user set
    `batch_size`, which then means exactly that many examples a step, as in OpenAI's API (a packed
    row holds as many as fit, so a step's count would only be an average)."""
    if user.batch_size is not None:
        return 1
    return max(1, row_len // max(profile.example.p50, 1))


def _rows_per_step(
    profile: DatasetProfile, device: Throughput, row_len: int, user: UserChoices
) -> Decision:
    per_row = _examples_per_row(profile, row_len, user)
    if user.batch_size is not None:
        reason = f"batch_size {user.batch_size} given: one example a row, unpacked"
        return Decision("rows_per_step", user.batch_size, reason, "user")
    rows = max(1, device.tokens_per_step // row_len)
    reason = f"{device.tokens_per_step} tokens a step on {device.device} ({device.source})"
    # The floor on steps comes first: a small dataset gets smaller steps, not fewer of them.
    steps_per_epoch = math.ceil(profile.n_train / (rows * per_row))
    while rows > 1 and steps_per_epoch < MIN_STEPS:
        rows -= 1
        steps_per_epoch = math.ceil(profile.n_train / (rows * per_row))
        reason = f"shrunk to reach the floor of {MIN_STEPS} steps an epoch where the data allows"
    return Decision("rows_per_step", rows, reason)


def _steps(
    profile: DatasetProfile, epochs: Decision, examples_per_step: int, user: UserChoices
) -> tuple[Decision, Decision]:
    steps_per_epoch = math.ceil(profile.n_train / examples_per_step)
    steps = max(1, round(float(epochs.value) * steps_per_epoch))
    if steps >= MIN_STEPS or epochs.source == "user":
        return epochs, Decision(
            "steps", steps, f"{epochs.value:g} epochs x {steps_per_epoch} steps"
        )
    # Below the floor even with one-row steps: more epochs, up to the never-above-10 rule.
    raised = min(MAX_EPOCHS, math.ceil(MIN_STEPS / steps_per_epoch))
    steps = raised * steps_per_epoch
    epochs = Decision(
        "n_epochs",
        float(raised),
        f"raised from {epochs.value:g} to reach the floor of {MIN_STEPS} optimizer steps "
        f"(at most {MAX_EPOCHS} epochs)",
    )
    return epochs, Decision("steps", steps, f"{raised} epochs x {steps_per_epoch} steps")


def plan(
    profile: DatasetProfile,
    device: Throughput,
    *,
    params: int,
    context_len: int,
    user: UserChoices | None = None,
) -> Plan:
    """Hyperparameters and a schedule for `profile` on `device`, every value explained."""
    user = user or UserChoices()
    kind, kind_reason = task_kind(profile)
    decisions = [Decision("task_kind", kind, kind_reason)]
    row = _row_length(profile, device, context_len)
    rows = _rows_per_step(profile, device, int(row.value), user)
    shape = _schedule(profile, device, kind, int(row.value), int(rows.value), params, user)
    if shape.steps < MIN_STEPS and int(rows.value) > 1 and user.batch_size is None:
        # The budget, not the data, cut the run below the floor: the same time buys more,
        # smaller steps, and LoRA learns from updates (measured here on the demo task: 168
        # one-example steps reached 0.91 field accuracy, 83 two-example steps 0.86).
        rows = Decision(
            "rows_per_step",
            1,
            f"one row a step: max_duration_s leaves {shape.steps} steps of {rows.value} rows, "
            f"under the floor of {MIN_STEPS}; more, smaller steps in the same time",
        )
        shape = _schedule(profile, device, kind, int(row.value), 1, params, user)
    micro, accumulation, examples_per_step = shape.micro, shape.accumulation, shape.examples
    epochs, steps, points, step_s = shape.epochs, shape.steps_decision, shape.points, shape.step_s
    decisions += [row, rows, epochs, steps, points]
    n_steps, n_points = int(steps.value), int(points.value)
    eval_every = max(1, math.ceil(n_steps / n_points))
    lr = _learning_rate(n_steps, user)
    warmup = max(math.ceil(0.03 * n_steps), min(5, n_steps // 10))
    decisions += [
        lr,
        Decision(
            "warmup_steps", warmup, "~3 % of steps, at least a few for short runs; cosine decay"
        ),
        Decision(
            "eval_every",
            eval_every,
            f"{n_points} evaluations a run (6-10); checkpoints at the same steps",
        ),
        Decision(
            "lora",
            {"rank": LORA_RANK, "alpha": 2 * LORA_RANK, "target_modules": "all-linear"},
            "LoRA on every linear layer (attention-only underperforms), rank 16, alpha 2 x rank",
        ),
    ]
    multiplier = user.learning_rate_multiplier or 1.0
    return Plan(
        task_kind=kind,
        n_epochs=float(epochs.value),
        batch_size=examples_per_step,
        learning_rate_multiplier=multiplier,
        steps=n_steps,
        eval_every=eval_every,
        eval_points=math.ceil(n_steps / eval_every),
        estimated_s=round(_estimate_s(n_steps, n_points, step_s, device), 1),
        trainer=_trainer_sections(
            user, row, micro, accumulation, epochs, n_steps, float(lr.value), warmup, eval_every
        ),
        decisions=decisions,
    )


@dataclass(frozen=True)
class _Shape:
    micro: int
    accumulation: int
    examples: int  # a step's examples
    epochs: Decision
    steps_decision: Decision
    points: Decision
    step_s: float

    @property
    def steps(self) -> int:
        return int(self.steps_decision.value)


def _schedule(
    profile: DatasetProfile,
    device: Throughput,
    kind: TaskKind,
    row_len: int,
    rows: int,
    params: int,
    user: UserChoices,
) -> _Shape:
    """Epochs, steps and eval points for steps of `rows` rows, fitted to the time budget."""
    micro = min(rows, device.max_rows)
    accumulation = math.ceil(rows / micro)
    per_row = _examples_per_row(profile, row_len, user)
    examples = micro * accumulation * per_row
    epochs, steps = _steps(profile, _epochs(profile, kind, user), examples, user)
    step_s = _step_seconds(device, row_len, math.ceil(examples / per_row), params)
    steps, points = _fit_budget(steps, step_s, device, user)
    return _Shape(micro, accumulation, examples, epochs, steps, points, step_s)


def _learning_rate(steps: int, user: UserChoices) -> Decision:
    if user.method == "full":
        base, reason = FULL_LR, "full fine-tune: 2e-5"
    elif steps < MIN_STEPS:
        base, reason = SHORT_RUN_LORA_LR, f"LoRA, under {MIN_STEPS} steps: ~15x a full fine-tune's"
    else:
        base, reason = LORA_LR, "LoRA: ~10x a full fine-tune's, 1e-4 - 3e-4 for small models"
    if user.learning_rate_multiplier is not None:
        return Decision(
            "learning_rate",
            base * user.learning_rate_multiplier,
            f"{reason}, x the given multiplier {user.learning_rate_multiplier:g}",
            "user",
        )
    return Decision("learning_rate", base, reason)


def _step_seconds(device: Throughput, row_len: int, rows: int, params: int) -> float:
    # A step computes its rows whole, pads included: examples packed whole (never split) fill a
    # row to a whole number of them.
    return rows * row_len / device.tokens_per_s(row_len, params)


def _estimate_s(steps: int, points: int, step_s: float, device: Throughput) -> float:
    # Evals run beside training on the same machine: they slow the steps they overlap, and the
    # last one runs after training ends.
    overlap = points * device.eval_point_s * (device.eval_slowdown - 1.0)
    return START_UP_S + steps * step_s + overlap + device.eval_point_s


def _fit_budget(
    steps: Decision, step_s: float, device: Throughput, user: UserChoices
) -> tuple[Decision, Decision]:
    points = Decision("eval_points", EVAL_POINTS, "6-10 evaluations a run")
    budget = user.max_duration_s
    n = int(steps.value)
    if budget is None or _estimate_s(n, EVAL_POINTS, step_s, device) <= budget:
        return steps, points
    points = Decision("eval_points", MIN_EVAL_POINTS, f"fewest evaluations (6) to fit {budget:g} s")
    spare = budget - _estimate_s(0, MIN_EVAL_POINTS, step_s, device)
    fitted = max(1, min(n, int(spare // step_s)))
    reason = (
        f"cut from {n} to fit max_duration_s {budget:g} at ~{step_s:.2f} s a step ({device.source})"
    )
    return Decision("steps", fitted, reason), points


def _trainer_sections(
    user: UserChoices,
    row: Decision,
    micro: int,
    accumulation: int,
    epochs: Decision,
    steps: int,
    lr: float,
    warmup: int,
    eval_every: int,
) -> dict[str, Any]:
    return {
        "method": user.method,
        "lora": {"rank": LORA_RANK, "alpha": 2 * LORA_RANK, "target_modules": "all-linear"},
        "hyperparameters": {
            "epochs": max(1, math.ceil(float(epochs.value))),
            "max_steps": steps,
            "micro_batch_size": micro,
            "gradient_accumulation_steps": accumulation,
            "max_seq_len": int(row.value),
            "packing": user.batch_size is None,
            "learning_rate": lr,
            "lr_scheduler": "cosine",
            "warmup_steps": warmup,
        },
        # Every evaluated checkpoint is kept until the final decision; the scheduler prunes.
        "checkpoints": {
            "every_n_steps": eval_every,
            "keep_last": math.ceil(steps / eval_every) + 1,
            "keep_best": False,
        },
    }
