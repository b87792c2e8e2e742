"""shared.redact: every secret shape is replaced, and ordinary prose, code and JSON are not."""

from __future__ import annotations

import json
import secrets
import string

import pytest

from shared.redact import (
    REDACTED,
    is_secret_name,
    redact_headers,
    redact_mapping,
    redact_text,
    redact_url,
    register_secret,
)

OPENAI_KEY = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v2W3x4"
OPENAI_PROJECT_KEY = "sk-proj-Ab12Cd34Ef56Gh78Ij90_Kl12-Mn34Op56Qr78St90Uv12"
ANTHROPIC_KEY = "sk-ant-api03-" + "x9Y8z7W6v5U4t3S2r1Q0" * 4 + "-AbCdEfAA"
GOOGLE_KEY = "AIzaSyD3m0Xk9_Q-abcdefghijklmnopqrstuvw"  # 39 chars, like real ones
AWS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
HF_TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"Authorization: Bearer {OPENAI_KEY}", OPENAI_KEY),
        ("authorization: Bearer opaque-token-without-known-shape", "opaque-token-without"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
        ('{"headers": {"Authorization": "Bearer abc.def.ghi"}}', "abc.def.ghi"),
        (f"use {OPENAI_KEY} for this", OPENAI_KEY),
        (f"OPENAI_API_KEY={OPENAI_PROJECT_KEY}", OPENAI_PROJECT_KEY),
        (f"x-api-key: {ANTHROPIC_KEY}", ANTHROPIC_KEY),
        (f"the key is {GOOGLE_KEY}.", GOOGLE_KEY),
        (f"aws_access_key_id = {AWS_KEY_ID}", AWS_KEY_ID),
        (f"token {JWT} expired", JWT),
        (f"git clone https://{GITHUB_TOKEN}@github.com/a/b", GITHUB_TOKEN),
        (f"HF_TOKEN={HF_TOKEN}", HF_TOKEN),
        ("GET /v1/models?key=abc123&alt=json", "abc123"),
        ("https://x.test/cb?access_token=zzz", "zzz"),
        ("api_key=abc123 host=db", "abc123"),
        ('{"password": "hunter2", "user": "bob"}', "hunter2"),
        ("db_password='correct horse'", "correct horse"),
        ("secret=s3cr3t-value", "s3cr3t-value"),
        ("Password: hunter2", "hunter2"),
        ('{"client_secret": "0a1b2c3d4e5f"}', "0a1b2c3d4e5f"),
        ("token=9f8e7d6c5b4a39281706abcdef", "9f8e7d6c5b4a39281706abcdef"),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
            "MIIEowIBAAKCAQEA",
        ),
    ],
)
def test_redact_text_replaces_each_secret_shape(text: str, secret: str) -> None:
    redacted = redact_text(text)
    assert secret not in redacted
    assert REDACTED in redacted


def test_authorization_keeps_scheme_and_surroundings() -> None:
    assert redact_text(f"Authorization: Bearer {OPENAI_KEY}") == f"Authorization: Bearer {REDACTED}"
    assert redact_text('{"authorization": "Basic Zm9vOmJhcg=="}') == (
        f'{{"authorization": "Basic {REDACTED}"}}'
    )


def test_own_api_keys_keep_their_prefix_visible() -> None:
    key = "tl_ab12cd34_" + "Zx9yW8vU7tS6rQ5pO4nM3lK2"
    assert redact_text(f"called with {key} today") == f"called with tl_ab12cd34_{REDACTED} today"


def test_pairs_keep_names_and_quotes() -> None:
    assert redact_text('{"api_key": "abcd", "model": "gpt"}') == (
        f'{{"api_key": "{REDACTED}", "model": "gpt"}}'
    )
    assert redact_text("?key=AIza1&alt=json") == f"?key={REDACTED}&alt=json"


def test_json_inside_a_json_string_is_redacted() -> None:
    # Tool-call arguments arrive as a JSON string inside the JSON body.
    raw = json.dumps({"arguments": json.dumps({"password": "hunter2", "n": 1})})
    redacted = redact_text(raw)
    assert "hunter2" not in redacted
    assert json.loads(json.loads(redacted)["arguments"]) == {"password": REDACTED, "n": 1}


PROSE = """The keyboard shortcut opens a new tab. Tokens are the unit a model reads; the
tokenizer splits words into tokens. Key: value pairs make a dictionary. A secret: practice every
day. The bearer of bad news knocked twice. Ask the task-runner for its status-reporting-endpoint.
Authorization: granted to admins only. My password manager is great."""

CODE = """def count(text: str, max_tokens: int = 4096, api_key: str | None = None) -> dict:
    tokens = tokenizer(text)
    client = Client(api_key=api_key, token=os.environ["TOKEN"], password=settings.password)
    primary_key = True
    key = event.key  # keyboard event
    return {"tokens": len(tokens), "token_count": 123, "key": "Enter", "secret": None}
"""

