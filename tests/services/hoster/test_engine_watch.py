"""The deployments' watchdog rule: a dead engine's deployment is started again, and one whose
engine dies `crash_limit` times within `crash_window_s` fails, saying why with its log's tail
(the whole path, kill -9 of a real engine, is in test_hoster_service.py)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine.url import URL

from services.hoster.config import HosterSettings
from services.hoster.deployments import Deployments
from services.hoster.models import Deployment
from shared.db import make_engine, session_scope
from shared.storage import ObjectStore


class DeadEngine:
    def alive(self) -> bool:
        return False

    def log_tail(self) -> str:
        return "Killed (out of memory)"


def test_a_dead_engine_is_started_again_until_it_keeps_dying(
    sqlite_url: URL, tmp_path: Path, object_store: ObjectStore
) -> None:
    database = make_engine(sqlite_url)
    settings = HosterSettings(crash_limit=3, crash_window_s=60)
    deployments = Deployments(
        settings=settings, data_dir=tmp_path, store=object_store, database=database,
        factory=lambda spec, pid: DeadEngine(),  # type: ignore[arg-type,return-value]
    )  # fmt: skip
    with session_scope(database) as session:
        session.add(Deployment(id="dep-1", tenant="acme", served_model_name="ft:x", status="ready"))
        session.commit()
    try:
        for crash, at in enumerate((0.0, 10.0), start=1):
            deployments._engines["dep-1"] = DeadEngine()  # type: ignore[assignment]
            assert deployments.crashed(at) == (["dep-1"], []), crash
            assert deployments.get("acme", "dep-1").status == "pending"
        deployments._engines["dep-1"] = DeadEngine()  # type: ignore[assignment]
        again, [failed] = deployments.crashed(20.0)
        assert again == []
        assert failed.status == "failed"
        assert failed.error == (
            "the engine crashed 3 times within 60 s; its log ends: Killed (out of memory)"
        )
        # Outside the window the count starts over.
        deployments._engines["dep-1"] = DeadEngine()  # type: ignore[assignment]
        assert deployments.crashed(200.0) == (["dep-1"], [])
    finally:
        database.dispose()
