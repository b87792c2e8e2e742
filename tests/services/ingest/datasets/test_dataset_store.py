"""The dataset builder's use of the database, on SQLite and PostgreSQL: selecting samples by
filter and by uploaded file (keyset pages, stable order), and the build's claim on its row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from services.ingest.datasets import rows as dataset_rows
from services.ingest.datasets import select as dataset_select
from services.ingest.datasets.rows import Built
from services.ingest.datasets.spec import SampleFilter
from services.ingest.models import DatasetRow, UploadedFile
from services.ingest.samples.store import insert_samples
from shared.chat import Message, ResponseMeta, Sample
from shared.db import session_scope

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _sample(
    i: int,
    *,
    tenant: str = "acme",
    model: str = "gpt-4o-2024-08-06",
    requested: str = "gpt-4o",
    source: str = "gateway",
    ref: str | None = None,
    tags: tuple[str, ...] = (),
    metadata: dict[str, str] | None = None,
    status: str = "ok",
) -> Sample:
    error = {"status_code": 500, "message": "boom"} if status == "error" else None
    messages = [Message(role="user", content=f"question {i}")]
    if status == "ok":
        messages.append(Message(role="assistant", content=f"answer {i}"))
    return Sample(
        tenant=tenant,
        source=source,  # type: ignore[arg-type]
        source_ref=ref or f"req-{tenant}-{i}",
        # Pairs share a time, so the keyset's tie-break on id is exercised.
        created_at=T0 + timedelta(seconds=i // 2),
        messages=messages,
        response=ResponseMeta(
            provider="openai", model=model, model_requested=requested, status=status, error=error
        )
        if source == "gateway"
        else None,
        tags=list(tags),
        metadata=metadata or {},
    )


def _store(engine: Engine, samples: list[Sample]) -> None:
    with Session(engine) as session:
        insert_samples(session, samples)


def _ids(engine: Engine, selection: SampleFilter | None, page_size: int = 3) -> list[str]:
    return [
        s.id
        for s in dataset_select.iter_filtered(
            engine, tenant="acme", selection=selection, page_size=page_size
        )
    ]


def test_keyset_pages_return_every_sample_once_in_a_stable_order(db_engine: Engine) -> None:
    samples = [_sample(i) for i in range(11)] + [_sample(i, tenant="globex") for i in range(4)]
    _store(db_engine, samples)
    expected = [s.id for s in sorted(samples[:11], key=lambda s: (s.created_at, s.id))]
    assert _ids(db_engine, None, page_size=3) == expected
    assert _ids(db_engine, None, page_size=1000) == expected


def test_filter_matches_what_sample_filter_says(db_engine: Engine) -> None:
    samples = [
        _sample(0, tags=("good", "prod")),
        _sample(1, tags=("good",)),
        _sample(2, model="claude-x", requested="claude-x", tags=("good", "prod")),
        _sample(3, metadata={"team": "billing"}, tags=("good", "prod")),
        _sample(4, status="error", tags=("good", "prod")),
        _sample(5, source="upload", ref="file-abc:1", tags=("good", "prod")),
        _sample(40, tags=("good", "prod")),
    ]
    _store(db_engine, samples)
    filters = [
        SampleFilter(tags=["good", "prod"]),
        SampleFilter(models=["gpt-4o"]),  # the requested alias, not the answering snapshot
        SampleFilter(metadata={"team": "billing"}),
        SampleFilter(status="error"),
        SampleFilter(status=None, sources=["gateway"]),
        SampleFilter(since=T0 + timedelta(seconds=1), until=T0 + timedelta(seconds=20)),
    ]
    for selection in filters:
        want = sorted(s.id for s in samples if selection.matches(s))
        assert want, selection
        assert sorted(_ids(db_engine, selection)) == want, selection
        with Session(db_engine) as session:
            counted = dataset_select.count_filtered(session, tenant="acme", selection=selection)
        assert counted >= len(want), selection  # an upper bound: models/metadata in Python


def test_files_select_exactly_their_samples(db_engine: Engine) -> None:
    # file-ab is a prefix of file-abc: the ref marker ends at the colon, so they never mix.
    samples = [_sample(i, source="upload", ref=f"file-ab:{i + 1}") for i in range(3)]
    samples += [_sample(10 + i, source="upload", ref=f"file-abc:{i + 1}") for i in range(2)]
    _store(db_engine, samples)
    with session_scope(db_engine) as session:
        for file_id, count in (("file-ab", 3), ("file-abc", 2)):
            report = orjson.dumps({"samples": count})
            session.add(
                UploadedFile(
                    id=file_id,
                    tenant="acme",
                    filename="x.jsonl",
                    purpose="fine-tune",
                    bytes=1,
                    status="processed",
                    report=report,
                )
            )
        session.add(
            UploadedFile(id="file-new", tenant="acme", filename="y", purpose="fine-tune", bytes=1)
        )
    with Session(db_engine) as session:
        files = dataset_select.check_files(session, tenant="acme", file_ids=["file-ab"])
        with pytest.raises(dataset_select.UnknownFile, match=r"file_ids\[0\].*'file-ab'"):
            dataset_select.check_files(session, tenant="globex", file_ids=["file-ab"])
        with pytest.raises(dataset_select.FileNotReady, match=r"file_ids\[1\].*still"):
            dataset_select.check_files(session, tenant="acme", file_ids=["file-ab", "file-new"])
    selected = list(dataset_select.iter_files(db_engine, tenant="acme", files=files, page_size=2))
    assert sorted(s.source_ref or "" for s in selected) == ["file-ab:1", "file-ab:2", "file-ab:3"]
    assert dataset_select.count_files(db_engine, tenant="acme", files=files) == 3


def _queued(engine: Engine) -> str:
    with session_scope(engine) as session:
        row = dataset_rows.create(
            session, tenant="acme", name="d", base_model=None, spec={"name": "d"}
        )
    return row.id


def test_a_build_is_held_by_one_worker_until_its_heartbeat_goes_stale(db_engine: Engine) -> None:
    dataset_id = _queued(db_engine)
    first = dataset_rows.claim(db_engine, dataset_id, tenant="acme", worker="a", stale_after_s=30)
    assert first.outcome == "claimed"
    # A redelivery while "a" is alive: someone else may not take it.
    assert (
        dataset_rows.claim(
            db_engine, dataset_id, tenant="acme", worker="b", stale_after_s=30
        ).outcome
        == "busy"
    )
    assert dataset_rows.heartbeat(db_engine, dataset_id, worker="a")
    # "a" went quiet (killed): with a stale heartbeat the next delivery takes over.
    with session_scope(db_engine) as session:
        row = session.get(DatasetRow, dataset_id)
        assert row is not None
        row.heartbeat_at = datetime.now(UTC) - timedelta(seconds=60)
        session.add(row)
    taken = dataset_rows.claim(db_engine, dataset_id, tenant="acme", worker="b", stale_after_s=30)
    assert taken.outcome == "claimed"
    assert taken.row is not None
    assert taken.row.attempts == 2
    # The old holder can no longer touch the row, nor finish it.
    assert not dataset_rows.heartbeat(db_engine, dataset_id, worker="a")
    built = Built("v1", "s3://b/v1", 8, 2, {"train": 8}, {"steps": []})
    assert not dataset_rows.finish_built(db_engine, dataset_id, worker="a", built=built)
    assert dataset_rows.finish_built(db_engine, dataset_id, worker="b", built=built)
    # A redelivered request for a built dataset changes nothing.
    again = dataset_rows.claim(db_engine, dataset_id, tenant="acme", worker="c", stale_after_s=0)
    assert again.outcome == "done"
    assert again.row is not None
    assert again.row.attempts == 2
    assert again.row.version == "v1"
    for dataset, tenant in (("ds_nope", "acme"), (dataset_id, "globex")):
        missing = dataset_rows.claim(db_engine, dataset, tenant=tenant, worker="c", stale_after_s=0)
        assert missing.outcome == "missing"


def test_a_released_build_is_claimable_at_once(db_engine: Engine) -> None:
    dataset_id = _queued(db_engine)
    assert dataset_rows.claim(
        db_engine, dataset_id, tenant="acme", worker="a", stale_after_s=30
    ).outcome == ("claimed")
    assert dataset_rows.release(db_engine, dataset_id, worker="a")
    assert dataset_rows.claim(
        db_engine, dataset_id, tenant="acme", worker="b", stale_after_s=30
    ).outcome == ("claimed")


def test_list_pages_newest_first_per_tenant(db_engine: Engine) -> None:
    ids = [_queued(db_engine) for _ in range(5)]
    with session_scope(db_engine) as session:
        dataset_rows.create(session, tenant="globex", name="g", base_model=None, spec={})
    seen: list[str] = []
    after = None
    while True:
        with Session(db_engine) as session:
            rows, more = dataset_rows.list_page(session, tenant="acme", limit=2, after=after)
        seen += [row.id for row in rows]
        if not more:
            break
        after = rows[-1].id
    assert sorted(seen) == sorted(ids)
    assert len(seen) == 5
    with Session(db_engine) as session, pytest.raises(LookupError):
        dataset_rows.list_page(session, tenant="globex", limit=2, after=ids[0])


def test_purposed_and_eval_run_samples_are_selected_only_when_asked_for(
    db_engine: Engine,
) -> None:
    samples = [
        _sample(0, tags=("prod",)),
        _sample(1, tags=("prod", "purpose:judge")),
        _sample(2, tags=("prod", "purpose:shadow")),
        _sample(3, tags=("purpose:judge",)),
        # An eval run's calls (made with the caller's key, so not purposed): never trained on
        # unless named.
        _sample(4, tags=("prod", "eval_run:evalrun_1")),
    ]
    _store(db_engine, samples)
    wanted = [
        (SampleFilter(), [0]),
        (SampleFilter(include_purposes=["judge"]), [0, 1, 3]),
        (SampleFilter(include_purposes=["judge", "shadow"], tags=["prod"]), [0, 1, 2]),
        (SampleFilter(tags=["purpose:shadow"]), [2]),  # naming it as a tag asks for it too
        (SampleFilter(tags=["eval_run:evalrun_1"]), [4]),
    ]
    for selection, indexes in wanted:
        want = sorted(samples[i].id for i in indexes)
        assert sorted(s.id for s in samples if selection.matches(s)) == want, selection
        assert sorted(_ids(db_engine, selection)) == want, selection
        with Session(db_engine) as session:
            counted = dataset_select.count_filtered(session, tenant="acme", selection=selection)
        assert counted == len(want), selection


def test_include_purposes_must_be_purpose_slugs() -> None:
    with pytest.raises(ValueError, match=r"include_purposes\[1\]: 'Judge!' is not 1-32"):
        SampleFilter(include_purposes=["shadow", "Judge!"])
