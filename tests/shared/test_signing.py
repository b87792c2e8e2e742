"""Signed webhooks: good signatures pass; tampered, wrongly keyed, stale or replayed ones fail."""

import hashlib
import hmac
import time

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import col

from shared.db import make_engine
from shared.signing import (
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    BadSignatureError,
    FutureTimestampError,
    MalformedHeaderError,
    MemoryNonceStore,
    MissingHeaderError,
    NonceStoreFullError,
    ReplayedNonceError,
    SqlNonceStore,
    StaleTimestampError,
    VerifiedWebhook,
    WebhookNonce,
    sign,
    verify,
)

SECRET = "whsec-current-5f1d"
OLD_SECRET = "whsec-previous-9a2b"
BODY = b'{"job_id":"job-1","event":"checkpoint_saved","step":100}'
NOW = 1_800_000_000
NONCE = "n0nce-" + "a" * 26


def _signed(
    body: bytes = BODY, secret: str = SECRET, *, timestamp: int = NOW, nonce: str = NONCE
) -> dict[str, str]:
    return sign(body, secret, timestamp=timestamp, nonce=nonce)


def test_good_signature_passes_and_matches_the_documented_format() -> None:
    headers = _signed()

    result = verify(headers, BODY, SECRET, nonce_store=MemoryNonceStore(), now=NOW)

    assert result == VerifiedWebhook(timestamp=NOW, nonce=NONCE)
    message = f"{NOW}.{NONCE}.".encode() + BODY
    expected = hmac.new(SECRET.encode(), message, hashlib.sha256).hexdigest()
    assert headers == {
        TIMESTAMP_HEADER: str(NOW),
        NONCE_HEADER: NONCE,
        SIGNATURE_HEADER: f"v1={expected}",
    }


def test_header_names_match_case_insensitively() -> None:
    lowered = {name.lower(): value for name, value in _signed().items()}
    assert verify(lowered, BODY, SECRET, nonce_store=MemoryNonceStore(), now=NOW).nonce == NONCE


def test_default_timestamp_and_nonce_are_fresh() -> None:
    first, second = sign(BODY, SECRET), sign(BODY, SECRET)

    assert first[NONCE_HEADER] != second[NONCE_HEADER]
    assert abs(int(first[TIMESTAMP_HEADER]) - time.time()) < 60
    verify(first, BODY, SECRET, nonce_store=MemoryNonceStore())  # against the real clock


@pytest.mark.parametrize(
    ("headers", "body", "secret"),
    [
        (_signed(), BODY.replace(b"100", b"900"), SECRET),  # tampered body
        (_signed(), BODY, "whsec-wrong"),  # wrong secret
        ({**_signed(), TIMESTAMP_HEADER: str(NOW + 1)}, BODY, SECRET),  # timestamp is signed
        ({**_signed(), NONCE_HEADER: "b" * 32}, BODY, SECRET),  # nonce is signed
    ],
    ids=["tampered-body", "wrong-secret", "changed-timestamp", "changed-nonce"],
)
def test_bad_signatures_are_refused(headers: dict[str, str], body: bytes, secret: str) -> None:
    with pytest.raises(BadSignatureError, match="does not match"):
        verify(headers, body, secret, nonce_store=MemoryNonceStore(), now=NOW)


def test_stale_timestamp_is_refused_saying_by_how_much() -> None:
    with pytest.raises(StaleTimestampError, match="400s old, beyond the 300s tolerance"):
        verify(_signed(timestamp=NOW - 400), BODY, SECRET, nonce_store=MemoryNonceStore(), now=NOW)


def test_future_timestamp_is_refused_saying_by_how_much() -> None:
    with pytest.raises(FutureTimestampError, match="400s in the future"):
        verify(_signed(timestamp=NOW + 400), BODY, SECRET, nonce_store=MemoryNonceStore(), now=NOW)


def test_timestamp_at_the_edge_of_the_tolerance_passes() -> None:
    headers = _signed(timestamp=NOW - 300)
    assert (
        verify(headers, BODY, SECRET, nonce_store=MemoryNonceStore(), now=NOW).timestamp
        == NOW - 300
    )


