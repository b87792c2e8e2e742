"""Served names: the stable names a tenant's callers use, each answered by one deployment (its
primary) and, while a change is tried on a little traffic, a second one (its canary).

`ft:<base>:<suffix>:<job>` always means one version; a served name (`tickets`, chosen when
deploying, or the job's suffix for an auto-deploy) is what switches, canaries and rollbacks act
on. A deployment asked for under a served name takes its place there once it is ready:
- as `primary` (a switch): the one it replaces becomes `previous`, what a rollback goes back to;
  the gateway sends new calls to the new one while the old one finishes those it has (its
  engine runs on until it is undeployed): nothing in flight fails;
- as `canary`: it gets `canary_percent` of the calls until it is promoted (it becomes the
  primary) or rolled back (taken out; by hand, or by itself when a gateway sees its error rate
  or p95 latency cross the name's policy: `deployment.canary_failed`);
- as `shadow`: `shadow_percent` of the primary's calls are sent to it too, after they are
  answered; its answers are kept as samples paired with the primary's (for the evaluator's
  pairwise score), never returned. Promote and rollback act on the canary, else the shadow. A
  shadow is promoted only when its latest pairwise score (`eval.shadow_scored`, kept as
  `shadow_score`) says `better`, unless forced; one scored `worse` is taken out by itself
  when the name's policy says so (`shadow_worse`, the canary's policy object).
Every change bumps the name's `revision` and is published whole (`deployment.served_name_changed`),
so a gateway that replays the stream ends at the newest state whatever the order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy.engine import Engine as Database
from sqlmodel import Session, col, select

from services.hoster.errors import Conflict, NotFound
from services.hoster.models import Deployment, ServedName
from shared.db import session_scope, utcnow
from shared.events import (
    CanaryFailed,
    CanaryPolicy,
    DeploymentRolledBack,
    Event,
    PairwiseScore,
    ServedNameChanged,
    ServedTarget,
    ShadowScored,
)

Role = Literal["primary", "canary", "shadow"]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


@dataclass
class ServedNames:
    database: Database

    # -- reading -------------------------------------------------------------------------------
    def get(self, tenant: str, name: str) -> ServedName:
        with session_scope(self.database) as session:
            row = session.get(ServedName, (tenant, name))
            if row is None:
                raise NotFound(f"served name {name!r} not found")
            return row

    def list_for(self, tenant: str) -> list[ServedName]:
        with session_scope(self.database) as session:
            query = select(ServedName).where(ServedName.tenant == tenant)
            return list(session.exec(query.order_by(col(ServedName.name))).all())

    def has_primary(self, tenant: str, name: str) -> bool:
        with session_scope(self.database) as session:
            row = session.get(ServedName, (tenant, name))
            return row is not None and row.primary_id is not None

    # -- changes ---------------------------------------------------------------------------------
    def attach(
        self,
        deployment: Deployment,
        name: str,
        role: Role,
        *,
        percent: float | None,
        policy: CanaryPolicy | None,
    ) -> list[Event]:
        """Ask for `deployment` to take `role` under `name`: now if it is ready, else once it
        is (`ready`). A canary needs a primary to share with."""
        with session_scope(self.database) as session:
            row = session.get(ServedName, (deployment.tenant, name))
            if role != "primary" and (row is None or row.primary_id is None):
                raise Conflict(
                    f"served_name: {name!r} has no primary yet; deploy the first version as its "
                    f"primary (no canary_percent or shadow_percent), then the {role}"
                )
            if row is None:
                row = ServedName(tenant=deployment.tenant, name=name)
            if percent is not None and role == "shadow":
                row.shadow_percent = percent
            elif percent is not None:
                row.canary_percent = percent
            if policy is not None:
                row.policy = policy.model_dump()
            session.add(row)
            found = session.get(Deployment, deployment.id)
            assert found is not None
            found.served_name, found.role = name, role
            session.add(found)
            session.commit()
            if found.status == "ready":
                return self._take_place(session, found)
            return []

    def ready(self, deployment_id: str) -> list[Event]:
        """A deployment became ready: if it was asked to serve a name, it takes its place."""
        with session_scope(self.database) as session:
            deployment = session.get(Deployment, deployment_id)
            if deployment is None or deployment.served_name is None:
                return []
            return self._take_place(session, deployment)

    def _take_place(self, session: Session, deployment: Deployment) -> list[Event]:
        assert deployment.served_name is not None
        row = session.get(ServedName, (deployment.tenant, deployment.served_name))
        if row is None:
            row = ServedName(tenant=deployment.tenant, name=deployment.served_name)
        if deployment.id in (row.primary_id, row.canary_id, row.shadow_id):
            # In place already: a relaunched engine (a restarted hoster) has a new endpoint.
            return [self._save(session, row)]
        if deployment.role == "canary" and row.primary_id is not None:
            row.canary_id = deployment.id
        elif deployment.role == "shadow" and row.primary_id is not None:
            row.shadow_id = deployment.id
        else:
            row.previous_id, row.primary_id = row.primary_id, deployment.id
            if row.canary_id == deployment.id:
                row.canary_id = None
        return [self._save(session, row)]

    def promote(self, tenant: str, name: str, *, force: bool = False) -> list[Event]:
        """The canary (else the shadow) becomes the primary; the primary it replaces is the
        rollback target. A shadow only when its pairwise score says `better`, or `force`."""
        with session_scope(self.database) as session:
            row = self._row(session, tenant, name)
            candidate = row.canary_id or row.shadow_id
            if candidate is None:
                raise Conflict(f"served name {name!r} has no canary or shadow to promote")
            if row.canary_id == candidate:
                row.canary_id = None
            else:
                score = current_score(row)
                if not force and (score is None or score.verdict != "better"):
                    said = "no pairwise score yet" if score is None else score.describe()
                    raise Conflict(
                        f"served name {name!r}: its shadow is not scored better than its "
                        f'primary ({said}); promote with {{"force": true}} to promote it anyway',
                        shadow_score=score.model_dump() if score is not None else None,
                    )
                row.shadow_id = None
            row.previous_id, row.primary_id = row.primary_id, candidate
            self._set_role(session, row.primary_id, "primary")
            return [self._save(session, row)]

    def set_percent(
        self,
        tenant: str,
        name: str,
        percent: float | None,
        policy: CanaryPolicy | None,
        shadow_percent: float | None = None,
    ) -> list[Event]:
        with session_scope(self.database) as session:
            row = self._row(session, tenant, name)
            if percent is not None:
                row.canary_percent = percent
            if shadow_percent is not None:
                row.shadow_percent = shadow_percent
            if policy is not None:
                row.policy = policy.model_dump()
            return [self._save(session, row)]

    def rollback(
        self, tenant: str, name: str, *, reason: str, failed: CanaryFailed | None = None
    ) -> list[Event]:
        """Take the canary out; with none, put the previous primary back. A canary a gateway
        reported failing is taken out only if it is still the one it saw (`failed`)."""
        with session_scope(self.database) as session:
            row = self._row(session, tenant, name)
            if failed is not None and row.canary_id != failed.deployment_id:
                return []  # rolled back already (another gateway said so first), or replaced
            out: str | None
            restored: str | None
            if row.canary_id is not None:
                out, restored = row.canary_id, row.primary_id
                row.canary_id = None
            elif row.shadow_id is not None and failed is None:
                out, restored = row.shadow_id, row.primary_id
                row.shadow_id = None
            elif row.previous_id is not None and self._is_ready(session, row.previous_id):
                out, restored = row.primary_id, row.previous_id
                row.primary_id, row.previous_id = row.previous_id, None
                self._set_role(session, restored, "primary")
            else:
                raise Conflict(
                    f"served name {name!r} has no canary, no shadow and no ready previous version "
                    "to roll back to"
                )
            changed = self._save(session, row)
        rolled = DeploymentRolledBack(
            tenant=tenant,
            deployment_id=out or "",
            name=name,
            restored_deployment_id=restored,
            reason=reason,
            requests=failed.requests if failed else None,
            errors=failed.errors if failed else None,
            p95_ms=failed.p95_ms if failed else None,
        )
        return [changed, rolled]

    def score_shadow(self, event: ShadowScored) -> str | None:
        """Keep the latest pairwise score of the name's shadow when it is about the versions
        serving now (a late score of a shadow since replaced is dropped). Returns the shadow's
        deployment id when the score says `worse` and the policy takes such a shadow out."""
        with session_scope(self.database) as session:
            row = session.get(ServedName, (event.tenant, event.name))
            if row is None or row.shadow_id is None:
                return None
            versions = (_version(session, row.primary_id), _version(session, row.shadow_id))
            if versions != (event.primary_version, event.shadow_version):
                return None
            row.shadow_score = {
                "deployment_id": row.shadow_id,
                "primary_version": event.primary_version,
                "shadow_version": event.shadow_version,
                "scored_at": event.occurred_at.isoformat(),
                "score": event.score.model_dump(),
            }
            session.add(row)
            session.commit()
            policy = CanaryPolicy.model_validate(row.policy or {})
            worse = event.score.verdict == "worse" and policy.shadow_worse
            return row.shadow_id if worse else None

    def shadow_worse(self, tenant: str, name: str, deployment_id: str) -> list[Event]:
        """Take out a shadow its pairwise score found worse (once: if it is still the shadow)."""
        with session_scope(self.database) as session:
            row = self._row(session, tenant, name)
            score = current_score(row)
            if row.shadow_id != deployment_id or score is None:
                return []
            row.shadow_id = None
            changed = self._save(session, row)
            rolled = DeploymentRolledBack(
                tenant=tenant,
                deployment_id=deployment_id,
                name=name,
                restored_deployment_id=row.primary_id,
                reason="shadow_worse",
                shadow_score=score,
            )
        return [changed, rolled]

    def stopped(self, deployment_id: str) -> list[Event]:
        """An undeployed deployment leaves every place it held."""
        with session_scope(self.database) as session:
            deployment = session.get(Deployment, deployment_id)
            if deployment is None or deployment.served_name is None:
                return []
            row = session.get(ServedName, (deployment.tenant, deployment.served_name))
            if row is None:
                return []
            held = deployment_id in (row.primary_id, row.canary_id, row.shadow_id, row.previous_id)
            if not held:
                return []
            if row.primary_id == deployment_id:
                row.primary_id = None
            if row.canary_id == deployment_id:
                row.canary_id = None
            if row.shadow_id == deployment_id:
                row.shadow_id = None
            if row.previous_id == deployment_id:
                row.previous_id = None
            return [self._save(session, row)]

    # -- rows and events ---------------------------------------------------------------------------
    @staticmethod
    def _row(session: Session, tenant: str, name: str) -> ServedName:
        row = session.get(ServedName, (tenant, name))
        if row is None:
            raise NotFound(f"served name {name!r} not found")
        return row

    @staticmethod
    def _is_ready(session: Session, deployment_id: str) -> bool:
        found = session.get(Deployment, deployment_id)
        return found is not None and found.status == "ready"

    @staticmethod
    def _set_role(session: Session, deployment_id: str | None, role: Role) -> None:
        found = session.get(Deployment, deployment_id) if deployment_id else None
        if found is not None:
            found.role = role
            session.add(found)

    def _save(self, session: Session, row: ServedName) -> ServedNameChanged:
        row.revision += 1
        row.updated_at = utcnow()
        session.add(row)
        session.commit()
        session.refresh(row)
        return changed_event(session, row)


def current_score(row: ServedName) -> PairwiseScore | None:
    """The latest pairwise score of the name's shadow, if it is about the shadow there now."""
    kept = row.shadow_score
    if not kept or row.shadow_id is None or kept.get("deployment_id") != row.shadow_id:
        return None
    return PairwiseScore.model_validate(kept["score"])


