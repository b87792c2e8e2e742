"""Content parts of a chat message (text, image, audio, file), discriminated on `type`."""

from __future__ import annotations

import base64
import binascii
import hashlib
import unicodedata
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

_SHA256_HEX = r"^[0-9a-f]{64}$"


class ChatModel(BaseModel):
    """Base of the canonical models: an unknown field is an error, so a typo never passes."""

    model_config = ConfigDict(extra="forbid")


class TextPart(ChatModel):
    type: Literal["text"] = "text"
    text: str

    def canonical(self) -> dict[str, Any]:
        """What identifies this part for exact dedup: NFC text without surrounding whitespace."""
        return {"type": "text", "text": unicodedata.normalize("NFC", self.text).strip()}


def parse_data_uri(uri: str) -> tuple[str | None, str]:
    """Split `data:<mime>;base64,<payload>` into (mime type or None, base64 payload)."""
    header, comma, payload = uri.removeprefix("data:").partition(",")
    if not comma or not header.endswith(";base64"):
        raise ValueError("url: a data URI must look like 'data:<mime>;base64,<data>'")
    mime = header.removesuffix(";base64").split(";")[0]
    return (mime or None), payload


class MediaPart(ChatModel):
    """Bytes that live in exactly one place: our object store (`ref`, an s3:// URI, after
    ingest moves them out), a remote `url`, or inline standard base64 `data`.

    `sha256` is of the raw bytes, so an image keeps its identity when ingest moves it from
    `data` to `ref`. A `data:` URI given as `url` is split into `data` + `mime_type`.
    """

    source_fields: ClassVar[tuple[str, ...]] = ("ref", "url", "data")

    ref: str | None = None
    url: str | None = None
    data: str | None = None
    mime_type: str | None = None
    sha256: str | None = Field(default=None, pattern=_SHA256_HEX)

    @model_validator(mode="before")
    @classmethod
    def _split_data_uri(cls, value: Any) -> Any:
        if isinstance(value, dict):
            url = value.get("url")
            if isinstance(url, str) and url.startswith("data:") and value.get("data") is None:
                mime, data = parse_data_uri(url)
                return {
                    **value,
                    "url": None,
                    "data": data,
                    "mime_type": value.get("mime_type") or mime,
                }
        return value

    @model_validator(mode="after")
    def _check_source(self) -> Self:
        given = [name for name in self.source_fields if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"{type(self).__name__} needs exactly one of {', '.join(self.source_fields)}; "
                f"got {', '.join(given) or 'none'}"
            )
        if self.ref is not None and not self.ref.startswith("s3://"):
            raise ValueError(f"ref must be an s3:// URI, got {self.ref[:60]!r}")
        if self.data is not None:
            if not self.mime_type:
                raise ValueError("mime_type is required with inline data")
            try:
                base64.b64decode(self.data, validate=True)
            except binascii.Error as exc:
                raise ValueError(
                    f"data must be standard base64 (ingest converts url-safe): {exc}"
                ) from None
        return self

    def content_sha256(self) -> str | None:
        """sha256 of the raw bytes: the stored one, else computed from inline data."""
        if self.sha256 is not None:
            return self.sha256
        if self.data is not None:
            return hashlib.sha256(base64.b64decode(self.data)).hexdigest()
        return None

    def as_uri(self) -> str | None:
        """The bytes as one URI: the s3 ref, the remote URL or a data URI (None for a file id)."""
        if self.data is not None:
            return f"data:{self.mime_type};base64,{self.data}"
        return self.ref or self.url

    def canonical(self) -> dict[str, Any]:
        kind = getattr(self, "type", "media")
        return {"type": kind, "bytes": self.content_sha256() or self.as_uri() or ""}


class ImagePart(MediaPart):
    type: Literal["image"] = "image"
    detail: Literal["auto", "low", "high"] | None = None


class AudioPart(MediaPart):
    type: Literal["audio"] = "audio"


class FilePart(MediaPart):
    """A document (PDF, ...); may also be a provider-side `file_id` the bytes never left."""

    source_fields: ClassVar[tuple[str, ...]] = ("ref", "url", "data", "file_id")

    type: Literal["file"] = "file"
    file_id: str | None = None
    filename: str | None = None

    def canonical(self) -> dict[str, Any]:
        return {"type": "file", "bytes": self.content_sha256() or self.as_uri() or self.file_id}


ContentPart = Annotated[TextPart | ImagePart | AudioPart | FilePart, Field(discriminator="type")]
PART_TYPES = frozenset({"text", "image", "audio", "file"})
