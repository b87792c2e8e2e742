"""HTTP routes of the evaluator service. Its resources arrive with the evaluation issue."""

from fastapi import APIRouter

router = APIRouter(prefix="/v1")
