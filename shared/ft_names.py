"""Fine-tuned model names, `ft:<base>:<suffix>:<job>`, read back: the served name a job's version
goes under is its suffix (the hoster deploys it there, the evaluator compares it with the
version serving there)."""

from __future__ import annotations


def job_suffix(fine_tuned: str) -> str:
    """The suffix of `ft:<base>:<suffix>:<job>` ("" when none), counted from the end: a
    tenant's own base is an s3:// URI, colons and all."""
    parts = fine_tuned.rsplit(":", 2)
    return parts[1] if len(parts) == 3 else ""
