"""Which checkpoint a run resumes from: `resume_from`, then each of `resume_fallbacks`, the first
that fetches and verifies against its manifest. `latest` stands for every committed checkpoint
under the output prefix, newest first. What is skipped is logged and goes into `started`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.trainer.checkpoints import CheckpointError, CheckpointStore, NoCheckpoint
from shared.reports import SkippedCheckpoint

log = logging.getLogger(__name__)

LATEST = "latest"


class NoUsableCheckpoint(CheckpointError):
    """There are checkpoints to resume from, but none of them can be used."""


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint fetched (uri None: there is none, the run starts at step 0) and the
    candidates skipped before it, in the order tried."""

    uri: str | None
    skipped: tuple[SkippedCheckpoint, ...] = ()


def fetch_first_usable(
    store: CheckpointStore, resume_from: str, fallbacks: Sequence[str], dest: Path
) -> ResumePoint:
    """Fetch the first candidate that verifies into dest (absent or empty).

    A candidate that is missing, uncommitted or corrupt (a file whose sha256 differs from the
    manifest's) is skipped with a warning. Whether the checkpoint suits this run (its config,
    its number of processes) is the caller's check, and never a reason to skip: another
    checkpoint of the same job would fail it as well. When no candidate can be used: a fresh
    start if resume_from is `latest` and nothing was found at all (an attempt's first run), else
    NoUsableCheckpoint naming each one and why, rather than silently training from scratch.
    """
    skipped: list[SkippedCheckpoint] = []
    seen: set[str] = set()
    found_unusable = False
    for candidate in _candidates(store, [resume_from, *fallbacks]):
        if candidate in seen:
            continue
        seen.add(candidate)
        try:
            uri = store.info(candidate).uri  # normalised, and committed with a step
            if uri != candidate and uri in seen:
                continue
            seen.add(uri)
            store.fetch(uri, dest)
        except CheckpointError as exc:
            log.warning("resume: skipping checkpoint %s: %s", candidate, exc)
            skipped.append(SkippedCheckpoint(uri=candidate, error=str(exc)))
            found_unusable = found_unusable or not isinstance(exc, NoCheckpoint)
            continue
        return ResumePoint(uri, tuple(skipped))
    if resume_from == LATEST and not found_unusable:
        also = " and no fallback is there" if fallbacks else ""
        log.warning("resume_from=latest: no committed checkpoint yet%s, starting from step 0", also)
        return ResumePoint(None, tuple(skipped))
    raise NoUsableCheckpoint(
        f"resume_from: none of the {len(skipped)} checkpoint(s) to resume from can be used: "
        + "; ".join(entry.error for entry in skipped)
    )


def _candidates(store: CheckpointStore, wanted: list[str]) -> Iterator[str]:
    for location in wanted:
        if location == LATEST:
            yield from store.newest_first()
        else:
            yield location
