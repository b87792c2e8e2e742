"""`python -m services.evaluator`: serve the evaluator service on its configured port."""

from services.evaluator.app import SERVICE, create_app
from shared.service import run

run(SERVICE, create_app())
