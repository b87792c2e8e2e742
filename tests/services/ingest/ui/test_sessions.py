"""What every dashboard change must carry (services/ingest/ui/sessions.py): this dashboard's
Origin, the session's CSRF token, and a key that may write; and which scope a key signs in with."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from services.ingest.ui.sessions import (
    UiError,
    UiSession,
    check_change,
    check_origin,
    check_token,
    dashboard_scope,
)
from shared.auth import Principal

HOST = "127.0.0.1:8400"


def _request(**headers: str) -> Request:
    sent = [(k.lower().encode(), v.encode()) for k, v in ({"host": HOST} | headers).items()]
    scope = {"type": "http", "method": "POST", "scheme": "http", "path": "/ui/deployments",
             "headers": sent, "query_string": b"", "server": ("127.0.0.1", 8400)}  # fmt: skip
    return Request(scope)


def _session(scope: str = "write") -> UiSession:
    return UiSession("acme", "k1", "abcd1234", scope, "the-token", 2**40)  # type: ignore[arg-type]


def test_a_change_from_this_dashboards_page_passes() -> None:
    check_change(_request(origin=f"http://{HOST}"), _session(), "the-token", "Deploy")
    check_origin(_request(referer=f"http://{HOST}/ui/models"))  # no Origin: its Referer


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "needs the Origin header"),
        ({"origin": "null"}, "needs the Origin header"),
        ({"origin": "http://attacker.example"}, "came from http://attacker.example"),
        ({"origin": f"https://{HOST}"}, f"came from https://{HOST}"),  # another scheme
        ({"referer": "http://attacker.example/ui/models"}, "came from http://attacker.example"),
    ],
)
def test_a_change_from_anywhere_else_is_refused(headers: dict[str, str], reason: str) -> None:
    with pytest.raises(UiError, match=reason) as refused:
        check_origin(_request(**headers))
    assert refused.value.status == 403


@pytest.mark.parametrize("sent", [None, "", "the-tokeN", "the-token "])
def test_a_missing_or_wrong_csrf_token_is_refused(sent: str | None) -> None:
    with pytest.raises(UiError, match="CSRF token") as refused:
        check_token(sent, "the-token")
    assert refused.value.status == 403


def test_a_read_session_is_refused_even_with_a_good_token_and_origin() -> None:
    with pytest.raises(UiError, match="scope 'read'; Deploy needs a key with scope 'write'"):
        check_change(_request(origin=f"http://{HOST}"), _session("read"), "the-token", "Deploy")


def test_the_dashboard_holds_at_most_write_whatever_the_key() -> None:
    scopes = {s: dashboard_scope(Principal("acme", "k1", s)) for s in ("read", "write", "admin")}
    assert scopes | {"internal": dashboard_scope(Principal("acme", "k1", "internal"))} == {
        "read": "read", "write": "write", "admin": "write", "internal": "read",
    }  # fmt: skip