JSON_DOC = json.dumps(
    {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "How many tokens is a keyboard?"}],
        "max_tokens": 256,
        "usage": {"prompt_tokens": 12, "completion_tokens": 34, "total_tokens": 46},
        "tokens": 123,
        "token_count": 77,
        "keyboard": "qwerty",
        "key": "ArrowDown",
        "id": "chatcmpl-9abc123DEF456ghi789",
        "api_key": None,
        "cached": True,
    }
)


@pytest.mark.parametrize("text", [PROSE, CODE, JSON_DOC], ids=["prose", "code", "json"])
def test_ordinary_text_is_unchanged(text: str) -> None:
    assert redact_text(text) == text


def test_large_text_is_unchanged_and_redacted_where_needed() -> None:
    big = (PROSE + CODE + JSON_DOC) * 2000 + f" api_key={OPENAI_KEY}"
    redacted = redact_text(big)
    assert OPENAI_KEY not in redacted
    assert redacted == (PROSE + CODE + JSON_DOC) * 2000 + f" api_key={REDACTED}"


def test_headers_redacted_case_insensitively_and_counts_kept() -> None:
    headers = {
        "Authorization": f"Bearer {OPENAI_KEY}",
        "X-API-KEY": "k-123",
        "x-goog-api-key": GOOGLE_KEY,
        "Proxy-Authorization": "Basic abc",
        "Cookie": "session=abc",
        "Set-Cookie": "session=abc; HttpOnly",
        "X-Tuneloop-Signature": "t=1,v1=abc",
        "X-Amz-Security-Token": "FwoGZXIvYXdzE",
        "Content-Type": "application/json",
        "x-ratelimit-remaining-tokens": "9000",
        "anthropic-ratelimit-tokens-limit": "100000",
        "Referer": "https://app.test/page?token=abc",
    }
    out = redact_headers(headers)
    secret_names = list(headers)[:8]
    assert all(out[name] == REDACTED for name in secret_names)
    assert out["Content-Type"] == "application/json"
    assert out["x-ratelimit-remaining-tokens"] == "9000"
    assert out["anthropic-ratelimit-tokens-limit"] == "100000"
    assert out["Referer"] == f"https://app.test/page?token={REDACTED}"
    assert headers["Authorization"].endswith(OPENAI_KEY)  # the input is not modified


def test_headers_accept_raw_asgi_pairs() -> None:
    out = redact_headers([(b"authorization", b"Bearer x"), (b"accept", b"*/*")])
    assert out == {"authorization": REDACTED, "accept": "*/*"}


def test_redact_url_query_and_userinfo() -> None:
    url = "https://user:p%40ss@host.test:8443/v1/x?key=AIza123&alt=json&q=a+b%20c&Signature=zz#f"
    assert redact_url(url) == (
        f"https://user:{REDACTED}@host.test:8443/v1/x?key={REDACTED}&alt=json&q=a+b%20c"
        f"&Signature={REDACTED}#f"
    )
    assert redact_url("https://host.test/plain?page=2") == "https://host.test/plain?page=2"
    assert GITHUB_TOKEN not in redact_url(f"https://{GITHUB_TOKEN}@github.com/a/b.git")


def test_redact_mapping_nested() -> None:
    original = {
        "user": {"name": "ada", "password": "hunter2", "api_key": 12345},
        "calls": [
            {"headers": {"authorization": "Bearer abc"}, "tokens": 5},
            ("note", f"use {OPENAI_KEY}"),
        ],
        "token_count": 9,
        "max_tokens": 100,
        "key": "ArrowDown",
        "session_token": "abc",
        "enabled": True,
    }
    out = redact_mapping(original)
    assert out == {
        "user": {"name": "ada", "password": REDACTED, "api_key": REDACTED},
        "calls": [
            {"headers": {"authorization": REDACTED}, "tokens": 5},
            ("note", f"use {REDACTED}"),
        ],
        "token_count": 9,
        "max_tokens": 100,
        "key": "ArrowDown",
        "session_token": REDACTED,
        "enabled": True,
    }
    assert original["user"]["password"] == "hunter2"  # type: ignore[index]


def test_registered_secret_is_replaced_everywhere() -> None:
    value = "".join(secrets.choice(string.ascii_letters) for _ in range(24))
    register_secret(value)
    assert (
        redact_text(f"prefix{value}suffix and {value}") == f"prefix{REDACTED}suffix and {REDACTED}"
    )
    assert redact_mapping({"note": [value]}) == {"note": [REDACTED]}
    assert value not in redact_url(f"https://h.test/{value}?x={value}")


def test_short_registered_values_are_ignored() -> None:
    register_secret("admin")
    register_secret("")
    register_secret(None)
    assert redact_text("the admin panel") == "the admin panel"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("Authorization", True),
        ("x-api-key", True),
        ("apiKey", True),
        ("X-Hub-Signature-256", True),
        ("access_token", True),
        ("key", True),
        ("keyboard", False),
        ("tokens", False),
        ("token_count", False),
        ("max_tokens", False),
        ("content-type", False),
    ],
)
def test_is_secret_name(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret
