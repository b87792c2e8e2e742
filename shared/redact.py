"""The one place that knows what a secret looks like, and replaces it with `[REDACTED]`.

Logs, captured LLM samples and error messages all go through these functions, so a provider key
or an Authorization header never reaches storage or a log line. Two rules shape the code:

- Speed: ingest runs this on every captured sample, so every pattern is precompiled and built
  so the regex engine can skip ahead (tens of ms per MB); registered secrets are found with
  `str.__contains__`, which is C-fast.
- Precision: captured samples become training data, so ordinary prose, code and JSON must come
  out unchanged. Ambiguous names (`key`, `token`) need a secret-looking value before they are
  redacted, and `tokens`, `token_count`, `max_tokens`, `keyboard` are never secrets.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from enum import IntEnum
from functools import lru_cache
from typing import Any
from urllib.parse import SplitResult, unquote_plus, urlsplit, urlunsplit

REDACTED = "[REDACTED]"

# Registered secrets shorter than this are ignored: replacing "admin" everywhere would mangle text.
MIN_REGISTERED_SECRET_LEN = 8


class _Strength(IntEnum):
    """How sure a field *name* makes us that its value is a secret."""

    NONE = 0
    CONTEXT = 1  # secret only in a header or URL query (signatures: opaque blobs elsewhere)
    WEAK = 2  # `key`, `token`, `csrftoken`: secret only when the value looks like one
    STRONG = 3  # `password`, `api_key`, `access_token`: always secret


_STRONG_PARTS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "secret",
        "apikey",
        "secretkey",
        "accesskey",
        "privatekey",
        "clientsecret",
        "credential",
        "credentials",
        "authorization",
        "cookie",
    }
)
# A `key` or `token` with one of these in front of it is a credential, not a dictionary key.
_QUALIFIERS = frozenset(
    {
        "api",
        "secret",
        "access",
        "private",
        "auth",
        "admin",
        "session",
        "refresh",
        "bearer",
        "client",
        "security",
        "id",
        "master",
        "service",
        "signing",
        "encryption",
    }
)
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_NAME_SPLIT = re.compile(r"[-_.\s]+")
_SECRET_VALUE = re.compile(r"(?=[^\s]*[A-Za-z])(?=[^\s]*\d)[A-Za-z0-9._~+/=-]{16,}")
_LITERALS = frozenset({"true", "false", "null", "none", "nil", "undefined"})


@lru_cache(maxsize=4096)  # the same few names (`api_key`, `max_tokens`) recur all through a text
def _name_strength(name: str) -> _Strength:
    parts = [
        p for p in _NAME_SPLIT.split(_CAMEL.sub(r"\1_\2", name).lower()) if p and not p.isdigit()
    ]
    if not parts:
        return _Strength.NONE
    last = parts[-1]
    if last in _STRONG_PARTS or last.endswith(("password", "secret")):
        return _Strength.STRONG
    if last in ("key", "token"):
        qualified = len(parts) > 1 and parts[-2] in _QUALIFIERS
        return _Strength.STRONG if qualified else _Strength.WEAK
    if last.endswith("token"):
        return _Strength.WEAK
    if last in ("signature", "sig"):
        return _Strength.CONTEXT
    return _Strength.NONE


def _looks_secret(value: str) -> bool:
    """Long, mixed letters and digits, no spaces: how generated keys and tokens look."""
    return _SECRET_VALUE.fullmatch(value) is not None


def is_secret_name(name: str) -> bool:
    """Whether a header, query parameter or field with this name carries a credential."""
    return _name_strength(name) >= _Strength.CONTEXT


# --- text ------------------------------------------------------------------------------------
#
# Python's regex engine jumps quickly to a literal prefix (`sk-`) or to a rare first character,
# but crawls through a big alternation or case-insensitive words position by position (about
# 1 s per MB). So each token shape is its own literal-prefixed pattern (about 1 ms per MB when
# absent), and `name=value` pairs are found from the rare `:`/`=` with the name checked by
# fixed-width lookbehinds, then read back in Python.


def _any_case(word: str) -> str:
    return "".join(f"[{c.upper()}{c}]" if c.isalpha() else re.escape(c) for c in word)


_KV_WORDS = (
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "credential",
    "credentials",
    "authorization",
)
# Between name and separator: nothing, a quote or space, or an escaped quote (JSON in JSON).
_KV_GAPS = ("", "[\"' ]", r"\\[\"']")
# A cheap gate on the names' last two letters first (most `"field":` in JSON fail it), then
# the full names.
_ENDINGS = "|".join(sorted({_any_case(w[-2:]) for w in _KV_WORDS}))
_KV_GATE = "|".join(f"(?<=(?:{_ENDINGS}){gap}[:=])" for gap in _KV_GAPS)
_KV_NAMES = "|".join(f"(?<={_any_case(w)}{gap}[:=])" for w in _KV_WORDS for gap in _KV_GAPS)
_AUTH_SCHEME = r"(?:[Bb]earer|BEARER|[Bb]asic|BASIC|[Tt]oken|TOKEN|[Aa]pi[Kk]ey)[ \t]+"
_KV = re.compile(
    rf"[:=](?:{_KV_GATE})(?:{_KV_NAMES})[ \t]*"
    rf"(?:(?P<esc>\\?)(?P<vq>[\"'])(?P<qval>(?:[^\"'\n\\]|\\[^\"'])*)(?P=esc)(?P=vq)"
    rf"|(?P<scheme>{_AUTH_SCHEME})?(?P<val>[^\s\"'&,;<>()\[\]{{}}]+))"
)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_MAX_NAME = 64
_QUOTED_SCHEME = re.compile(_AUTH_SCHEME)

# Each token shape with the literals every match contains: a text holding none of them skips
# that pattern's scan (`str.__contains__` is C-fast; ten regex passes over every text of every
# captured sample were most of the capture pipeline's redaction cost).
_TOKENS = tuple(
    (anchors, re.compile(p))
    for anchors, p in (
        # OpenAI sk-/sk-proj-/sk-svcacct-, Anthropic sk-ant-api03-
        (("sk-",), r"sk-[A-Za-z0-9_-]{20,}"),
        (("AIza",), r"AIza[0-9A-Za-z_-]{35}"),  # Google API keys
        (("AKIA", "ASIA", "ABIA", "ACCA"), r"(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}(?![0-9A-Za-z])"),
        (("eyJ",), r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),  # JWTs
        (
            ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
            r"gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,}",  # GitHub
        ),
        (("hf_",), r"hf_[A-Za-z0-9]{30,}"),  # Hugging Face
        (("xox",), r"xox[abposr]-[A-Za-z0-9-]{10,}"),  # Slack
        # Our own keys: the `tl_<prefix>_` part names the key and is safe to show.
        (("tl_",), r"(?P<keep>tl_[A-Za-z0-9_-]{8}_)[A-Za-z0-9_-]{8,}"),
        (
            ("-----BEGIN ",),
            r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z]+ )*PRIVATE KEY-----",
        ),
        # A bare `Bearer <token>` outside an Authorization header; the digit keeps prose out.
        (("earer",), r"(?P<keep>[Bb]earer[ \t]+)(?=[A-Za-z0-9._~+/=-]*\d)[A-Za-z0-9._~+/=-]{16,}"),
    )
)


def _replace_token(m: re.Match[str]) -> str:
    start = m.start()
    if start and (m.string[start - 1].isalnum() or m.string[start - 1] == "_"):
        return m.group()  # the tail of a longer word (`task-...`, `xtl_...`), not a key
    return (m["keep"] or "") + REDACTED if "keep" in m.re.groupindex else REDACTED


def _kv_name(m: re.Match[str]) -> tuple[str, str]:
    """The field name in front of the separator, and the character in front of the name."""
    text, end = m.string, m.start()
    if text[end - 1] in "\"' ":
        end -= 1
        if text[end - 1] == "\\":
            end -= 1
    # Walk back by hand: a regex has no backwards search, and names are short.
    start, limit = end, max(0, end - _MAX_NAME)
    while start > limit and text[start - 1] in _NAME_CHARS:
        start -= 1
    return text[start:end], text[start - 1] if start else ""


def _keep_kv(m: re.Match[str], name: str, before: str, value: str) -> bool:
    """Decide whether a `name=value` / `"name": "value"` pair stays as it is."""
    quoted = m["qval"] is not None
    strength = _name_strength(name)
    if before in ("?", "&"):
        return strength == _Strength.NONE  # URL query parameter: the name alone decides
    if strength <= _Strength.CONTEXT:
        return True
    if not quoted and _looks_like_code(m, name, value):
        return True
    if m["scheme"] is not None:
        return False  # `Authorization: Bearer abc`: the scheme says what follows is a credential
    if strength == _Strength.WEAK:
        return not _looks_secret(value)
    # `Secret: practice daily` is prose; `password: hunter2` is not. Only the bare colon form
    # is ambiguous, and never for names that are unmistakably passwords.
    prose = not quoted and before not in ("'", '"') and m.group()[0] == ":"
    return prose and not name.lower().endswith(("password", "passwd")) and not _looks_secret(value)


def _looks_like_code(m: re.Match[str], name: str, value: str) -> bool:
    """`f(password=password)`, `key=os.environ["K"]`, `PASSWORD=$PW`: references, not values."""
    following = m.string[m.end() : m.end() + 1]
    last_segment = value.rsplit(".", 1)[-1].lstrip("_").lower()
    return following in ("(", "[") or last_segment == name.lower() or value[0] in "$%<{"


def _replace_kv(m: re.Match[str]) -> str:
    quoted = m["qval"] is not None
    value = m["qval"] if quoted else m["val"]
    # Cheapest checks first: most pairs in code and JSON are `key=None`, `"token": null`.
    if not value or value == REDACTED or value.lower() in _LITERALS:
        return m.group()
    name, before = _kv_name(m)
    if _keep_kv(m, name, before, value):
        return m.group()
    if quoted:
        # Keep `"Bearer ` visible inside a quoted Authorization value.
        scheme = _QUOTED_SCHEME.match(value)
        head = m.string[m.start() : m.start("qval")] + (scheme.group() if scheme else "")
        return f"{head}{REDACTED}{m['esc']}{m['vq']}"
    return m.string[m.start() : m.start("val")] + REDACTED


def redact_text(text: str) -> str:
    """Replace every secret in `text` with `[REDACTED]`; ordinary text comes back unchanged."""
    for secret in _registered:
        if secret in text:
            text = text.replace(secret, REDACTED)
    # Pairs first: `api_key=sk-...` then reads `api_key=[REDACTED]`, not a half-redacted value.
    if ":" in text or "=" in text:
        text = _KV.sub(_replace_kv, text)
    for anchors, pattern in _TOKENS:
        for anchor in anchors:  # a plain loop: a generator per pattern cost as much as the scans
            if anchor in text:
                text = pattern.sub(_replace_token, text)
                break
    return text


# --- registered secret values ------------------------------------------------------------------

_registered: tuple[str, ...] = ()
_registry_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Always redact this exact value (an S3 secret key, the admin token) wherever it appears.

    Values shorter than MIN_REGISTERED_SECRET_LEN are ignored: they would match ordinary words.
    """
    global _registered
    if not value or len(value) < MIN_REGISTERED_SECRET_LEN:
        return
    with _registry_lock:
        if value not in _registered:
            # Longest first, so a secret that contains another is replaced whole. The tuple is
            # swapped in one assignment, so readers in other threads never need the lock.
            _registered = tuple(sorted((*_registered, value), key=len, reverse=True))


