"""Move inline media (base64 images, audio, files) out of samples into object storage.

Content-addressed under the tenant's prefix, so the same image sent a thousand times is stored
once per tenant and never readable through another tenant's sample. The sample keeps an s3://
reference, the mime type and the sha256 of the bytes.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from shared.chat import MediaPart, Sample
from shared.storage import ObjectStore


def media_key(tenant: str, sha256: str) -> str:
    return f"tenants/{tenant}/media/{sha256[:2]}/{sha256}"


def _offload(part: MediaPart, tenant: str, store: ObjectStore, known: set[str]) -> MediaPart:
    assert part.data is not None
    raw = base64.b64decode(part.data)
    digest = hashlib.sha256(raw).hexdigest()
    key = media_key(tenant, digest)
    if key not in known and not store.exists(key):
        store.put_bytes(key, raw, content_type=part.mime_type or "application/octet-stream")
    known.add(key)
    return part.model_copy(update={"data": None, "ref": store.uri(key), "sha256": digest})


def offload_media(sample: Sample, store: ObjectStore, known: set[str] | None = None) -> Sample:
    """The sample with every inline media part replaced by a reference (blocking: run in a thread)."""
    known = set() if known is None else known
    changed = False
    messages: list[Any] = []
    for message in sample.messages:
        content: list[Any] = []
        for part in message.content:
            if isinstance(part, MediaPart) and part.data is not None:
                content.append(_offload(part, sample.tenant, store, known))
                changed = True
            else:
                content.append(part)
        messages.append(message.model_copy(update={"content": content}))
    return sample.model_copy(update={"messages": messages}) if changed else sample
