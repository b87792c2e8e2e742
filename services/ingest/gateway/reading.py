"""What the gateway reads off a proxied call before forwarding it: the caller's key (any of the
SDKs' places for it), the model from the body, a Gemini path's method, the caller's tags."""

from __future__ import annotations

from urllib.parse import parse_qsl

import orjson
from starlette.responses import Response

from services.ingest.gateway.provider_errors import error_response
from services.ingest.gateway.purpose import PurposeRefused
from services.ingest.gateway.routes import GEMINI_ACTIONS
from services.ingest.gateway.routing import VERSION_TAG_PREFIX, Api

# Both samples of a mirrored call carry `shadow_pair:<id>`; the shadow's also `purpose:shadow`,
# so dataset builds leave it out unless asked (services/ingest/gateway/purpose.py).
SHADOW_PAIR_PREFIX = "shadow_pair:"


def gemini_method(model_action: str) -> tuple[str, bool] | Response:
    """`<model>:<action>` of a Gemini path -> (model, whether the call is captured), or the
    404 Gemini gives for a method it does not have."""
    model, _, action = model_action.rpartition(":")
    captured = GEMINI_ACTIONS.get(action)
    if model and captured is not None:
        return model, captured
    methods = ", ".join(f":{name}" for name in GEMINI_ACTIONS)
    return error_response(
        "gemini", 404, f"unknown method {model_action!r}: use <model> followed by one of {methods}"
    )


def check_version_tags(tags: list[str]) -> None:
    """A caller's own tags may not pose as the version of a deployment or a shadow pair (raises
    400)."""
    for prefix in (VERSION_TAG_PREFIX, SHADOW_PAIR_PREFIX):
        reserved = next((tag for tag in tags if tag.startswith(prefix)), None)
        if reserved is not None:
            raise PurposeRefused(
                400,
                f"x-tuneloop-tags: {reserved[:40]!r} uses the reserved prefix {prefix!r}; the "
                "gateway tags the answers of a deployed model with its version and shadow pair",
            )


def presented_call_key(headers: list[tuple[bytes, bytes]], query: str) -> str | None:
    """`shared.auth.presented_key` on raw ASGI headers: Bearer, x-api-key, x-goog-api-key, ?key=."""
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        if name in (b"authorization", b"x-api-key", b"x-goog-api-key") and name not in found:
            found[name] = value
    scheme, _, credentials = found.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    for name in (b"x-api-key", b"x-goog-api-key"):
        presented = found.get(name, b"").decode("latin-1").strip()
        if presented:
            return presented
    if "key=" not in query:
        return None
    query_key = dict(parse_qsl(query)).get("key", "").strip()
    return query_key or None


def model_from_body(body: bytes, api: Api, *, required: bool = True) -> str | Response | None:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return error_response(api, 400, f"request body is not valid JSON: {exc}")
    if not isinstance(document, dict):
        return error_response(api, 400, "request body must be a JSON object")
    model = document.get("model")
    if model is None and not required:
        return None
    if not isinstance(model, str) or not model:
        message = "model: required, a non-empty string" if required else "model: a non-empty string"
        return error_response(api, 400, message, param="model")
    return model
