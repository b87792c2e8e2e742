"""The engines deployments run on, held in this process's memory: which deployments each one
serves under which name, and which engine a slot has now. A slot is the one engine a tenant's
LoRA versions of one base share (`("shared", tenant, base)`: adapters loaded onto one running
base, so a second version needs no base reload) or a deployment's own engine (`("own", id)`: a
full fine-tune, a catalogue base). A lock per slot orders the starts, loads, unloads and stops
made on it; the pool's own lock only guards its maps.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from services.hoster.engines import Engine

SlotKey = tuple[str, ...]


def shared_slot(tenant: str, base_model: str) -> SlotKey:
    return ("shared", tenant, base_model)


def own_slot(deployment_id: str) -> SlotKey:
    return ("own", deployment_id)


@dataclass
class Hosted:
    """A running engine and the deployments it serves (deployment id -> the name loaded)."""

    engine_id: str
    engine: Engine
    slot: SlotKey
    names: dict[str, str] = field(default_factory=dict)

    @property
    def shared(self) -> bool:
        return self.slot[0] == "shared"


class EnginePool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: dict[str, Hosted] = {}  # engine id ->
        self._slots: dict[SlotKey, str] = {}  # slot -> the engine id it has now
        self._of: dict[str, str] = {}  # deployment id -> engine id
        self._slot_locks: dict[SlotKey, threading.Lock] = {}

    def slot_lock(self, slot: SlotKey) -> threading.Lock:
        with self._lock:
            return self._slot_locks.setdefault(slot, threading.Lock())

    def current(self, slot: SlotKey) -> Hosted | None:
        """The slot's engine (alive or not: a dead one is the watchdog's to handle)."""
        with self._lock:
            engine_id = self._slots.get(slot)
            return self._engines.get(engine_id) if engine_id else None

    def add(self, hosted: Hosted) -> None:
        """hosted becomes its slot's engine; one it replaces stays listed until removed."""
        with self._lock:
            self._engines[hosted.engine_id] = hosted
            self._slots[hosted.slot] = hosted.engine_id

    def bind(self, hosted: Hosted, deployment_id: str, name: str) -> None:
        with self._lock:
            before = self._engines.get(self._of.get(deployment_id, ""))
            if before is not None and before is not hosted:
                before.names.pop(deployment_id, None)
            hosted.names[deployment_id] = name
            self._of[deployment_id] = hosted.engine_id

    def unbind(self, deployment_id: str) -> tuple[Hosted, str] | None:
        """The engine the deployment was on and the name it had there, no longer bound."""
        with self._lock:
            hosted = self._engines.get(self._of.pop(deployment_id, ""))
            if hosted is None or deployment_id not in hosted.names:
                return None
            return hosted, hosted.names.pop(deployment_id)

    def of(self, deployment_id: str) -> Hosted | None:
        with self._lock:
            return self._engines.get(self._of.get(deployment_id, ""))

    def remove(self, engine_id: str) -> dict[str, str]:
        """Forget the engine; the deployments it served (id -> name)."""
        with self._lock:
            hosted = self._engines.pop(engine_id, None)
            if hosted is None:
                return {}
            if self._slots.get(hosted.slot) == engine_id:
                del self._slots[hosted.slot]
            for deployment_id in hosted.names:
                if self._of.get(deployment_id) == engine_id:
                    del self._of[deployment_id]
            return dict(hosted.names)

    def engines(self) -> list[Hosted]:
        with self._lock:
            return list(self._engines.values())

    def clear(self) -> None:
        with self._lock:
            self._engines.clear()
            self._slots.clear()
            self._of.clear()
