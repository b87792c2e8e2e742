"""Media parts from provider payloads: inline base64 (made standard, its MIME type checked
against the bytes) and remote URLs, as canonical image / audio / file parts."""

from __future__ import annotations

import base64
import binascii
from typing import Literal

from services.ingest.normalize import NormalizeError
from services.ingest.normalize._sample import Notes, build
from shared.chat import AudioPart, FilePart, ImagePart, parse_data_uri

MediaKind = Literal["image", "audio", "file"]
Media = ImagePart | AudioPart | FilePart

_URL_SAFE = str.maketrans("-_", "+/")
# Enough base64 for every signature below (32 chars -> 24 bytes, no padding inside).
_SNIFF_CHARS = 32
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
)
# Labels that name the same type as what sniffing finds: not a mismatch worth a note.
_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png"}


def standard_base64(data: str, path: str) -> str:
    """`data` as standard, padded base64. Gemini SDKs send URL-safe base64 (`-`, `_`, ge04) and
    some clients wrap lines or leave padding off; the canonical schema takes standard only."""
    try:
        base64.b64decode(data, validate=True)
        return data
    except ValueError:  # binascii.Error, or non-ASCII text
        pass
    cleaned = "".join(data.split()).translate(_URL_SAFE).rstrip("=")
    cleaned += "=" * (-len(cleaned) % 4)
    try:
        base64.b64decode(cleaned, validate=True)
    except ValueError as exc:
        raise NormalizeError(path, f"is not base64 ({exc})") from None
    return cleaned


def sniff_mime(data: str) -> str | None:
    """The MIME type the first bytes of standard base64 `data` show, if it is a common one."""
    try:
        head = base64.b64decode(data[:_SNIFF_CHARS])
    except (binascii.Error, ValueError):
        return None
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((mime for magic, mime in _SIGNATURES if head.startswith(magic)), None)


def kind_of(mime: str | None) -> MediaKind:
    if mime and mime.startswith("image/"):
        return "image"
    if mime and mime.startswith("audio/"):
        return "audio"
    return "file"


def _checked_mime(data: str, declared: str | None, path: str, notes: Notes) -> str:
    """The declared MIME type, unless the bytes say otherwise (an02 labels a JPEG image/png):
    then what the bytes are, with the mismatch noted. A consumer decoding by label would fail."""
    label = declared.strip().lower() if declared else None
    label = _ALIASES.get(label, label) if label else None
    sniffed = sniff_mime(data)
    if sniffed is not None and sniffed != label:
        if label is not None:
            notes.drop(path, f"declared {declared!r} but the bytes are {sniffed}; kept {sniffed}")
        return sniffed
    if label is None:
        raise NormalizeError(path, "is required: the bytes are not of a type we recognise")
    return label


def inline_media(
    data: str,
    declared_mime: str | None,
    *,
    path: str,
    mime_path: str,
    notes: Notes,
    kind: MediaKind | None = None,
    **extra: str | None,
) -> Media | None:
    """A part holding base64 `data`; `kind` None picks it from the MIME type. Empty data is
    dropped with a note: a part without bytes says nothing."""
    data = standard_base64(data, path)
    if not data:
        notes.drop(path, "empty inline data")
        return None
    mime = _checked_mime(data, declared_mime, mime_path, notes)
    return media(kind or kind_of(mime), path, data=data, mime_type=mime, **extra)


def data_uri_media(
    uri: str, *, path: str, notes: Notes, kind: MediaKind, **extra: str | None
) -> Media | None:
    """A part from a `data:<mime>;base64,<data>` URI."""
    try:
        mime, data = parse_data_uri(uri)
    except ValueError as exc:
        raise NormalizeError(path, str(exc).removeprefix("url: ")) from None
    return inline_media(data, mime, path=path, mime_path=path, notes=notes, kind=kind, **extra)


def media(kind: MediaKind, path: str, **fields: str | None) -> Media:
    """An image, audio or file part; `fields` are those of MediaPart (url, data, mime_type...)."""
    if kind == "image":
        return build(ImagePart, path, **fields)
    if kind == "audio":
        return build(AudioPart, path, **fields)
    return build(FilePart, path, **fields)


def url_media(
    url: str, *, path: str, notes: Notes, kind: MediaKind, **extra: str | None
) -> Media | None:
    """A part for a remote URL, or for inline bytes when the URL is a data: URI."""
    if url.startswith("data:"):
        return data_uri_media(url, path=path, notes=notes, kind=kind, **extra)
    if not url.strip():
        raise NormalizeError(path, "must not be empty")
    return media(kind, path, url=url, **extra)
