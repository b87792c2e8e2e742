"""Ingest's refusals: each carries its HTTP status and a message naming the field, line or object
at fault. Domain code and routes raise them; one handler (api.ingest_error) answers every one as
`{"detail": message}` with its status, the body FastAPI's HTTPException gives."""

from __future__ import annotations


class IngestError(Exception):
    status = 500

    def __init__(self, detail: str, *, status: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status


class BadRequest(IngestError):
    status = 400


class Unauthorized(IngestError):
    status = 401


class Forbidden(IngestError):
    status = 403


class NotFound(IngestError):
    status = 404


class Conflict(IngestError):
    status = 409


class TooLarge(IngestError):
    status = 413


class Unprocessable(IngestError):
    status = 422


class Unavailable(IngestError):
    status = 503
