"""The ingest service's HTTP routes, as a list of routers: each concern's routes live in its own
sub-package. Their refusals (http.errors.IngestError) are answered by `ingest_error`, once."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from services.ingest.datasets import routes as datasets
from services.ingest.eval_sets import routes as eval_sets
from services.ingest.gateway import documented as gateway
from services.ingest.gateway import relays
from services.ingest.http.errors import IngestError
from services.ingest.samples import routes as samples
from services.ingest.samples import service_routes as for_services
from services.ingest.samples.feedback import routes as feedback
from services.ingest.tenants import routes as tenants
from services.ingest.uploads import routes as uploads
from shared.service import key_refused

router = APIRouter()
# The order matters where two routes could match one call: the gateway's table comes before the
# relays, whose `/v1/models/{rest:path}` would otherwise take `/v1/models/{model}:generateContent`.
for concern in (
    datasets,  # build, read, list, export: datasets/routes.py
    eval_sets,  # held-out samples refreshed from recent traffic: eval_sets/routes.py
    feedback,  # on the samples the gateway names: samples/feedback/routes.py
    for_services,  # the platform's services acting for a tenant: samples/service_routes.py
    gateway,  # the provider-compatible gateway and OTLP, as documented: gateway/documented.py
    uploads,  # the files API and streamed imports: uploads/routes.py
    samples,  # list, get, fidelity: samples/routes.py
    tenants,  # the operator's tenants and keys, a tenant's own keys: tenants/routes.py
    relays,  # the control plane of the other services: gateway/relays.py
):
    router.include_router(concern.router)


async def ingest_error(request: Request, exc: Exception) -> JSONResponse:
    """Every refusal, mapped once: its status and the body every service gives an HTTPException
    (`{"detail": message}`, and OpenAI's `error` beside it for a key refused: 401, 403)."""
    assert isinstance(exc, IngestError)
    return await key_refused(request, HTTPException(exc.status, detail=exc.detail))