def _version(session: Session, deployment_id: str | None) -> str | None:
    """How the evaluator names a deployment's version: its registry id, else (a catalogue
    base) the name its engine answers to."""
    found = session.get(Deployment, deployment_id) if deployment_id else None
    return (found.version_id or found.served_model_name) if found is not None else None


def changed_event(session: Session, row: ServedName) -> ServedNameChanged:
    def target(deployment_id: str | None) -> ServedTarget | None:
        found = session.get(Deployment, deployment_id) if deployment_id else None
        # A cold one keeps its place (and its last address): the gateway wakes it on a call.
        if found is None or found.status not in ("ready", "cold") or not found.endpoint_url:
            return None
        return ServedTarget(
            deployment_id=found.id,
            endpoint_url=found.endpoint_url,
            version_id=found.version_id,
            model=found.served_model_name,
        )

    canary, shadow = target(row.canary_id), target(row.shadow_id)
    return ServedNameChanged(
        # One id per revision: a republished state is stored once.
        event_id=f"served-{row.tenant}-{row.name}-{row.revision}"[:128],
        tenant=row.tenant,
        name=row.name,
        revision=row.revision,
        primary=target(row.primary_id),
        canary=canary,
        canary_percent=row.canary_percent if canary is not None else 0.0,
        rollback=CanaryPolicy.model_validate(row.policy or {}),
        shadow=shadow,
        shadow_percent=row.shadow_percent if shadow is not None else 0.0,
    )
