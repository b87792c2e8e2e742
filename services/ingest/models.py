"""Tables owned by the ingest service: captured samples and their tags, feedback on them,
uploaded files, datasets, eval sets.

The sample itself is stored whole as canonical JSON (`body`); the other columns exist to filter
and page without parsing it. Tags get their own table so "every sample tagged X" is an index
lookup on every backend.
"""

import builtins
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from shared.db import UTCDateTime, utcnow


class SampleRow(SQLModel, table=True):
    __tablename__ = "ingest_samples"
    __table_args__ = (sa.Index("ix_ingest_samples_tenant_created", "tenant", "created_at", "id"),)

    id: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(max_length=63)
    source: str = Field(max_length=16)
    provider: str | None = Field(default=None, max_length=16)
    model: str | None = Field(default=None, max_length=200, index=True)
    status: str = Field(default="ok", max_length=16)
    finish_reason: str | None = Field(default=None, max_length=32)
    # A sample id seen again with more messages replaces the stored one (a trace that arrived in
    # several OTLP exports grows); with the same or fewer, nothing changes.
    message_count: int = 0
    created_at: datetime = Field(sa_type=UTCDateTime)
    ingested_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    body: bytes = Field(sa_type=sa.LargeBinary)


class SampleTag(SQLModel, table=True):
    __tablename__ = "ingest_sample_tags"
    __table_args__ = (sa.Index("ix_ingest_sample_tags_tenant_tag", "tenant", "tag"),)

    sample_id: str = Field(
        primary_key=True, foreign_key="ingest_samples.id", ondelete="CASCADE", max_length=64
    )
    tag: str = Field(primary_key=True, max_length=128)
    tenant: str = Field(max_length=63)


class FeedbackRow(SQLModel, table=True):
    """Feedback on a sample (POST /v1/feedback): a score and/or a label, and a comment. Every
    one is kept; selection reads a sample's newest label and newest score (feedback/store.py).
    No foreign key to the sample: feedback may arrive before the shipper has stored it."""

    __tablename__ = "ingest_feedback"
    __table_args__ = (sa.Index("ix_ingest_feedback_tenant_sample", "tenant", "sample_id"),)

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(max_length=63)
    sample_id: str = Field(max_length=64)
    score: float | None = None
    label: str | None = Field(default=None, max_length=64)
    comment: str | None = Field(default=None, max_length=2000)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class UploadedFile(SQLModel, table=True):
    """A file uploaded through POST /v1/files (OpenAI files API shape); its bytes live in S3."""

    __tablename__ = "ingest_files"
    __table_args__ = (
        sa.Index("ix_ingest_files_tenant_created", "tenant", "created_at"),
        # Every process's sweep looks for unfinished files; nearly all rows are finished.
        sa.Index("ix_ingest_files_status", "status"),
    )

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(max_length=63)
    filename: str = Field(max_length=255)
    purpose: str = Field(max_length=32)
    bytes: int
    format: str = Field(default="auto", max_length=32)
    # uploaded -> processing -> processed | error
    status: str = Field(default="uploaded", max_length=16)
    status_details: str | None = Field(default=None, max_length=2000)
    # The import report (accepted, rejected lines with reasons, ...) once processed, as JSON.
    # builtins.bytes: the class's own `bytes` field (the file's size) shadows the type here.
    report: builtins.bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # Which process works the file (host:pid:random) and until when: it renews the lease while
    # it works, so a file whose lease ran out belonged to a process that died and is taken over.
    lease_owner: str | None = Field(default=None, max_length=128)
    lease_expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # Claims that did not end in a handed-back lease or an outcome: a file whose every worker
    # dies (one that takes its process down) is given up after TUNELOOP_INGEST_UPLOAD_MAX_ATTEMPTS.
    attempts: int = Field(default=0, sa_column_kwargs={"server_default": "0"})


