"""`python -m services.ingest`: serve the ingest service on its configured port."""

from services.ingest.app import SERVICE
from services.ingest.gateway.protocol_contract import http_protocol
from shared.service import run

# No access log: the proxied calls are counted in metrics, and a log line per call would cost
# the gateway about 5% of its CPU at load. GatewayProtocol takes the proxied calls straight to
# the proxy, past the app's middleware, with one socket send per answer (uvicorn's own protocol,
# with a warning, when the installed uvicorn breaks the contract it is checked against).
run(
    SERVICE,
    "services.ingest.app:create_worker_app",
    access_log=False,
    http=http_protocol(),
)
