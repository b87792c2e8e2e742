"""Tests of the dataset cleaning pipeline, split and snapshots; `make_sample` builds samples."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from shared.chat import Message, ResponseMeta, Sample

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def make_sample(
    user: str,
    answer: str | None = "ok",
    *,
    n: int = 0,
    system: str | None = None,
    finish: str = "stop",
    model: str = "gpt-4o",
    source: str = "gateway",
    messages: list[Message] | None = None,
    **fields: Any,
) -> Sample:
    """One exchange; `n` orders created_at (minutes after T0) and names the source_ref."""
    if messages is None:
        messages = [Message(role="system", content=system)] if system else []
        messages.append(Message(role="user", content=user))
        if answer is not None:
            messages.append(Message(role="assistant", content=answer))
    fields.setdefault(
        "response",
        ResponseMeta(provider="openai", model=model, finish_reason_raw=finish),
    )
    return Sample(
        tenant="acme",
        source=source,  # type: ignore[arg-type]
        source_ref=f"req-{n}-{user[:20]}",
        created_at=T0 + timedelta(minutes=n),
        messages=messages,
        **fields,
    )
