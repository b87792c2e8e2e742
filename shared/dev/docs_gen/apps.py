"""The services as the generators read them: each app built by its own factory, never started.

`create_app` wires the FastAPI routes and the FastStream subscribers without connecting to
anything (NATS, S3 and the database are reached in the lifespan, which never runs here), so
`app.openapi()` and the broker's subscribers are exactly what a running service has.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

from faststream.nats import NatsBroker

from shared.dev.localstack import SERVICES
from shared.settings import load_settings


def clean_environment(data_dir: Path) -> None:
    """Only the code's defaults: no TUNELOOP_* variable of this shell (nor DATABASE_URL) may
    change a document. Development, so the placeholder secrets are taken; `data_dir` keeps
    what building an app writes out of the checkout."""
    for name in list(os.environ):
        if name.startswith("TUNELOOP_") or name == "DATABASE_URL":
            del os.environ[name]
    os.environ["TUNELOOP_ENV"] = "development"
    os.environ["TUNELOOP_DATA_DIR"] = str(data_dir)


def build_apps() -> dict[str, Any]:
    """Service name -> its FastAPI app, in the local stack's order."""
    settings = load_settings()
    apps = {}
    for service in SERVICES:
        factory = importlib.import_module(f"services.{service}.app").create_app
        apps[service] = factory(settings)
    return apps


def broker_of(app: Any) -> NatsBroker:
    broker = app.state.runtime.broker
    assert isinstance(broker, NatsBroker)
    return broker


def openapi(app: Any) -> str:
    """The app's OpenAPI document as served at /openapi.json, keys sorted so that the file
    changes only when the API does."""
    return json.dumps(app.openapi(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
