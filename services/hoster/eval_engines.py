"""Eval engines: one warm engine per (tenant, job, base model) that the evaluator asks for over the
internal API. It holds the base (for the base score) and loads each checkpoint onto it under its
own model name, in under a second for a LoRA adapter (`LoraEngine`); the checkpoint scored before
is unloaded, as the evaluator scores one point at a time.

They live in this process's memory: a restarted hoster stops the ones it left behind
(`engines.stop_leftovers`) and the evaluator asks again (`open` is idempotent).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.hoster import artifacts
from services.hoster.config import HosterSettings
from services.hoster.engines import EngineSpec, LoraEngine, stop_leftovers
from services.hoster.errors import BadRequest, NotFound
from shared.catalogue import CATALOGUE
from shared.storage import ObjectStore

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
EngineFactory = Callable[[EngineSpec], LoraEngine]


@dataclass
class EvalEngine:
    tenant: str
    job_id: str
    base_model: str
    engine: LoraEngine
    # step (or a registered version's id) -> served model name
    models: dict[int | str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def engine_id(self) -> str:
        return self.engine.engine_id


def checkpoint_model_name(job_id: str, step: int, version_id: str | None = None) -> str:
    """The model string an eval engine answers to for a checkpoint (or a registered version)."""
    return f"{job_id}:{version_id}" if version_id is not None else f"{job_id}:ckpt-step-{step}"


class EvalEngines:
    def __init__(
        self,
        *,
        settings: HosterSettings,
        data_dir: Path,
        store: ObjectStore,
        factory: EngineFactory,
    ) -> None:
        self.settings, self.data_dir, self.store, self.factory = settings, data_dir, store, factory
        self.root = settings.root(data_dir) / "eval"
        self._engines: dict[str, EvalEngine] = {}
        self._keys: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()
        self._opening: dict[tuple[str, str, str], threading.Lock] = {}

    def stop_leftovers(self) -> list[int]:
        stopped = stop_leftovers(self.root)
        shutil.rmtree(self.root, ignore_errors=True)
        return stopped

    def open(self, tenant: str, job_id: str, base_model: str) -> EvalEngine:
        """The job's engine for base_model, started (server up) if it is not running."""
        if not NAME_RE.fullmatch(job_id):
            raise BadRequest(f"job_id: {job_id!r} must match {NAME_RE.pattern}")
        if base_model not in CATALOGUE:
            raise BadRequest(
                f"base_model: {base_model!r} is not in the catalogue ({', '.join(CATALOGUE)})"
            )
        key = (tenant, job_id, base_model)
        with self._lock:
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:  # a second caller for the same job waits and gets the same engine
            with self._lock:
                known = self._engines.get(self._keys.get(key, ""))
            if known is not None and known.engine.alive():
                return known
            if known is not None:
                self.close(known.engine_id)
            return self._start(tenant, job_id, base_model)

    def _start(self, tenant: str, job_id: str, base_model: str) -> EvalEngine:
        engine_id = f"eng-{uuid.uuid4().hex[:16]}"
        base_dir = artifacts.base_dir(base_model, data_dir=self.data_dir)
        spec = EngineSpec(engine_id, self.root / engine_id, base_name=base_model, base_dir=base_dir)
        engine = self.factory(spec)
        engine.start()
        entry = EvalEngine(tenant, job_id, base_model, engine)
        with self._lock:
            self._engines[engine_id] = entry
            self._keys[(tenant, job_id, base_model)] = engine_id
        return entry

    def get(self, engine_id: str) -> EvalEngine:
        with self._lock:
            entry = self._engines.get(engine_id)
        if entry is None:
            raise NotFound(f"engine {engine_id!r} not found")
        return entry

    def add_checkpoint(
        self, engine_id: str, uri: str, step: int, version_id: str | None = None
    ) -> str:
        """Pull and verify the checkpoint, load it into the engine (unloading the one scored
        before); its model name. `version_id`: a registered version's checkpoint (the version
        serving the job's served name, which the evaluator compares it with), named for the
        version rather than a step of this job."""
        entry = self.get(engine_id)
        uri = artifacts.check_uri(uri, tenant=entry.tenant, bucket=self.store.bucket)
        key: int | str = version_id if version_id is not None else step
        name = checkpoint_model_name(entry.job_id, step, version_id)
        with entry.lock:
            if key not in entry.models:
                pulled = artifacts.pull(self.store, uri, self._pull_dir(entry, key))
                entry.engine.load_model(name, pulled.model_dir)
                for earlier in [k for k in entry.models if k != key]:
                    entry.engine.unload_model(entry.models.pop(earlier))
                    shutil.rmtree(self._pull_dir(entry, earlier), ignore_errors=True)
                entry.models[key] = name
        entry.engine.warm_up(name)
        return name

    @staticmethod
    def _pull_dir(entry: EvalEngine, key: int | str) -> Path:
        folder = f"step-{key}" if isinstance(key, int) else key
        return entry.engine.models_dir.parent / "pulls" / folder

    def close(self, engine_id: str) -> None:
        with self._lock:
            entry = self._engines.pop(engine_id, None)
            if entry is None:
                raise NotFound(f"engine {engine_id!r} not found")
            self._keys.pop((entry.tenant, entry.job_id, entry.base_model), None)
        entry.engine.stop()
        shutil.rmtree(entry.engine.models_dir.parent, ignore_errors=True)

    def close_all(self) -> None:
        for engine_id in list(self._engines):
            with contextlib.suppress(NotFound):
                self.close(engine_id)
