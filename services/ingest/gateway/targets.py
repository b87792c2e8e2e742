"""The request target the gateway sends on: the client's path as it sent it, checked first.

A decoded path must never reach another server's request line: `%0d%0a` in a response id would
split it into header lines next to the operator's provider key. So upstreams and the relayed
services get the raw path (percent-encoded, as the client wrote it), and a target that decodes
to anything a path or query never legitimately holds is refused with a 400 naming it.
"""

from __future__ import annotations

from urllib.parse import quote_from_bytes, unquote_to_bytes

# Control characters (C0 and DEL) and the space: never part of a resource name.
_CONTROL = frozenset(range(0x20)) | {0x7F}
_CONTROL_OR_SPACE = _CONTROL | {0x20}
# Everything printable in ASCII stays as written (percent escapes included); the rest is escaped.
_PRINTABLE = bytes(range(0x21, 0x7F)).decode("ascii")


class BadTarget(ValueError):
    """A path or query that is not sent on (maps to 400); the message names it."""


def checked_path(raw_path: bytes) -> str:
    """The path to send on: the raw path with any byte outside printable ASCII percent-encoded.
    Raises BadTarget when its raw or decoded form holds a control character or a space, or a
    `.`/`..` segment (the next server, or its HTTP client, would resolve it to another path)."""
    decoded = unquote_to_bytes(raw_path)
    shown = _shown(raw_path)
    if _CONTROL_OR_SPACE.intersection(raw_path) or _CONTROL_OR_SPACE.intersection(decoded):
        raise BadTarget(f"path {shown}: control characters and spaces are not allowed")
    if any(segment in (b".", b"..") for segment in decoded.split(b"/")):
        raise BadTarget(f"path {shown}: '.' and '..' segments are not allowed")
    return quote_from_bytes(raw_path, safe=_PRINTABLE)


def checked_query(raw_query: bytes) -> str:
    """The query to send on, like `checked_path`. Decoded, it may hold spaces (`+` and `%20` are
    how a query writes them) but no control character."""
    if _CONTROL_OR_SPACE.intersection(raw_query) or _CONTROL.intersection(
        unquote_to_bytes(raw_query.replace(b"+", b" "))
    ):
        raise BadTarget(f"query {_shown(raw_query)}: control characters are not allowed")
    return quote_from_bytes(raw_query, safe=_PRINTABLE)


def _shown(raw: bytes) -> str:
    """The raw bytes as a quoted, printable string: safe in an error message and a log line."""
    return repr(raw.decode("latin-1"))
