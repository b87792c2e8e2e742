"""The hoster's running parts in one place (routes and handlers share it): eval engines,
deployments, the registry's event side, and the background work deployments need."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import Engine as Database

from services.hoster import announce, artifacts, registry, upkeep
from services.hoster.config import HosterSettings
from services.hoster.deployments import Deployments
from services.hoster.engines import EngineSpec, LoraEngine
from services.hoster.errors import ArtifactFailed, Conflict, EngineFailed, NotReady
from services.hoster.eval_engines import EvalEngines
from services.hoster.models import Deployment
from services.hoster.served_names import Role, ServedNames
from services.hoster.vllm_engine import deployment_engines
from shared import bus
from shared.db import session_scope
from shared.events import (
    CanaryFailed,
    CanaryPolicy,
    DeploymentCold,
    DeploymentFailed,
    DeploymentReady,
    DeploymentStopped,
    EvalDecided,
    Event,
    ShadowScored,
)
from shared.ft_names import job_suffix
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
    served: ServedNames
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _launching: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # One wake at a time per deployment: a second caller must read the row only after the
    # first has registered its launch, or it sees `pending` with no launch to wait on.
    _waking: dict[str, asyncio.Lock] = field(default_factory=dict)

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
        served = ServedNames(database)
        return cls(hoster_settings, data_dir, store, database, publish, evals, deployments, served)

    async def start(self) -> None:
        stopped = await asyncio.to_thread(self.eval_engines.stop_leftovers)
        if stopped:
            log.info("stopped %d eval engines a previous hoster left running", len(stopped))
        for deployment_id in await asyncio.to_thread(upkeep.recover, self.deployments):
            log.info("deployment %s: its engine is gone; starting it again", deployment_id)
            self.launch(deployment_id)
        for loop, name in ((self.watch(), "deployment watchdog"), (self.announce(), "announcer")):
            task = asyncio.create_task(loop, name=name)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def announce(self) -> None:
        """Tell the bus again what serves, every `announce_interval_s` (announce.py says why)."""
        while True:
            await asyncio.sleep(self.settings.announce_interval_s)
            try:
                await self._publish_all(await asyncio.to_thread(announce.live_state, self.database))
            except Exception:  # the database or NATS away: tried again next round
                log.exception("re-announcing the deployments failed")

    async def watch(self) -> None:
        """Start again the engines of ready deployments that died (a crash, an OOM kill); a
        deployment whose engine keeps dying fails with its log's tail instead. Unload the ones
        idle past `idle_unload_s` (cold)."""
        while True:
            await asyncio.sleep(self.settings.watch_interval_s)
            try:
                now = time.monotonic()
                again, failed = await asyncio.to_thread(upkeep.crashed, self.deployments, now)
                cold = await asyncio.to_thread(upkeep.idle, self.deployments)
            except Exception:  # the database away: tried again next round
                log.exception("checking deployments' engines failed")
                continue
            for deployment in cold:
                await self.publish(
                    DeploymentCold(
                        tenant=deployment.tenant,
                        deployment_id=deployment.id,
                        served_model_name=deployment.served_model_name,
                        idle_s=self.settings.idle_unload_s,
                    )
                )
            for deployment in failed:
                await self.publish(
                    DeploymentFailed(
                        tenant=deployment.tenant,
                        deployment_id=deployment.id,
                        served_model_name=deployment.served_model_name,
                        served_name=deployment.served_name,
                        reason=deployment.error or "failed",
                    )
                )
                await self._publish_all(await asyncio.to_thread(self.served.stopped, deployment.id))
            for deployment_id in again:
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
        a gate not rejecting it, a deployment: under a served name that has a primary, as its
        canary only when the evaluator did not find it worse than that primary."""
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
            # Under the job's suffix, if it has one: a name already served gets the new version
            # as a canary (promoted or rolled back on its numbers), never as a replacement, and
            # only if it scored at least as well as the version serving it on the same eval
            # items (the evaluator's `beats_serving`; None: not compared).
            name = job_suffix(version.name)
            canary = bool(name) and await asyncio.to_thread(
                self.served.has_primary, event.tenant, name
            )
            if canary and event.beats_serving is False:
                log.info(
                    "%s v%d registered, not deployed as %s's canary: %.3f against the serving "
                    "version %s's %.3f",
                    version.name, version.version, name, event.best_score or 0.0,
                    event.serving_version_id, event.serving_score or 0.0,
                )  # fmt: skip
                return
            await self.deploy(
                event.tenant,
                version.id,
                served_name=name or None,
                role="canary" if canary else "primary",
                percent=self.settings.canary_percent if canary else None,
            )

    async def deploy(
        self,
        tenant: str,
        model: str,
        *,
        served_name: str | None = None,
        role: Role = "primary",
        percent: float | None = None,
        policy: CanaryPolicy | None = None,
        pinned: bool | None = None,
    ) -> Deployment:
        """A deployment of `model` (an active one reused, and woken if cold), launched if new;
        under `served_name` it takes `role` there once ready."""
        deployment, new = await asyncio.to_thread(
            self.deployments.request, tenant, model, pinned=pinned
        )
        if served_name is not None:
            changed = await asyncio.to_thread(
                self.served.attach, deployment, served_name, role, percent=percent, policy=policy
            )
            await self._publish_all(changed)
        if new:
            self.launch(deployment.id)
        elif deployment.status == "cold":
            await self._wake(deployment.id)
        return await asyncio.to_thread(self.deployments.get, tenant, deployment.id)

    async def _publish_all(self, events: list[Event]) -> None:
        for event in events:
            await self.publish(event)

    # -- served names ----------------------------------------------------------------------------
    async def promote(self, tenant: str, name: str, *, force: bool = False) -> None:
        promoted = await asyncio.to_thread(self.served.promote, tenant, name, force=force)
        await self._publish_all(promoted)

    async def rollback(self, tenant: str, name: str) -> None:
        changed = await asyncio.to_thread(
            self.served.rollback, tenant, name, reason="rolled back by request"
        )
        await self._publish_all(changed)

    async def set_canary(
        self,
        tenant: str,
        name: str,
        percent: float | None,
        policy: CanaryPolicy | None,
        shadow_percent: float | None = None,
    ) -> None:
        changed = await asyncio.to_thread(
            self.served.set_percent, tenant, name, percent, policy, shadow_percent
        )
        await self._publish_all(changed)

    async def canary_failed(self, event: CanaryFailed) -> None:
        """A gateway saw the canary cross its policy: take it out (once, whoever said so)."""
        said = f"{event.reason}: {event.errors} errors in {event.requests} calls" + (
            f", p95 {event.p95_ms:.0f} ms" if event.p95_ms is not None else ""
        )
        changed = await asyncio.to_thread(
            self.served.rollback, event.tenant, event.name, reason=said, failed=event
        )
        if changed:
            log.warning(
                "served name %s (%s): canary rolled back: %s", event.name, event.tenant, said
            )
        await self._publish_all(changed)

    async def shadow_scored(self, event: ShadowScored) -> None:
        """The evaluator scored a shadow pairwise: kept for promote; a `worse` one is taken
        out when the name's policy says so (`shadow_worse`)."""
        worse = await asyncio.to_thread(self.served.score_shadow, event)
        if worse is None:
            return
        changed = await asyncio.to_thread(self.served.shadow_worse, event.tenant, event.name, worse)
        if changed:
            log.warning(
                "served name %s (%s): shadow %s taken out: %s",
                event.name, event.tenant, worse, event.score.describe(),
            )  # fmt: skip
        await self._publish_all(changed)

    # -- deployments ------------------------------------------------------------------------
    def launch(self, deployment_id: str) -> None:
        task = asyncio.create_task(self._launch(deployment_id), name=f"deploy {deployment_id}")
        self._tasks.add(task)
        self._launching[deployment_id] = task
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._launched)

    def _launched(self, task: asyncio.Task[None]) -> None:
        for deployment_id, running in list(self._launching.items()):
            if running is task:
                del self._launching[deployment_id]

    async def wake(self, deployment_id: str) -> Deployment:
        """A cold deployment loaded again and warmed up; returns once it is ready (at once if
        it is), waiting at most as long as an engine may take to start and load. Concurrent
        wakes share one launch. NotReady when it is still loading then."""
        async with self._waking.setdefault(deployment_id, asyncio.Lock()):
            await self._wake(deployment_id)
            task = self._launching.get(deployment_id)
        if task is not None:
            limit = self.settings.engine_start_timeout_s + self.settings.engine_load_timeout_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), limit)
        deployment = await asyncio.to_thread(self.deployments.find, deployment_id)
        if deployment.status == "ready":
            return deployment
        if deployment.status == "failed":
            raise EngineFailed(f"deployment {deployment_id}: {deployment.error or 'failed'}")
        if deployment.status == "pending":
            raise NotReady(f"deployment {deployment_id} is still loading; call again")
        raise Conflict(f"deployment {deployment_id} is {deployment.status}; deploy it again")

    async def _wake(self, deployment_id: str) -> None:
        _, woken = await asyncio.to_thread(self.deployments.wake, deployment_id)
        if woken:
            self.launch(deployment_id)

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
            await self._publish_all(await asyncio.to_thread(self.served.ready, deployment.id))
        elif deployment.status == "failed":
            await self.publish(
                DeploymentFailed(
                    tenant=deployment.tenant,
                    deployment_id=deployment.id,
                    served_model_name=deployment.served_model_name,
                    served_name=deployment.served_name,
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
        await self._publish_all(await asyncio.to_thread(self.served.stopped, deployment.id))
        return deployment
