"""Engines that record what the hoster asks of them, and registered versions whose checkpoints
are already pulled, for the deployments' bookkeeping tests (no model, no S3: the real engines
run in test_shared_engines_service.py)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import Engine as Database

from services.hoster.config import HosterSettings
from services.hoster.deployments import Deployments
from services.hoster.engines import EngineSpec
from services.hoster.errors import EngineFailed
from services.hoster.models import ModelVersion
from shared.catalogue import MODELS_DIR_NAME
from shared.db import session_scope
from tests.services.hoster.checkpoints import BASE_ID

DIGEST = "0" * 64
_ports = itertools.count(20000)


@dataclass
class Calls:
    """What every engine was asked, in order: (what, engine id, name...)."""

    made: list[tuple[str, ...]] = field(default_factory=list)
    # The engine processes: pid -> the names loaded on it (what an adopting engine finds).
    processes: dict[int, dict[str, Path]] = field(default_factory=dict)
    alive_pids: set[int] = field(default_factory=set)  # engines a "previous hoster" left

    def of(self, what: str) -> list[tuple[str, ...]]:
        return [call for call in self.made if call[0] == what]


class FakeEngine:
    def __init__(self, spec: EngineSpec, calls: Calls, pid: int | None = None) -> None:
        self.spec, self.calls = spec, calls
        self.engine_id = spec.engine_id
        self.port = spec.port or next(_ports)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.running = pid is not None and pid in calls.alive_pids
        self._pid = pid
        self.loaded = calls.processes.get(pid, {}) if pid is not None else dict(spec.models)
        self.idle: dict[str, float] = {}  # what idle_seconds reports, per name
        self.lists_names = True
        self.fail_warm_up = False
        self.on_start: Callable[[], None] = lambda: None

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def models_dir(self) -> Path:
        return self.spec.work_dir / "models"

    def served(self) -> set[str]:
        names = set(self.loaded)
        if self.spec.base_name and self.spec.serve_base:
            names.add(self.spec.base_name)
        return names | ({self.spec.pinned} if self.spec.pinned else set())

    def start(self) -> None:
        self.calls.made.append(("start", self.engine_id, *sorted(self.spec.models)))
        self.running, self._pid = True, self.port
        self.calls.processes[self.port] = self.loaded
        self.on_start()

    def alive(self) -> bool:
        return self.running

    def healthy(self) -> bool:
        return self.running

    def warm_up(self, model: str) -> None:
        assert model in self.served(), (model, self.served())
        self.calls.made.append(("warm_up", self.engine_id, model))
        if self.fail_warm_up:
            raise EngineFailed(f"engine {self.engine_id} answered 500 for {model!r}")

    def load_model(self, name: str, path: Path) -> None:
        self.calls.made.append(("load", self.engine_id, name))
        self.loaded[name] = path

    def unload_model(self, name: str) -> None:
        self.calls.made.append(("unload", self.engine_id, name))
        self.loaded.pop(name, None)

    def idle_seconds(self) -> dict[str, float] | None:
        if not self.lists_names:
            return None
        return {name: self.idle.get(name, 0.0) for name in self.loaded}

    def stop(self) -> None:
        if self.running:
            self.calls.made.append(("stop", self.engine_id))
        self.running = False

    def log_tail(self) -> str:
        return "Killed"


class Store:
    """An object store whose every checkpoint is committed with DIGEST (pulls are on disk)."""

    bucket = "tuneloop"

    def get_bytes(self, key: str) -> bytes:
        return DIGEST.encode()


def make_deployments(
    database: Database, data_dir: Path, calls: Calls, **settings: float
) -> tuple[Deployments, list[FakeEngine]]:
    base = data_dir / MODELS_DIR_NAME / BASE_ID
    base.mkdir(parents=True, exist_ok=True)
    (base / "config.json").write_text("{}")
    engines: list[FakeEngine] = []

    def factory(spec: EngineSpec, pid: int | None) -> FakeEngine:
        engines.append(FakeEngine(spec, calls, pid))
        return engines[-1]

    deployments = Deployments(
        settings=HosterSettings(work_dir=data_dir / "hoster", **settings),  # type: ignore[arg-type]
        data_dir=data_dir, store=Store(), database=database,  # type: ignore[arg-type]
        factory=factory,
    )  # fmt: skip
    return deployments, engines


def register(
    deployments: Deployments, version_id: str, *, tenant: str = "acme", adapter: bool = True
) -> str:
    """A version whose checkpoint is pulled already (a LoRA adapter, or a whole model); its
    ft: name."""
    name = f"ft:{BASE_ID}:x:{version_id}"
    pulled = deployments.root / "versions" / version_id / "checkpoint"
    (pulled / "model").mkdir(parents=True, exist_ok=True)
    (pulled / ".sha256").write_text(DIGEST)
    config = {"base_model_name_or_path": BASE_ID, "r": 4}
    (pulled / "model" / ("adapter_config.json" if adapter else "config.json")).write_text(
        json.dumps(config)
    )
    with session_scope(deployments.database) as session:
        session.add(
            ModelVersion(
                id=version_id, tenant=tenant, name=name, version=1, base_model=BASE_ID,
                job_id=f"job-{version_id}", dataset_id="ds", dataset_version="1", step=1,
                checkpoint_uri=f"s3://tuneloop/tenants/{tenant}/jobs/j/checkpoints/{version_id}",
                sha256=DIGEST, gate="passed",
            )
        )  # fmt: skip
        session.commit()
    return name