# --- structured values -------------------------------------------------------------------------


def _redact_field(name: str, value: Any, *, context: bool = False) -> Any:
    """Redact `value` that sits under field `name`; `context` marks headers and URL queries."""
    strength = _name_strength(name)
    threshold = _Strength.CONTEXT if context else _Strength.STRONG
    if isinstance(value, str):
        if value and (
            strength >= threshold or (strength == _Strength.WEAK and _looks_secret(value))
        ):
            return REDACTED
        return redact_text(value)
    # bool is an int, but `"api_key": true` reveals nothing.
    if strength >= threshold and isinstance(value, int | float) and not isinstance(value, bool):
        return REDACTED
    return redact_mapping(value)


def redact_mapping(obj: Any) -> Any:
    """A copy of `obj` (dicts, lists, tuples, strings, nested) with every secret redacted.

    Values under secret-looking keys are replaced; other strings go through `redact_text`.
    Numbers, booleans and None stay as they are unless their key is unmistakably a secret.
    """
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, Mapping):
        return {k: _redact_field(str(k), v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        items = [redact_mapping(item) for item in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def redact_headers(
    headers: Mapping[str, Any] | Iterable[tuple[str | bytes, Any]],
) -> dict[str, Any]:
    """A copy of HTTP headers with credentials replaced; names are matched case-insensitively.

    Accepts a mapping (dict, httpx.Headers, Starlette Headers) or (name, value) pairs such as an
    ASGI scope's raw byte headers. Multi-valued headers come back as one entry. Headers
    like `x-ratelimit-remaining-tokens` are kept: their values are counts, not credentials.
    """
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, Any] = {}
    for name, value in pairs:
        if isinstance(name, bytes):
            name = name.decode("latin-1")
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        out[name] = _redact_field(name, value, context=True)
    return out


# --- URLs --------------------------------------------------------------------------------------


def redact_url(url: str) -> str:
    """`url` with userinfo passwords and secret query parameters (`key=`, `token=`) redacted."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. a malformed IPv6 host: still make sure no secret survives
        return redact_text(url)
    return urlunsplit(
        SplitResult(
            scheme=parts.scheme,
            netloc=_redact_netloc(parts),
            path=redact_text(parts.path),
            query=_redact_query(parts.query),
            fragment=redact_text(parts.fragment),
        )
    )


def _redact_netloc(parts: SplitResult) -> str:
    if "@" not in parts.netloc:
        return parts.netloc
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, has_password, _ = userinfo.partition(":")
    # A lone user part can itself be a token (`https://ghp_xxx@github.com`).
    user = redact_text(user)
    return f"{user}:{REDACTED}@{host}" if has_password else f"{user}@{host}"


def _redact_query(query: str) -> str:
    if not query:
        return query
    # Rebuilt by hand rather than with urlencode, so untouched parameters keep their encoding.
    out = []
    for pair in query.split("&"):
        name, eq, value = pair.partition("=")
        if eq and value and is_secret_name(unquote_plus(name)):
            out.append(f"{name}={REDACTED}")
        else:
            out.append(redact_text(pair))
    return "&".join(out)
