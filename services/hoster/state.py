"""The hoster's running parts in one place (routes and handlers share it): eval engines,
deployments, the registry's event side, and the background work deployments need."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import Engine as Database

from services.hoster import artifacts, registry
from services.hoster.config import HosterSettings
from services.hoster.deployments import Deployments
from services.hoster.engines import EngineSpec, LoraEngine
from services.hoster.errors import ArtifactFailed
from services.hoster.eval_engines import EvalEngines
from services.hoster.models import Deployment
from services.hoster.vllm_engine import deployment_engines
from shared import bus
from shared.db import session_scope
from shared.events import DeploymentFailed, DeploymentReady, DeploymentStopped, EvalDecided, Event
from shared.settings import Settings
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.hoster")
Publish = Callable[[Event], Awaitable[None]]


@dataclass
class Hoster:
    settings: HosterSettings
    data_dir: Path
    store: ObjectStore
    database: Database
    publish: Publish
    eval_engines: EvalEngines
    deployments: Deployments
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    def build(cls, settings: Settings, database: Database, publish: Publish) -> Hoster:
        hoster_settings = HosterSettings()
        store = ObjectStore.from_settings(settings.s3)
        data_dir = settings.app.data_dir.resolve()

        def lora(spec: EngineSpec) -> LoraEngine:
            return LoraEngine(spec, hoster_settings)

        evals = EvalEngines(settings=hoster_settings, data_dir=data_dir, store=store, factory=lora)
        deployments = Deployments(
            settings=hoster_settings,
            data_dir=data_dir,
            store=store,
            database=database,
            factory=deployment_engines(hoster_settings),
        )
        return cls(hoster_settings, data_dir, store, database, publish, evals, deployments)

    async def start(self) -> None:
        stopped = await asyncio.to_thread(self.eval_engines.stop_leftovers)
        if stopped:
            log.info("stopped %d eval engines a previous hoster left running", len(stopped))
        for deployment_id in await asyncio.to_thread(self.deployments.recover):
            log.info("deployment %s: its engine is gone; starting it again", deployment_id)
            self.launch(deployment_id)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self.eval_engines.close_all)
        self.deployments.forget_all()

    # -- registry ---------------------------------------------------------------------------
    async def register(self, event: EvalDecided) -> None:
        """EvalDecided -> a registered version (once), ModelRegistered, and with auto_deploy and
        a gate not rejecting it, a deployment."""
        try:  # S3 unreachable (StorageError) is retried; a checkpoint never committed is not
            digest = await asyncio.to_thread(
                artifacts.checkpoint_digest, self.store, event.best_checkpoint_uri
            )
        except ArtifactFailed as exc:
            raise bus.PermanentError(exc.message) from None
        with session_scope(self.database) as session:
            version, created = registry.register(session, event, sha256=digest)
            registered = registry.registered_event(version)
        log.info(
            "%s %s as %s v%d",
            "registered" if created else "already registered",
            event.best_checkpoint_uri,
            version.name,
            version.version,
        )
        await self.publish(registered)
        if event.auto_deploy and event.gate != "rejected":
            deployment, new = await asyncio.to_thread(
                self.deployments.request, event.tenant, version.id
            )
            if new:
                self.launch(deployment.id)

    # -- deployments ------------------------------------------------------------------------
    def launch(self, deployment_id: str) -> None:
        task = asyncio.create_task(self._launch(deployment_id), name=f"deploy {deployment_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _launch(self, deployment_id: str) -> None:
        deployment = await asyncio.to_thread(self.deployments.launch, deployment_id)
        if deployment.status == "ready" and deployment.endpoint_url:
            await self.publish(
                DeploymentReady(
                    tenant=deployment.tenant,
                    deployment_id=deployment.id,
                    served_model_name=deployment.served_model_name,
                    endpoint_url=deployment.endpoint_url,
                    version_id=deployment.version_id,
                )
            )
        elif deployment.status == "failed":
            await self.publish(
                DeploymentFailed(
                    tenant=deployment.tenant,
                    deployment_id=deployment.id,
                    reason=deployment.error or "failed",
                )
            )

    async def undeploy(self, tenant: str, deployment_id: str) -> Deployment:
        deployment = await asyncio.to_thread(self.deployments.stop, tenant, deployment_id)
        await self.publish(
            DeploymentStopped(
                tenant=tenant,
                deployment_id=deployment.id,
                served_model_name=deployment.served_model_name,
            )
        )
        return deployment
