"""The hoster's domain errors: each carries its HTTP status; api.py maps them in one place."""

from __future__ import annotations

from typing import Any


class HosterError(Exception):
    status = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(HosterError):
    status = 404


class Conflict(HosterError):
    """E.g. deploying a version the gate rejected; `details` holds its numbers."""

    status = 409


class BadRequest(HosterError):
    status = 422


class EngineFailed(HosterError):
    """An engine did not start or did not answer; the message carries its log's tail."""

    status = 502


class ArtifactFailed(HosterError):
    """A checkpoint could not be pulled, verified or merged."""

    status = 502


class NotReady(HosterError):
    """A deployment still loading when its caller stopped waiting (a wake); try again."""

    status = 503
