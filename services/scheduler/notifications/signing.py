"""Webhook signatures as Standard Webhooks defines them (standardwebhooks.com), so a receiver
verifies with any of its libraries, or in a few lines of its own.

    webhook-id:        the delivery's id (the same on every retry: deduplicate on it)
    webhook-timestamp: Unix seconds of this attempt
    webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">

keyed with the base64-decoded part of the rule's secret after `whsec_`. A rule's secret is not
stored: it is derived from the scheduler's own secret (TUNELOOP_SCHEDULER_WEBHOOK_SECRET), the
rule's id and its secret version, as each job's webhook secret is; rotating a rule's secret
raises its version.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret


def rule_key(server_secret: str, rule_id: str, version: int) -> bytes:
    """The rule's 32-byte signing key."""
    message = f"tuneloop-notification-rule:{rule_id}:{version}".encode()
    return hmac.new(server_secret.encode(), message, hashlib.sha256).digest()


def secret_text(key: bytes) -> str:
    """The secret as the tenant is given it once (`whsec_` + base64)."""
    return SECRET_PREFIX + base64.b64encode(key).decode()


def signature(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def headers(
    key: bytes, message_id: str, body: bytes, *, timestamp: int | None = None
) -> dict[str, str]:
    """The three headers that authenticate `body`; send them with exactly these bytes."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        ID_HEADER: message_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signature(key, message_id, timestamp, body),
    }
