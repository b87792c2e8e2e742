"""Deployments: a registered version served by an engine that answers to the version's `ft:`
name, warmed up with one request naming it before it is ready. A tenant's LoRA versions of one
base share one engine (`LoraEngine` on CPU, vLLM on GPU): the first starts it with its adapter,
the next load theirs onto the running base (no reload), the last one out stops it. A full
fine-tune runs on `transformers serve` of its own; a catalogue base on a `LoraEngine` of its own.

The table holds the desired state; upkeep.py keeps the engines to it (adoption at start-up, the
crash watchdog, idle unloading). A deployment no call reached for `idle_unload_s` goes `cold`
unless pinned; a wake makes it pending and it is launched again. The pulled checkpoint is kept
on disk per version, so a relaunch is a restart, not a download.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlalchemy.engine import Engine as Database
from sqlmodel import col, select

from services.hoster import artifacts, registry
from services.hoster.config import HosterSettings
from services.hoster.engine_pool import EnginePool, Hosted, SlotKey, own_slot, shared_slot
from services.hoster.engines import Engine, EngineSpec
from services.hoster.errors import Conflict, HosterError, NotFound
from services.hoster.models import Deployment, ModelVersion
from shared.catalogue import CATALOGUE
from shared.db import session_scope, utcnow
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.hoster.deployments")
ACTIVE = registry.DEPLOYED  # pending, ready, cold: an engine serves it, will, or will again
EngineFactory = Callable[[EngineSpec, int | None], Engine]  # spec, pid of an engine to adopt


@dataclass(frozen=True)
class Plan:
    """Where a deployment runs: its slot, the name it answers, the adapter loaded onto a shared
    engine (None: an engine of its own), and the spec of the engine to start for the slot."""

    slot: SlotKey
    name: str
    adapter: Path | None
    spec: Callable[[str, Path], EngineSpec]  # (engine id, work dir) -> spec


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
        self.pool = EnginePool()
        # When each deployment's engine died lately (the watchdog's crash-loop rule).
        self.crashes: dict[str, list[float]] = {}

    # -- requests (quick, database only) ------------------------------------------------------
    def request(
        self, tenant: str, model: str, *, pinned: bool | None = None
    ) -> tuple[Deployment, bool]:
        """A deployment of the version `model` names (or of the catalogue base it names), and
        whether it is new (an active one of the same version or base is reused, `pinned` set on
        it when given). Conflict with the numbers for a version the gate rejected."""
        if model in CATALOGUE:
            found, new = self._request_base(tenant, model, pinned=bool(pinned))
        else:
            found, new = self._request_version(tenant, model, pinned=bool(pinned))
        if not new and pinned is not None and found.pinned != pinned:
            found = self.update(found.id, pinned=pinned)
        return found, new

    def _request_version(self, tenant: str, model: str, *, pinned: bool) -> tuple[Deployment, bool]:
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
        return self._add(tenant, version.name, version.id, pinned), True

    def _request_base(self, tenant: str, base_id: str, *, pinned: bool) -> tuple[Deployment, bool]:
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
        return self._add(tenant, base_id, None, pinned), True

    def _add(self, tenant: str, name: str, version_id: str | None, pinned: bool) -> Deployment:
        deployment = Deployment(
            id=f"dep-{uuid.uuid4().hex[:20]}",
            tenant=tenant,
            version_id=version_id,
            served_model_name=name,
            status="pending",
            pinned=pinned,
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

    def find(self, deployment_id: str) -> Deployment:
        """Any tenant's (the internal routes')."""
        with session_scope(self.database) as session:
            found = session.get(Deployment, deployment_id)
            if found is None:
                raise NotFound(f"deployment {deployment_id!r} not found")
            return found

    def list_for(self, tenant: str) -> list[Deployment]:
        with session_scope(self.database) as session:
            query = select(Deployment).where(Deployment.tenant == tenant)
            return list(session.exec(query.order_by(col(Deployment.created_at))).all())

    def wake(self, deployment_id: str) -> tuple[Deployment, bool]:
        """A cold deployment made pending again, to be launched; whether this call did it (of
        several wakes at once exactly one does, so they share one launch)."""
        woken = self.transition(deployment_id, "cold", status="pending", error=None)
        return self.find(deployment_id), woken

    # -- work (blocking: run in a thread) -----------------------------------------------------
    def launch(self, deployment_id: str) -> Deployment:
        """Pull + verify, start the engine or load onto the shared one, warm the name up; the
        deployment ready or failed (one no longer pending is left as it is)."""
        with session_scope(self.database) as session:
            deployment = session.get(Deployment, deployment_id)
            version_id = deployment.version_id if deployment else None
            version = session.get(ModelVersion, version_id) if version_id else None
        if deployment is None or (deployment.version_id is not None and version is None):
            raise NotFound(f"deployment {deployment_id!r} not found")
        if deployment.status != "pending":
            return deployment
        try:
            hosted = self._serve(deployment, self._plan(deployment, version))
        except HosterError as exc:
            log.warning("deployment %s failed: %s", deployment_id, exc.message)
            return self._settle(deployment_id, status="failed", error=exc.message)
        settled = self._settle(
            deployment_id,
            status="ready",
            endpoint_url=hosted.engine.base_url,
            pid=hosted.engine.pid,
            port=hosted.engine.port,
            engine_id=hosted.engine_id,
            error=None,
        )
        if settled.status != "ready":  # stopped meanwhile
            self._release(deployment_id)
        return settled

    def _serve(self, deployment: Deployment, plan: Plan) -> Hosted:
        """The slot's running engine with the deployment's adapter loaded onto it, or a new
        engine; either way one request naming the deployment has been answered."""
        with self.pool.slot_lock(plan.slot):
            hosted = self.pool.current(plan.slot)
            if hosted is not None and hosted.engine.alive():
                if deployment.id not in hosted.names and plan.adapter is not None:
                    hosted.engine.load_model(plan.name, plan.adapter)
                self.pool.bind(hosted, deployment.id, plan.name)
            else:  # none yet, or it died (its other deployments are the watchdog's)
                engine_id = f"eng-{uuid.uuid4().hex[:16]}" if plan.adapter else deployment.id
                spec = plan.spec(engine_id, self.root / "deployments" / engine_id)
                hosted = Hosted(engine_id, self.factory(spec, None), plan.slot)
                self.pool.add(hosted)
                self.pool.bind(hosted, deployment.id, plan.name)
                try:
                    hosted.engine.start()
                except HosterError:
                    self.pool.remove(engine_id)
                    raise
            try:
                hosted.engine.warm_up(plan.name)
            except HosterError:
                self.drop(hosted, deployment.id)
                raise
        return hosted

    def _plan(self, deployment: Deployment, version: ModelVersion | None) -> Plan:
        name = deployment.served_model_name
        if version is None:  # a catalogue base: its prepared directory, as it is
            base_dir = artifacts.base_dir(name, data_dir=self.data_dir)
            return Plan(
                own_slot(deployment.id), name, None,
                lambda engine_id, work_dir: EngineSpec(
                    engine_id, work_dir, base_name=name, base_dir=base_dir
                ),
            )  # fmt: skip
        pulled = artifacts.pull(
            self.store,
            version.checkpoint_uri,
            self.root / "versions" / version.id / "checkpoint",
            expect_sha256=version.sha256,
        )
        adapter_base = artifacts.base_of(pulled.model_dir, data_dir=self.data_dir)
        if adapter_base is None:  # a whole model: transformers serve, pinned to it

            def whole(engine_id: str, work_dir: Path) -> EngineSpec:
                artifacts.link_model(pulled.model_dir, work_dir / "models" / name)
                return EngineSpec(engine_id, work_dir, pinned=name)

            return Plan(own_slot(deployment.id), name, None, whole)
        adapter, base = pulled.model_dir.resolve(), version.base_model
        return Plan(
            shared_slot(deployment.tenant, base), name, adapter,
            lambda engine_id, work_dir: EngineSpec(
                engine_id, work_dir, base_name=base, base_dir=adapter_base.resolve(),
                models={name: adapter}, serve_base=False,
            ),
        )  # fmt: skip

    def stop(self, tenant: str, deployment_id: str) -> Deployment:
        """Undeploy: its adapter unloaded, its engine stopped if nothing else is on it."""
        self.get(tenant, deployment_id)  # 404 for another tenant's
        stopped = self.update(deployment_id, status="stopped", pid=None)
        self._release(deployment_id)
        return stopped

    def _release(self, deployment_id: str) -> None:
        hosted = self.pool.of(deployment_id)
        if hosted is None:
            return
        with self.pool.slot_lock(hosted.slot):
            self.drop(hosted, deployment_id)

    def drop(self, hosted: Hosted, deployment_id: str) -> None:
        """Take the deployment off its engine (the caller holds the slot's lock): the engine
        stops with its last deployment, else only the deployment's adapter is unloaded."""
        if self.pool.of(deployment_id) is not hosted:
            return
        unbound = self.pool.unbind(deployment_id)
        if not hosted.names:
            self.pool.remove(hosted.engine_id)
            hosted.engine.stop()
        elif unbound is not None:
            try:
                hosted.engine.unload_model(unbound[1])
            except HosterError as exc:  # a dying engine is the watchdog's
                log.warning("deployment %s: unloading failed: %s", deployment_id, exc.message)

    def forget_all(self) -> None:
        """At shutdown: engines keep serving (deployments outlive the hoster); forget them."""
        self.pool.clear()

    def _settle(self, deployment_id: str, **values: Any) -> Deployment:
        """values set if the deployment is still pending (not stopped meanwhile); the row."""
        self.transition(deployment_id, "pending", **values)
        return self.find(deployment_id)

    def transition(
        self, deployment_id: str, expect: str, *, unpinned: bool = False, **values: Any
    ) -> bool:
        """values set only if the deployment's status is `expect` (and it is not pinned, with
        `unpinned`), in one statement; whether they were."""
        where = [col(Deployment.id) == deployment_id, col(Deployment.status) == expect]
        if unpinned:
            where.append(col(Deployment.pinned).is_(False))
        with session_scope(self.database) as session:
            result = session.exec(
                update(Deployment).where(*where).values(updated_at=utcnow(), **values)
            )
            session.commit()
            return result.rowcount == 1

    def update(self, deployment_id: str, **values: object) -> Deployment:
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
