"""The fidelity report kept in the database: summed over processes, kept over restarts."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine

from services.ingest.capture.fidelity import (
    OTHER_REASONS,
    Fidelity,
    FidelityFlusher,
    store_deltas,
    stored_report,
)
from tests.services.ingest.conftest import Edge


def _counted(
    samples: int = 0, rejected: tuple[str, ...] = (), dropped: tuple[str, ...] = ()
) -> Fidelity:
    fidelity = Fidelity()
    for _ in range(samples):
        fidelity.count_sample("acme", "upload")
    for reason in rejected:
        fidelity.count_rejected("acme", "upload", reason)
    for reason in dropped:
        fidelity.count_dropped("acme", "otlp", reason)
    return fidelity


async def test_two_processes_and_a_restart_add_up(db_engine: Engine) -> None:
    first = FidelityFlusher(_counted(3, rejected=("line 2: messages: is required",)), db_engine)
    second = FidelityFlusher(_counted(2, rejected=("line 2: messages: is required",)), db_engine)
    await first.flush()
    await second.flush()
    restarted = _counted(dropped=("span 7: unknown event",))
    report = await FidelityFlusher(restarted, db_engine).report("acme")
    assert report == {
        "otlp": {"samples": 0, "rejected": {}, "dropped": {"span 7: unknown event": 1}},
        "upload": {"samples": 5, "rejected": {"line 2: messages: is required": 2}, "dropped": {}},
    }
    assert await FidelityFlusher(Fidelity(), db_engine).report("globex") == {}


def test_distinct_reasons_past_the_bound_share_one_bucket(db_engine: Engine) -> None:
    store_deltas(db_engine, _counted(rejected=("a", "b")).drain(), max_reasons=3)
    store_deltas(db_engine, _counted(rejected=("a", "c", "d", "e")).drain(), max_reasons=3)
    assert stored_report(db_engine, "acme")["upload"]["rejected"] == {
        "a": 2,
        "b": 1,
        "c": 1,
        OTHER_REASONS: 2,
    }


async def test_a_failed_flush_keeps_the_counts_for_the_next(
    db_engine: Engine, tmp_path: Path
) -> None:
    fidelity = _counted(4, rejected=("bad line",))
    unmigrated = create_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    await FidelityFlusher(fidelity, unmigrated).flush()  # no table there: the write fails
    assert fidelity.report("acme")["upload"]["samples"] == 4
    await FidelityFlusher(fidelity, db_engine).flush()
    assert fidelity.drain() == []
    assert stored_report(db_engine, "acme")["upload"] == {
        "samples": 4,
        "rejected": {"bad line": 1},
        "dropped": {},
    }


def test_the_report_survives_a_restart_of_the_service(edge: Edge) -> None:
    url = f"{edge.url}/v1/ingest/fidelity"

    def robots(key: str) -> int:
        report = httpx.get(url, headers={"Authorization": f"Bearer {key}"}).json()
        rejected = report.get("upload", {}).get("rejected", {})
        return sum(n for reason, n in rejected.items() if "'robot'" in reason)

    before = robots(edge.key)
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    bad = {"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}
    imported = httpx.post(
        f"{edge.url}/v1/samples/import?format=openai_finetune",
        content=b"\n".join(json.dumps(line).encode() for line in (good, bad)),
        headers={"Authorization": f"Bearer {edge.key}", "content-type": "application/jsonl"},
    )
    assert imported.status_code == 200, imported.text
    assert robots(edge.key) == before + 1  # counted at once, flushed or not
    edge.process.stop()  # SIGTERM: the last counts are flushed on the way down
    edge.process.start()
    assert robots(edge.key) == before + 1
    assert robots(edge.other_key) == 0
