"""`python -m services.hoster`: serve the hoster service on its configured port."""

from services.hoster.app import SERVICE, create_app
from shared.service import run

run(SERVICE, create_app())
