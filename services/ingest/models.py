"""Tables owned by the ingest service: captured samples and their tags.

The sample itself is stored whole as canonical JSON (`body`); the other columns exist to filter
and page without parsing it. Tags get their own table so "every sample tagged X" is an index
lookup on every backend.
"""

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


class UploadedFile(SQLModel, table=True):
    """A file uploaded through POST /v1/files (OpenAI files API shape); its bytes live in S3."""

    __tablename__ = "ingest_files"
    __table_args__ = (sa.Index("ix_ingest_files_tenant_created", "tenant", "created_at"),)

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
    report: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
