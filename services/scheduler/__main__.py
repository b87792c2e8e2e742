"""`python -m services.scheduler`: serve the scheduler service on its configured port."""

from services.scheduler.app import SERVICE, create_app
from shared.service import run

run(SERVICE, create_app())