class DatasetRow(SQLModel, table=True):
    """A dataset build (POST /v1/datasets): its spec, where the build is, and its outcome.

    The snapshot itself lives in object storage; this row says which version is the dataset's,
    and it flips to `built` only after that version's commit marker is written.
    """

    __tablename__ = "ingest_datasets"
    __table_args__ = (sa.Index("ix_ingest_datasets_tenant_created", "tenant", "created_at", "id"),)

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(max_length=63)
    name: str = Field(max_length=200)
    # The tokenizer the build counts tokens with (a local directory or s3:// prefix); None: an
    # approximate count.
    base_model: str | None = Field(default=None, max_length=1000)
    # queued -> building -> built | failed
    status: str = Field(default="queued", max_length=16)
    # The request's DatasetSpec, as JSON.
    spec: bytes = Field(sa_type=sa.LargeBinary)
    # The build's latest step and the steps done so far, as JSON.
    progress: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    # Which worker holds the build and when it last said so: a build whose worker went quiet
    # is taken over by the next delivery of its event.
    claimed_by: str | None = Field(default=None, max_length=64)
    heartbeat_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    attempts: int = 0
    version: str | None = Field(default=None, max_length=128)
    uri: str | None = Field(default=None, max_length=1000)
    train_count: int | None = None
    eval_count: int | None = None
    stats: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    report: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    error: str | None = Field(default=None, max_length=2000)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class FidelityCount(SQLModel, table=True):
    """Running totals of the fidelity report (capture/fidelity.py), summed over every ingest process
    and restart: each process adds what it counted since its last flush."""

    __tablename__ = "ingest_fidelity"

    tenant: str = Field(primary_key=True, max_length=63)
    source: str = Field(primary_key=True, max_length=16)
    # samples | rejected | dropped; `reason` is "" for samples.
    kind: str = Field(primary_key=True, max_length=16)
    reason: str = Field(primary_key=True, max_length=200)
    count: int = Field(default=0, sa_type=sa.BigInteger)


class EvalSetRow(SQLModel, table=True):
    """A tenant's eval set (POST /v1/eval_sets): a sample filter and how many of its most
    recent samples a refresh takes. Each refresh is a new immutable version (the next table)."""

    __tablename__ = "ingest_eval_sets"
    __table_args__ = (sa.Index("ix_ingest_eval_sets_tenant_created", "tenant", "created_at", "id"),)

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(max_length=63)
    name: str = Field(max_length=200)
    # The SampleFilter, as JSON.
    source: bytes = Field(sa_type=sa.LargeBinary)
    size: int
    # The caller's string pairs, as JSON (`metadata` is SQLModel's own attribute).
    meta: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    # 0 until the first refresh.
    latest_version: int = 0
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    refreshed_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class EvalSetVersionRow(SQLModel, table=True):
    """One refresh of an eval set: never changed once written."""

    __tablename__ = "ingest_eval_set_versions"

    eval_set_id: str = Field(primary_key=True, max_length=40)
    version: int = Field(primary_key=True)
    tenant: str = Field(max_length=63)
    item_count: int
    # What the refresh looked at and left out, as JSON.
    report: bytes = Field(sa_type=sa.LargeBinary)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class EvalSetItemRow(SQLModel, table=True):
    """A sample held by an eval set version, scrubbed as datasets are. Every dataset build of the
    tenant leaves out samples with this id or this prompt (eval_sets.hold_out)."""

    __tablename__ = "ingest_eval_set_items"
    __table_args__ = (sa.Index("ix_ingest_eval_set_items_tenant", "tenant"),)

    eval_set_id: str = Field(primary_key=True, max_length=40)
    version: int = Field(primary_key=True)
    position: int = Field(primary_key=True)
    tenant: str = Field(max_length=63)
    sample_id: str = Field(max_length=64)
    # cleaning.text.prompt_key of the sample as captured (hex): the split's one-side rule.
    prompt_key: str = Field(max_length=32)
    # The scrubbed sample, canonical JSON.
    body: bytes = Field(sa_type=sa.LargeBinary)
