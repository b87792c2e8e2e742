"""HTTP routes of the scheduler service. Its resources arrive with the scheduling issue."""

from fastapi import APIRouter

router = APIRouter(prefix="/v1")
