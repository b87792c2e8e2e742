"""`x-tuneloop-purpose`: the platform's own calls through the gateway, tagged with why they
were made (a judge's verdict, shadow traffic, an eval), so dataset builds can leave them out.

Only an `internal` key may send the header (shared.auth); the captured sample then carries the
tag `purpose:<value>`, which `GET /v1/samples?tag=purpose:judge` and dataset filters see. The
`purpose:` tag prefix is reserved for it: `x-tuneloop-tags` cannot set one.
"""

from __future__ import annotations

import re

from shared.auth import Principal

PURPOSE_HEADER = b"x-tuneloop-purpose"
TAG_PREFIX = "purpose:"
# An eval run's calls (the evaluator's Evals API) are made with the caller's own key, so they
# cannot name a purpose; they carry `eval_run:<run id>` instead, and dataset builds leave them
# out as they leave out purposed calls: a model must never train on its own eval answers.
EVAL_RUN_PREFIX = "eval_run:"
# Tags that mark the platform's own traffic: left out of dataset builds unless asked for.
PLATFORM_PREFIXES = (TAG_PREFIX, EVAL_RUN_PREFIX)
# A short slug: `judge`, `shadow`, `eval`, `eval-gate`.
_SLUG = re.compile(r"[a-z][a-z0-9_-]{0,31}")
SLUG_RULE = "1-32 lowercase letters, digits, - or _, starting with a letter"


class PurposeRefused(Exception):
    """The purpose header (or a reserved tag) cannot be accepted; `status` is 400 or 403 and
    the message names the header."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def is_purpose(value: str) -> bool:
    return _SLUG.fullmatch(value) is not None


def purpose_tag(headers: list[tuple[bytes, bytes]], principal: Principal) -> str | None:
    """The `purpose:<value>` tag of a call, None when it names no purpose; raises
    PurposeRefused when a key other than an internal one sends it, or the value is malformed."""
    values = [value for name, value in headers if name == PURPOSE_HEADER]
    if not values:
        return None
    header = PURPOSE_HEADER.decode()
    if not principal.may("internal"):
        raise PurposeRefused(
            403, f"{header}: only an API key with scope 'internal' may send it; this key has "
            f"scope {principal.scope!r}",
        )  # fmt: skip
    value = values[0].decode("latin-1").strip()
    if len(values) > 1 or not is_purpose(value):
        raise PurposeRefused(400, f"{header}: {value[:40]!r} must be one value of {SLUG_RULE}")
    return TAG_PREFIX + value


def check_tags(tags: list[str]) -> None:
    """A caller's own tags may not pose as a purpose (raises PurposeRefused, 400)."""
    reserved = next((tag for tag in tags if tag.startswith(TAG_PREFIX)), None)
    if reserved is not None:
        raise PurposeRefused(
            400, f"x-tuneloop-tags: {reserved[:40]!r} uses the reserved prefix {TAG_PREFIX!r}; "
            "platform calls send x-tuneloop-purpose with an internal key",
        )  # fmt: skip
