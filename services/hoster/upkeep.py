"""Keeping deployments' engines as the table wants them: at start-up, adopt the engines a previous
hoster left serving and start again the rest (`recover`); while running, start again the
deployments whose engine died, or fail those that keep crashing (`crashed`, the watchdog's rule),
and unload those no call reached for `idle_unload_s` (`idle`: cold until woken). Blocking calls;
the service runs them in threads.
"""

from __future__ import annotations

import logging

from sqlmodel import col, select

from services.hoster import artifacts
from services.hoster.deployments import Deployments
from services.hoster.engine_pool import Hosted, own_slot, shared_slot
from services.hoster.engines import EngineSpec
from services.hoster.errors import HosterError
from services.hoster.models import Deployment, ModelVersion
from shared.db import session_scope

log = logging.getLogger("tuneloop.hoster.deployments")
Row = tuple[Deployment, ModelVersion | None]


def recover(deployments: Deployments) -> list[str]:
    """Adopt the engines of ready deployments that still serve (a shared one with the adapters
    it still has); the ids of the deployments to launch again, pending once more."""
    with session_scope(deployments.database) as session:
        found = session.exec(
            select(Deployment, ModelVersion)
            .join(ModelVersion, col(Deployment.version_id) == col(ModelVersion.id), isouter=True)
            .where(col(Deployment.status).in_(("pending", "ready")))
        )
        rows = list(found.all())
    relaunch = [d.id for d, _ in rows if d.status == "pending"]
    groups: dict[str, list[Row]] = {}
    for deployment, version in rows:
        if deployment.status == "ready":
            groups.setdefault(deployment.engine_id or deployment.id, []).append(
                (deployment, version)
            )
    for engine_id, group in groups.items():
        relaunch += _adopt(deployments, engine_id, group)
    for deployment_id in relaunch:
        deployments.update(deployment_id, status="pending", pid=None)
    return relaunch


def _adopt(deployments: Deployments, engine_id: str, group: list[Row]) -> list[str]:
    """Adopt the engine a group of ready deployments ran on if it serves; those to launch."""
    first, version = group[0]
    spec = EngineSpec(
        engine_id, deployments.root / "deployments" / engine_id, port=first.port,
        pinned=first.served_model_name if engine_id == first.id else None,
    )  # fmt: skip
    slot = own_slot(first.id)
    if engine_id != first.id and version is not None:  # the shared engine of LoRA versions
        slot = shared_slot(first.tenant, version.base_model)
        spec.base_name, spec.serve_base = version.base_model, False
        try:  # vLLM checks an adapter against its base before loading it
            spec.base_dir = artifacts.base_dir(version.base_model, data_dir=deployments.data_dir)
        except HosterError:
            spec.base_dir = None
    engine = deployments.factory(spec, first.pid)
    try:
        serves = engine.alive() and engine.healthy()
        seconds = engine.idle_seconds() if serves else None  # None: it cannot list its names
    except HosterError:
        serves = False
    if not serves:
        engine.stop()
        return [d.id for d, _ in group]
    hosted = Hosted(engine_id, engine, slot)
    deployments.pool.add(hosted)
    missing = []
    for deployment, _ in group:
        if seconds is None or deployment.served_model_name in seconds:
            deployments.pool.bind(hosted, deployment.id, deployment.served_model_name)
        else:  # not on the engine (a restart raced its unload): loaded again by a launch
            missing.append(deployment.id)
    return missing


def crashed(deployments: Deployments, now: float) -> tuple[list[str], list[Deployment]]:
    """The ready deployments whose engine process has died (a shared engine's all at once):
    (those to start again, now pending; those failed for crashing `crash_limit` times within
    `crash_window_s`, with the log's tail)."""
    again, failed = [], []
    settings = deployments.settings
    for hosted in deployments.pool.engines():
        if hosted.engine.alive():
            continue
        served = deployments.pool.remove(hosted.engine_id)
        tail = hosted.engine.log_tail()
        for deployment_id in served:
            if deployments.find(deployment_id).status != "ready":
                continue  # a launch under way settles it
            recent = [
                t for t in deployments.crashes.get(deployment_id, [])
                if now - t < settings.crash_window_s
            ] + [now]  # fmt: skip
            deployments.crashes[deployment_id] = recent
            if len(recent) >= settings.crash_limit:
                message = (
                    f"the engine crashed {len(recent)} times within "
                    f"{settings.crash_window_s:g} s; its log ends: {tail}"
                )
                failed.append(
                    deployments.update(deployment_id, status="failed", pid=None, error=message)
                )
                continue
            log.warning(
                "deployment %s: its engine died; starting it again. Log: %s", deployment_id, tail
            )
            deployments.update(deployment_id, status="pending", pid=None)
            again.append(deployment_id)
    return again, failed


def idle(deployments: Deployments) -> list[Deployment]:
    """Unload the ready, unpinned deployments no call reached for `idle_unload_s` (an adapter
    unloaded; an engine stopped once nothing is left on it); they are `cold` now. An engine that
    cannot say how long its names idled (`idle_seconds` None) keeps them."""
    limit = deployments.settings.idle_unload_s
    if limit <= 0:
        return []
    cold = []
    for hosted in deployments.pool.engines():
        try:
            seconds = hosted.engine.idle_seconds() if hosted.engine.alive() else None
        except HosterError as exc:  # a dying engine is the watchdog's
            log.warning("engine %s: %s", hosted.engine_id, exc.message)
            continue
        for deployment_id, name in list(hosted.names.items()):
            if seconds is not None and seconds.get(name, 0.0) >= limit:
                went = _cool(deployments, hosted, deployment_id)
                cold += [went] if went is not None else []
    return cold


def _cool(deployments: Deployments, hosted: Hosted, deployment_id: str) -> Deployment | None:
    with deployments.pool.slot_lock(hosted.slot):
        if not deployments.transition(
            deployment_id, "ready", unpinned=True, status="cold", pid=None
        ):
            return None  # pinned, stopped or relaunched meanwhile
        deployments.drop(hosted, deployment_id)
    log.info(
        "deployment %s: no call for %g s; unloaded (cold)",
        deployment_id,
        deployments.settings.idle_unload_s,
    )
    return deployments.find(deployment_id)
