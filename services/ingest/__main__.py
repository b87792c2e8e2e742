"""`python -m services.ingest`: serve the ingest service on its configured port."""

from services.ingest.app import SERVICE, create_app
from shared.service import run

run(SERVICE, create_app())
