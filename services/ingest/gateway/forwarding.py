"""Control-plane routes of other services behind the gateway's one base URL.

`/v1/fine_tuning/...` goes to the scheduler, `/v1/models` and `/v1/deployments` to the hoster,
`/v1/evals` and `/v1/shadow_scores` to the evaluator. The caller's own credentials travel with
the request: the owning service authenticates it, so the gateway adds nothing and keeps nothing.
"""

from __future__ import annotations

from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from services.ingest.config import IngestSettings, OtherService
from services.ingest.gateway import targets
from services.ingest.gateway.proxy import HOP_BY_HOP
from shared.settings import Settings

# First path segment after /v1 -> owning service.
OWNERS: dict[str, OtherService] = {
    "fine_tuning": "scheduler",
    "notification_rules": "scheduler",
    "models": "hoster",
    "deployments": "hoster",
    "served_names": "hoster",
    "evals": "evaluator",
    "shadow_scores": "evaluator",
}
_HOP_BY_HOP = HOP_BY_HOP | {"host", "content-length"}


def control_client() -> httpx.AsyncClient:
    """The client that relays control-plane calls. Every caller shares it, so it stores no
    cookie an answer sets (a jar whose policy accepts no domain): they reach the caller only."""
    no_cookies = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
    return httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0), cookies=no_cookies)


def service_urls(settings: Settings, own: IngestSettings) -> dict[str, str]:
    """Each owning service's base URL: TUNELOOP_INGEST_<SERVICE>_URL, else the local stack's."""
    return {name: own.service_url(name, settings) for name in set(OWNERS.values())}


async def relay(
    client: httpx.AsyncClient, request: Request, base_url: str, service: str
) -> Response:
    """Send the request on as it is (the path as the client wrote it, percent-encoded: see
    services.ingest.gateway.targets) and stream the answer back; 400 for a target that is refused."""
    headers = {k: v for k, v in request.headers.items() if k not in _HOP_BY_HOP}
    try:
        path = targets.checked_path(request.scope.get("raw_path") or request.url.path.encode())
        query = targets.checked_query(request.scope.get("query_string", b""))
    except targets.BadTarget as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    url = base_url + path + (f"?{query}" if query else "")
    outgoing = client.build_request(request.method, url, headers=headers, content=request.stream())
    try:
        answer = await client.send(outgoing, stream=True)
    except httpx.HTTPError as exc:
        return JSONResponse(
            {"detail": f"{service} at {base_url} is not reachable ({type(exc).__name__})"},
            status_code=503,
        )
    response = StreamingResponse(
        answer.aiter_raw(),
        status_code=answer.status_code,
        background=BackgroundTask(answer.aclose),
    )
    # One by one: a header sent twice (Set-Cookie) stays two headers, not one joined by ", ".
    for name, value in answer.headers.multi_items():
        if name not in _HOP_BY_HOP:
            response.headers.append(name, value)
    return response
