"""Deployments: a registered version served by an engine of its own that answers to the version's
`ft:` name, warmed up before it is ready. A LoRA version runs on a `LoraEngine` of its base with
the adapter loaded under that name (no merge); a full fine-tune's model on `transformers serve`,
pinned to it. A catalogue base deploys under its catalogue id on a `LoraEngine` of its own.

The table holds the desired state. At start-up a pending or ready deployment whose engine is gone
is started again (the pulled checkpoint is kept on disk per version, so that is a restart, not a
download); a live one is adopted.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import Engine as Database
from sqlmodel import col, select

from services.hoster import artifacts, registry
from services.hoster.config import HosterSettings
from services.hoster.engines import Engine, EngineSpec
from services.hoster.errors import Conflict, HosterError, NotFound
from services.hoster.models import Deployment, ModelVersion
from shared.catalogue import CATALOGUE
from shared.db import session_scope, utcnow
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.hoster.deployments")
ACTIVE = ("pending", "ready")
EngineFactory = Callable[[EngineSpec, int | None], Engine]  # spec, pid of an engine to adopt


class Deployments:
    def __init__(
        self,
        *,
        settings: HosterSettings,
        data_dir: Path,
        store: ObjectStore,
        database: Database,
        factory: EngineFactory,
    ) -> None:
        self.settings, self.data_dir, self.store = settings, data_dir, store
        self.database, self.factory = database, factory
        self.root = settings.root(data_dir)
        self._engines: dict[str, Engine] = {}
        # When each deployment's engine died lately (the watchdog's crash-loop rule).
        self._crashes: dict[str, list[float]] = {}

    # -- requests (quick, database only) ------------------------------------------------------
    def request(self, tenant: str, model: str) -> tuple[Deployment, bool]:
        """A deployment of the version `model` names (or of the catalogue base it names), and
        whether it is new (an active one of the same version or base is reused). Conflict with
        the numbers for a version the gate rejected."""
        if model in CATALOGUE:
            return self._request_base(tenant, model)
        with session_scope(self.database) as session:
            version = registry.resolve(session, tenant, model)
            if version.gate == "rejected":
                raise Conflict(
                    f"model: {version.name} (version {version.id}) was rejected by the eval gate: "
                    f"{version.gate_reason or 'no reason recorded'}",
                    version_id=version.id,
                    task_score=version.best_score,
                    base_score=version.base_score,
                    gate=version.gate,
                    gate_reason=version.gate_reason,
                )
            active = session.exec(
                select(Deployment).where(
                    Deployment.tenant == tenant,
                    Deployment.version_id == version.id,
                    col(Deployment.status).in_(ACTIVE),
                )
            ).first()
            if active is not None:
                return active, False
        return self._add(tenant, version.name, version.id), True

    def _request_base(self, tenant: str, base_id: str) -> tuple[Deployment, bool]:
        """A catalogue base, served under its catalogue id by the tenant's own engine (so the
        gateway's (tenant, name) routing and the deployment's lifetime work as for versions)."""
        artifacts.base_dir(base_id, data_dir=self.data_dir)  # refused now, not failed later
        with session_scope(self.database) as session:
            active = session.exec(
                select(Deployment).where(
                    Deployment.tenant == tenant,
                    col(Deployment.version_id).is_(None),
                    Deployment.served_model_name == base_id,
                    col(Deployment.status).in_(ACTIVE),
                )
            ).first()
            if active is not None:
                return active, False
        return self._add(tenant, base_id, None), True

    def _add(self, tenant: str, name: str, version_id: str | None) -> Deployment:
        deployment = Deployment(
            id=f"dep-{uuid.uuid4().hex[:20]}",
            tenant=tenant,
            version_id=version_id,
            served_model_name=name,
            status="pending",
        )
        with session_scope(self.database) as session:
            session.add(deployment)
            session.commit()
            session.refresh(deployment)
            return deployment

    def get(self, tenant: str, deployment_id: str) -> Deployment:
        with session_scope(self.database) as session:
            found = session.get(Deployment, deployment_id)
            if found is None or found.tenant != tenant:
                raise NotFound(f"deployment {deployment_id!r} not found")
            return found

    def list_for(self, tenant: str) -> list[Deployment]:
        with session_scope(self.database) as session:
            query = select(Deployment).where(Deployment.tenant == tenant)
            return list(session.exec(query.order_by(col(Deployment.created_at))).all())

    # -- work (blocking: run in a thread) -----------------------------------------------------
    def launch(self, deployment_id: str) -> Deployment:
        """Pull + verify, start the engine, warm it up; the deployment ready or failed."""
        with session_scope(self.database) as session:
            deployment = session.get(Deployment, deployment_id)
            version_id = deployment.version_id if deployment else None
            version = session.get(ModelVersion, version_id) if version_id else None
        if deployment is None or (deployment.version_id is not None and version is None):
            raise NotFound(f"deployment {deployment_id!r} not found")
        try:
            engine = self._start(deployment, version)
        except HosterError as exc:
            log.warning("deployment %s failed: %s", deployment_id, exc.message)
            return self._update(deployment_id, status="failed", error=exc.message)
        if self.get(deployment.tenant, deployment_id).status == "stopped":  # deleted meanwhile
            engine.stop()
            return self.get(deployment.tenant, deployment_id)
        return self._update(
            deployment_id,
            status="ready",
            endpoint_url=engine.base_url,
            pid=engine.pid,
            port=engine.port,
            error=None,
        )

    def _start(self, deployment: Deployment, version: ModelVersion | None) -> Engine:
        engine = self.factory(self._spec(deployment, version), None)
        self._engines[deployment.id] = engine
        engine.start()
        engine.warm_up(deployment.served_model_name)
        return engine

    def _spec(self, deployment: Deployment, version: ModelVersion | None) -> EngineSpec:
        work_dir = self.root / "deployments" / deployment.id
        name = deployment.served_model_name
        if version is None:  # a catalogue base: its prepared directory, as it is
            base_dir = artifacts.base_dir(name, data_dir=self.data_dir)
            return EngineSpec(
                deployment.id, work_dir, pinned=name, base_name=name, base_dir=base_dir
            )
        pulled = artifacts.pull(
            self.store,
            version.checkpoint_uri,
            self.root / "versions" / version.id / "checkpoint",
            expect_sha256=version.sha256,
        )
        adapter_base = artifacts.base_of(pulled.model_dir, data_dir=self.data_dir)
        if adapter_base is None:  # a whole model: transformers serve, pinned to it
            artifacts.link_model(pulled.model_dir, work_dir / "models" / name)
            return EngineSpec(deployment.id, work_dir, pinned=name)
        return EngineSpec(
            deployment.id, work_dir, pinned=name, base_name=version.base_model,
            base_dir=adapter_base.resolve(), models={name: pulled.model_dir.resolve()},
        )  # fmt: skip

    def stop(self, tenant: str, deployment_id: str) -> Deployment:
        self.get(tenant, deployment_id)  # 404 for another tenant's
        engine = self._engines.pop(deployment_id, None)
        if engine is not None:
            engine.stop()
        return self._update(deployment_id, status="stopped", pid=None)

    def recover(self) -> list[str]:
        """At start-up: adopt the active deployments whose engine still serves; the ids of those
        to launch again (their engine is gone)."""
        relaunch = []
        with session_scope(self.database) as session:
            active = session.exec(select(Deployment).where(col(Deployment.status).in_(ACTIVE)))
            rows = list(active.all())
        for deployment in rows:
            # Adopting needs only the pid and port (alive, healthy, stop), whatever the kind.
            spec = EngineSpec(
                engine_id=deployment.id,
                work_dir=self.root / "deployments" / deployment.id,
                pinned=deployment.served_model_name,
                port=deployment.port,
            )
            engine = self.factory(spec, deployment.pid)
            if deployment.status == "ready" and engine.alive() and engine.healthy():
                self._engines[deployment.id] = engine
                continue
            engine.stop()  # a pending one's engine may be up but never warmed up
            self._update(deployment.id, status="pending", pid=None)
            relaunch.append(deployment.id)
        return relaunch

    def crashed(self, now: float) -> tuple[list[str], list[Deployment]]:
        """The ready deployments whose engine process has died: (those to start again, those
        failed for crashing `crash_limit` times within `crash_window_s`, with the log's tail)."""
        again, failed = [], []
        for deployment_id, engine in list(self._engines.items()):
            if engine.alive():
                continue
            del self._engines[deployment_id]
            recent = [
                t
                for t in self._crashes.get(deployment_id, [])
                if now - t < self.settings.crash_window_s
            ]
            recent.append(now)
            self._crashes[deployment_id] = recent
            tail = engine.log_tail()
            if len(recent) >= self.settings.crash_limit:
                message = (
                    f"the engine crashed {len(recent)} times within "
                    f"{self.settings.crash_window_s:g} s; its log ends: {tail}"
                )
                failed.append(self._update(deployment_id, status="failed", pid=None, error=message))
                continue
            log.warning(
                "deployment %s: its engine died; starting it again. Log: %s", deployment_id, tail
            )
            self._update(deployment_id, status="pending", pid=None)
            again.append(deployment_id)
        return again, failed

    def forget_all(self) -> None:
        """At shutdown: engines keep serving (deployments outlive the hoster); forget them."""
        self._engines.clear()

    def _update(self, deployment_id: str, **values: object) -> Deployment:
        with session_scope(self.database) as session:
            deployment = session.get(Deployment, deployment_id)
            if deployment is None:
                raise NotFound(f"deployment {deployment_id!r} not found")
            for name, value in values.items():
                setattr(deployment, name, value)
            deployment.updated_at = utcnow()
            session.add(deployment)
            session.commit()
            session.refresh(deployment)
            return deployment
