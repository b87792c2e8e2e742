"""What the hoster serves, told to the bus again.

The gateway builds its routing table by replaying the deployments stream from its start (an
ordered consumer, `shared.bus.watch`), and the stream keeps events for its retention only (30
days by default). A deployment that became ready, or a served name that last changed, longer
ago than that would be unknown to a gateway started afterwards: its calls would go on to the
upstreams file. So every `announce_interval_s` the hoster publishes each live deployment's
`deployment.ready` again (`cold` for one unloaded for idling, which the gateway wakes on its next
call) and each served name's current state; the gateway applies them as it applies the first
ones (a served name's revision decides, a stopped deployment stays stopped).
"""

from __future__ import annotations

from sqlalchemy.engine import Engine as Database
from sqlmodel import col, select

from services.hoster.models import Deployment, ServedName
from services.hoster.served_names import changed_event
from shared.db import session_scope
from shared.events import DeploymentReady, Event


def live_state(database: Database) -> list[Event]:
    """Every ready or cold deployment's announcement, then every served name's state."""
    with session_scope(database) as session:
        found = session.exec(
            select(Deployment)
            .where(col(Deployment.status).in_(("ready", "cold")))
            .order_by(col(Deployment.created_at), col(Deployment.id))
        )
        events: list[Event] = [
            DeploymentReady(
                tenant=row.tenant,
                deployment_id=row.id,
                served_model_name=row.served_model_name,
                endpoint_url=row.endpoint_url,
                version_id=row.version_id,
                cold=row.status == "cold",
            )
            for row in found.all()
            if row.endpoint_url
        ]
        names = session.exec(
            select(ServedName).order_by(col(ServedName.tenant), col(ServedName.name))
        )
        events += [changed_event(session, row) for row in names.all()]
    return events
