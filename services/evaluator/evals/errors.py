"""The one exception the Evals API's domain raises: an HTTP status, a message that names the
field, and the field (OpenAI's `param`); api.py turns it into OpenAI's error body."""

from __future__ import annotations


class EvalsError(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code or _CODES.get(status, "invalid_request")


_CODES = {
    400: "invalid_value",
    404: "not_found",
    409: "conflict",
    413: "too_large",
    422: "invalid_value",
}


def not_found(kind: str, ident: str, param: str) -> EvalsError:
    """Another tenant's object is as absent as one that does not exist."""
    return EvalsError(404, f"{param}: no {kind} {ident!r}", param=param)


def unsupported(param: str, what: str) -> EvalsError:
    return EvalsError(422, f"{param}: {what} is not supported by tuneloop", param=param,
                      code="unsupported_value")  # fmt: skip
