"""The web dashboard at /ui on the gateway: server-rendered pages of a tenant's datasets, jobs
(live loss and task-score curves), evaluations, run comparisons, models and deployments, with
Deploy / Rollback / Promote buttons. docs/dashboard.md."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from services.ingest.ui import routes, views
from services.ingest.ui.sessions import SessionStore, UiError


def install(app: FastAPI) -> None:
    """Mount the dashboard on the gateway's app (whose runtime holds the bus connection the
    sessions live on)."""
    runtime = app.state.runtime
    app.state.ui_sessions = SessionStore(lambda: runtime.broker.connection)
    app.include_router(routes.router)
    app.mount("/ui/static", StaticFiles(directory=views.STATIC_DIR), name="ui-static")
    app.add_exception_handler(UiError, routes.error_page)
