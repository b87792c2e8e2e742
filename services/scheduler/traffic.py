"""The ingest service's routes for the platform's services (services/ingest/samples/service_routes.py),
called with the service token on a tenant's behalf: what a retrain policy needs of the captured
traffic (checking its dataset spec, counting new samples, building a dataset, reading it back).

Ingest's refusals come back as TrafficRefused with its status and a message naming the field
(`source.since: ...`), so a policy's creator sees what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from services.scheduler.datasets import DatasetRef


class TrafficRefused(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.field = status, field


@dataclass(frozen=True)
class Traffic:
    http: httpx.AsyncClient
    ingest_url: str
    service_token: str

    async def _call(self, method: str, tenant: str, path: str, body: Any = None) -> Any:
        url = f"{self.ingest_url}/internal/tenants/{tenant}{path}"
        headers = {"Authorization": f"Bearer {self.service_token}"}
        try:
            response = await self.http.request(method, url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise TrafficRefused(503, f"the ingest service is unreachable: {exc}") from None
        if response.status_code >= 400:
            raise _refused(response)
        return response.json()

    async def validate(self, tenant: str, spec: dict[str, Any]) -> int:
        """Check a dataset spec as a build would; the samples its source selects today."""
        return int((await self._call("POST", tenant, "/datasets/validate", spec))["count"])

    async def count(self, tenant: str, source: dict[str, Any], since: datetime | None) -> int:
        body = {"source": source, "since": since.isoformat() if since else None}
        return int((await self._call("POST", tenant, "/samples/count", body))["count"])

    async def build(self, tenant: str, spec: dict[str, Any]) -> DatasetRef:
        return _ref(await self._call("POST", tenant, "/datasets", spec))

    async def dataset(self, tenant: str, dataset_id: str) -> DatasetRef:
        return _ref(await self._call("GET", tenant, f"/datasets/{dataset_id}"))


def _ref(body: dict[str, Any]) -> DatasetRef:
    return DatasetRef(str(body["id"]), str(body["status"]), body.get("uri"))


def _refused(response: httpx.Response) -> TrafficRefused:
    """FastAPI's validation list (`loc` under `body`) or an HTTPException's `detail` string."""
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = response.text[:500]
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        first = detail[0]
        loc = [str(p) for p in first.get("loc", []) if p != "body"]
        field = ".".join(loc) or None
        said = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', []) if p != 'body')}: {e.get('msg')}"
            for e in detail
        )
        return TrafficRefused(response.status_code, said, field)
    return TrafficRefused(response.status_code, str(detail))
