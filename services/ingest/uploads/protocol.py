"""The uploads API's answers: OpenAI's file object (with our import report once there is one), its
list and its deletion, and a streamed import's report."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from services.ingest.models import UploadedFile
from services.ingest.uploads import files as uploads
from services.ingest.uploads.formats import ImportReport


class FileObject(BaseModel):
    """OpenAI's file object; `import_report` only once the file is processed."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int = Field(description="unix seconds")
    filename: str
    purpose: str
    status: str
    status_details: str | None
    import_report: dict[str, Any] | None = Field(
        default=None, exclude_if=lambda report: report is None
    )

    @classmethod
    def of(cls, row: UploadedFile) -> FileObject:
        return cls.model_validate(uploads.file_object(row))


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class RejectedLine(BaseModel):
    line: int
    reason: str = Field(description="naming the field at fault where there is one")
    format: str | None = Field(description="the format the line was read as, if it got that far")


class ImportResult(BaseModel):
    """The report of `POST /v1/samples/import`: every rejected line is at `errors_url`."""

    import_id: str
    total_lines: int
    blank_lines: int
    accepted_lines: int
    rejected_lines: int
    samples: int
    formats: dict[str, int]
    errors: list[RejectedLine] = Field(description="the first 1,000 rejected lines")
    errors_truncated: bool
    errors_url: str | None
    dropped: dict[str, int] = Field(description="what the samples do not carry, by reason")
    status_details: str

    @classmethod
    def of(cls, import_id: str, report: ImportReport) -> ImportResult:
        return cls.model_validate({"import_id": import_id, **report.to_dict()})
