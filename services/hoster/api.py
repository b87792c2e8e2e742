"""HTTP routes of the hoster service. Its resources arrive with the hosting issue."""

from fastapi import APIRouter

router = APIRouter(prefix="/v1")
