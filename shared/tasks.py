"""The kinds of task a dataset can teach, named once: the scheduler's recipe decides the kind from
the data, the evaluator grades by it, and events carry it between the two."""

from typing import Literal, get_args

TaskKind = Literal["json", "short_label", "tool_calls", "free_text"]
TASK_KINDS: tuple[str, ...] = get_args(TaskKind)
