"""Deterministic identities: sample ids derived from where a sample came from, and content
fingerprints for exact dedup. Both hash canonical JSON, so they never change across processes."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import orjson

# uuid5(NAMESPACE_URL, "https://tuneloop.dev/ns/sample"). Fixed forever: changing it changes
# every derived sample id.
SAMPLE_ID_NAMESPACE = uuid.UUID("e2f4f03f-0070-5ad8-90f9-3ed44dea81a8")
_NAMESPACE_BYTES = SAMPLE_ID_NAMESPACE.bytes


def canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted keys: equal values give equal bytes."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def derive_sample_id(tenant: str, source: str, source_ref: str, choice_index: int = 0) -> str:
    """The id of the sample made from one upstream exchange (and one of its choices).

    Ingesting the same exchange twice (a retried upload, a redelivered event) gives the same id,
    so the store can upsert instead of duplicating.
    """
    name = canonical_json([tenant, source, source_ref, choice_index])
    # uuid5 by hand (sha1 of namespace + name, version and variant bits set), formatted as
    # str(uuid.UUID) does: the same id at a third of the cost of building the UUID object.
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + name, usedforsecurity=False).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def fingerprint(value: Any) -> str:
    """sha256 hex of the canonical JSON of `value`."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
