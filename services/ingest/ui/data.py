"""What the dashboard shows, fetched from the gateway's own /v1 API for the signed-in user.

The dashboard is a client of the same API an integrator's SDK calls, in process (httpx over
ASGI): ingest answers its own routes, the relay takes the rest to the scheduler, evaluator and
hoster, and every one of them checks the caller as for any key. The caller is a delegated
credential minted per request (shared/delegation.py): `read` for pages, `write` for a button.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import httpx
from starlette.types import ASGIApp

from services.ingest.ui.sessions import SignedOut, UiError, UiSession
from shared import delegation
from shared.delegation import Claims, DelegatedScope

# A first look at a job reads at most this many pages of its events (100 each).
MAX_EVENT_PAGES = 50
MAX_PAGE = 100
_TIMEOUT = httpx.Timeout(60.0, connect=5.0)


class Api:
    """The /v1 API as the session's key, with `scope` (read, or write for a change)."""

    def __init__(
        self, app: ASGIApp, session: UiSession, secret: bytes, scope: DelegatedScope = "read"
    ) -> None:
        self._app = app
        self._session = session
        self._secret = secret
        self._scope = scope

    def _credential(self) -> str:
        claims = Claims(
            key_id=self._session.key_id,
            tenant_id=self._session.tenant_id,
            scope=self._scope,
            expires_at=int(time.time()) + delegation.DEFAULT_TTL_S,
        )
        return delegation.mint(claims, secret=self._secret)

    async def call(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None
    ) -> Any:
        transport = httpx.ASGITransport(app=self._app)
        headers = {"Authorization": f"Bearer {self._credential()}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", timeout=_TIMEOUT
        ) as client:
            response = await client.request(
                method, f"/v1{path}", params=_present(params), json=body, headers=headers
            )
        if response.status_code == 401:
            raise SignedOut(f"signed out: {_detail(response)}")
        if response.status_code >= 400:
            raise UiError(response.status_code, _detail(response))
        return response.json()

    async def get(self, path: str, **params: Any) -> Any:
        return await self.call("GET", path, params=params)

    async def found(self, path: str, **params: Any) -> Any | None:
        """`get`, or None where the API answers 404."""
        try:
            return await self.get(path, **params)
        except UiError as exc:
            if exc.status == 404:
                return None
            raise


def _present(params: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (params or {}).items() if v is not None}


def _detail(response: httpx.Response) -> str:
    """The API's message (`detail`, or OpenAI's `error.message`), else the status line."""
    try:
        body = response.json()
    except ValueError:
        return f"{response.status_code} {response.reason_phrase}"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if "detail" in body:
            detail = body["detail"]
            return detail if isinstance(detail, str) else _field_errors(detail)
    return f"{response.status_code} {response.reason_phrase}"


def _field_errors(detail: Any) -> str:
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg', '')}"
            for e in detail
            if isinstance(e, dict)
        )
    return str(detail)


# --- what each page reads -----------------------------------------------------------------------


def segment(value: str) -> str:
    """One path segment as given (a `/` or `..` in an id stays inside it)."""
    return quote(value, safe="")


async def job_events(api: Api, job_id: str, *, since: str | None) -> tuple[list[Any], bool]:
    """The job's events newer than `since` (all of them, up to MAX_EVENT_PAGES pages, without
    it), newest first; and whether `since` was reached (False: older ones were left out)."""
    events: list[Any] = []
    after: str | None = None
    for _ in range(MAX_EVENT_PAGES):
        page = await api.get(
            f"/fine_tuning/jobs/{segment(job_id)}/events", limit=MAX_PAGE, after=after
        )
        for event in page["data"]:
            if event["id"] == since:
                return events, True
            events.append(event)
        if not page["has_more"]:
            return events, since is None
        after = page["data"][-1]["id"]
    return events, False


async def models_page(api: Api) -> dict[str, Any]:
    models = (await api.get("/models"))["data"]
    deployments = (await api.get("/deployments"))["data"]
    served = (await api.get("/served_names"))["data"]
    return {"models": models, "deployments": deployments, "served_names": served}


async def deploy(api: Api, model: str, served_name: str | None) -> Any:
    body: dict[str, Any] = {"model": model}
    if served_name:
        body["served_name"] = served_name
    return await api.call("POST", "/deployments", body=body)


async def served_name_action(api: Api, name: str, action: str) -> Any:
    return await api.call("POST", f"/served_names/{segment(name)}/{action}")