@pytest.mark.parametrize("missing", [TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER])
def test_missing_headers_are_named(missing: str) -> None:
    headers = {name: value for name, value in _signed().items() if name != missing}
    with pytest.raises(MissingHeaderError, match=missing) as caught:
        verify(headers, BODY, SECRET, nonce_store=MemoryNonceStore(), now=NOW)
    assert caught.value.header == missing


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (TIMESTAMP_HEADER, "yesterday"),
        (TIMESTAMP_HEADER, "1800000000.5"),
        (NONCE_HEADER, "short"),
        (NONCE_HEADER, "has spaces in it, not allowed"),
        (SIGNATURE_HEADER, "sha256=" + "0" * 64),
        (SIGNATURE_HEADER, "v1=not-hex"),
    ],
)
def test_malformed_headers_are_named(header: str, value: str) -> None:
    headers = {**_signed(), header: value}
    with pytest.raises(MalformedHeaderError, match=header):
        verify(headers, BODY, SECRET, nonce_store=MemoryNonceStore(), now=NOW)


def test_replayed_nonce_is_refused_by_the_memory_store() -> None:
    store = MemoryNonceStore()
    headers = _signed()
    verify(headers, BODY, SECRET, nonce_store=store, now=NOW)

    with pytest.raises(ReplayedNonceError, match=NONCE):
        verify(headers, BODY, SECRET, nonce_store=store, now=NOW + 5)


def test_replayed_nonce_is_refused_across_processes_by_the_sql_store(db_engine: Engine) -> None:
    # Two engines stand for two scheduler replicas sharing the database.
    other_engine = make_engine(db_engine.url)
    try:
        headers = _signed()
        verify(headers, BODY, SECRET, nonce_store=SqlNonceStore(db_engine), now=NOW)
        with pytest.raises(ReplayedNonceError):
            verify(headers, BODY, SECRET, nonce_store=SqlNonceStore(other_engine), now=NOW + 5)
    finally:
        other_engine.dispose()


def test_a_forged_request_does_not_spend_the_nonce() -> None:
    store = MemoryNonceStore()
    forged = _signed(secret="attacker-guess")
    with pytest.raises(BadSignatureError):
        verify(forged, BODY, SECRET, nonce_store=store, now=NOW)

    assert verify(_signed(), BODY, SECRET, nonce_store=store, now=NOW).nonce == NONCE


def test_secret_rotation_accepts_old_and_new_until_the_old_is_dropped() -> None:
    rotating = [SECRET, OLD_SECRET]
    old_signed = _signed(secret=OLD_SECRET, nonce="old-" + "c" * 28)
    new_signed = _signed(secret=SECRET, nonce="new-" + "d" * 28)

    assert verify(old_signed, BODY, rotating, nonce_store=MemoryNonceStore(), now=NOW)
    assert verify(new_signed, BODY, rotating, nonce_store=MemoryNonceStore(), now=NOW)
    with pytest.raises(BadSignatureError):
        verify(old_signed, BODY, [SECRET], nonce_store=MemoryNonceStore(), now=NOW)


def test_a_sender_may_sign_with_both_secrets_during_rotation() -> None:
    new, old = _signed(secret=SECRET), _signed(secret=OLD_SECRET)
    both = {**new, SIGNATURE_HEADER: f"{new[SIGNATURE_HEADER]},{old[SIGNATURE_HEADER]}"}

    assert verify(both, BODY, OLD_SECRET, nonce_store=MemoryNonceStore(), now=NOW)
    assert verify(both, BODY, SECRET, nonce_store=MemoryNonceStore(), now=NOW)


def test_empty_secrets_are_refused() -> None:
    with pytest.raises(ValueError, match="secret"):
        sign(BODY, "")
    with pytest.raises(ValueError, match="secret"):
        verify(_signed(), BODY, [], nonce_store=MemoryNonceStore(), now=NOW)


def test_memory_store_is_bounded_and_forgets_expired_nonces() -> None:
    store = MemoryNonceStore(max_entries=2)
    assert store.remember("a" * 16, expires_at=NOW + 10, now=NOW)
    assert store.remember("b" * 16, expires_at=NOW + 20, now=NOW)
    assert not store.remember("a" * 16, expires_at=NOW + 10, now=NOW)
    # Full of unexpired nonces: refuse rather than forget one and open a replay window.
    with pytest.raises(NonceStoreFullError, match="2 unexpired nonces"):
        store.remember("c" * 16, expires_at=NOW + 30, now=NOW)

    assert store.remember("c" * 16, expires_at=NOW + 30, now=NOW + 15)  # "a" expired meanwhile
    assert len(store) == 2


def test_sql_store_purges_expired_nonces(db_engine: Engine) -> None:
    store = SqlNonceStore(db_engine)
    assert store.remember("a" * 16, expires_at=NOW + 10, now=NOW)
    assert store.remember("b" * 16, expires_at=NOW + 1000, now=NOW)

    assert store.purge(now=NOW + 100) == 1

    with db_engine.connect() as connection:
        remaining = connection.execute(select(col(WebhookNonce.nonce))).scalars().all()
    assert remaining == ["b" * 16]
