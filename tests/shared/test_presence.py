"""Presence bookkeeping, with FastStream's in-memory broker (one handler, no flow claimed)."""

from datetime import UTC, datetime

from faststream.nats import NatsBroker, TestNatsBroker

from shared import bus
from shared.events import ServiceHeartbeat
from shared.presence import Presence


def _presence(service: str, interval_s: float = 60.0) -> Presence:
    return Presence(
        service=service,
        instance_id=f"{service}-1",
        address=f"http://{service}",
        interval_s=interval_s,
    )


async def test_peers_are_recorded_and_self_is_ignored() -> None:
    broker = NatsBroker()
    me = _presence("ingest")
    bus.subscribe(broker, ServiceHeartbeat, service="ingest")(me.record)
    async with TestNatsBroker(broker) as test_broker:
        await bus.publish(test_broker, _presence("scheduler").heartbeat())
        await bus.publish(test_broker, me.heartbeat())
    peers = me.peers()
    assert [peer["service"] for peer in peers] == ["scheduler"]
    assert peers[0]["address"] == "http://scheduler"


async def test_silent_peers_age_out_after_three_intervals() -> None:
    now = [100.0]
    me = Presence(
        service="ingest",
        instance_id="ingest-1",
        address="http://ingest",
        interval_s=2.0,
        clock=lambda: now[0],
    )
    beat = ServiceHeartbeat(
        service="hoster",
        instance_id="hoster-1",
        address="http://hoster",
        started_at=datetime.now(UTC),
    )
    await me.record(beat)
    now[0] += 5.9
    assert [peer["instance_id"] for peer in me.peers()] == ["hoster-1"]
    assert me.peers()[0]["seen_s_ago"] == 5.9
    now[0] += 0.2
    assert me.peers() == []
