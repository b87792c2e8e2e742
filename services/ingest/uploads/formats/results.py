"""What reading one line gives: samples with their fidelity notes, or a rejection naming the
line and the field."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.ingest.normalize import Dropped
from shared.chat import Sample


@dataclass(frozen=True)
class LineError:
    """A rejected line: its 1-based number and why, naming the field where there is one
    (`messages[2].role: 'robot' is not one of system, user, assistant, tool`)."""

    line_number: int
    reason: str
    # The format the line was read as, when it got that far.
    format: str | None = None

    def __str__(self) -> str:
        return f"line {self.line_number}: {self.reason}"


@dataclass
class ParsedLine:
    """An accepted line: its samples (one per response choice for the log formats) and what
    they do not carry."""

    line_number: int
    format: str
    samples: list[Sample]
    dropped: list[Dropped] = field(default_factory=list)


LineResult = ParsedLine | LineError
