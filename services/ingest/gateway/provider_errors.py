"""Errors in each provider's own shape, so an official SDK raises its usual exception type.

OpenAI:    {"error": {"message", "type", "param", "code"}}
Anthropic: {"type": "error", "error": {"type", "message"}}
Gemini:    {"error": {"code", "message", "status"}}
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from services.ingest.gateway.routing import Api

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_denied_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    502: "api_error",
    503: "api_error",
    504: "api_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
}
_GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    413: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_body(
    api: Api, status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    if api == "anthropic":
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message},
        }
    if api == "gemini":
        return {
            "error": {
                "code": status,
                "message": message,
                "status": _GOOGLE_STATUS.get(status, "UNKNOWN"),
            }
        }
    return {
        "error": {
            "message": message,
            "type": _OPENAI_TYPES.get(status, "api_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(
    api: Api, status: int, message: str, *, code: str | None = None, param: str | None = None
) -> JSONResponse:
    return JSONResponse(
        error_body(api, status, message, code=code, param=param), status_code=status
    )


def model_not_found(api: Api, model: str, *, path: str = "") -> JSONResponse:
    """The provider's 404 for an unknown model. `path`: the Gemini path called, whose API
    version (`v1`, `v1beta`) and method the message names, as Gemini's own does."""
    if api == "gemini":
        version, method = _gemini_version_and_method(path)
        message = (
            f"models/{model} is not found for API version {version}, or is not supported for "
            f"{method}."
        )
    elif api == "anthropic":
        message = f"model: {model}"
    else:
        message = f"The model `{model}` does not exist or you do not have access to it."
    return error_response(api, 404, message, code="model_not_found")


def _gemini_version_and_method(path: str) -> tuple[str, str]:
    """`/v1/models/m:streamGenerateContent` -> ("v1", "streamGenerateContent"); the API's
    defaults (v1beta, generateContent) for what does not say."""
    first = path.lstrip("/").partition("/")[0]
    version = first if first.startswith("v") and first[1:2].isdigit() else "v1beta"
    method = path.rpartition(":")[2] if ":" in path else ""
    return version, method if method.isalpha() else "generateContent"
