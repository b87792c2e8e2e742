"""Waking a cold deployment: the gateway's side of cold and hot (the hoster's is
services/hoster/upkeep.py).

A deployment no call reached for a while is unloaded (`deployment.cold`). The next call naming
it must wait, never fail: the gateway asks the hoster to load it again
(`POST /internal/deployments/{id}/wake`, the service token), which answers once it is warmed up
and ready, with its address (it may have moved); then the call goes on there. Calls arriving
meanwhile wait on the same wake.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import httpx

log = logging.getLogger("tuneloop.ingest.wake")


class WakeFailed(Exception):
    """The deployment could not be woken (the hoster away, its engine failing to load)."""


@dataclass
class Waker:
    client: httpx.AsyncClient
    hoster_url: str
    service_token: str
    # Until the hoster answers: an engine's start plus a model's load, as the hoster waits.
    timeout_s: float
    _waking: dict[str, asyncio.Task[str]] = field(default_factory=dict)

    async def wake(self, deployment_id: str) -> str:
        """The deployment's OpenAI base URL once it is ready again; one wake per deployment
        however many calls wait for it."""
        task = self._waking.get(deployment_id)
        if task is None:
            task = asyncio.create_task(self._wake(deployment_id))
            self._waking[deployment_id] = task
            task.add_done_callback(lambda _: self._waking.pop(deployment_id, None))
        return await asyncio.shield(task)

    async def _wake(self, deployment_id: str) -> str:
        log.info("waking cold deployment %s", deployment_id)
        try:
            answer = await self.client.post(
                f"{self.hoster_url}/internal/deployments/{deployment_id}/wake",
                headers={"Authorization": f"Bearer {self.service_token}"},
                timeout=self.timeout_s,
            )
        except httpx.HTTPError as exc:
            raise WakeFailed(f"the hoster could not be reached ({exc})") from None
        if answer.status_code != 200:
            detail = answer.json().get("detail") if answer.content else answer.reason_phrase
            raise WakeFailed(f"the hoster could not wake it ({answer.status_code}: {detail})")
        endpoint = answer.json().get("endpoint_url")
        if not endpoint:
            raise WakeFailed("the hoster woke it without an address")
        return str(endpoint)
