"""The hoster's internal eval-engine API (ask for a job's engine, load a checkpoint into it, give
it back) and generation on that engine's OpenAI endpoint with the official `openai` SDK.

The engine is called directly, never through the gateway, so eval traffic is never captured.
What a retry can fix (the hoster away or starting, an engine still loading, a 5xx, a timeout) is
EngineNotReady: the handler raises it and the bus delivers the event again with backoff. The
hoster refusing the request itself (another 4xx) is HosterRefused: no retry will change it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from services.evaluator.graders import Answer
from services.evaluator.subset import EvalItem

# The engine needs no key; the SDK wants one.
ENGINE_API_KEY = "tuneloop-eval"


class EngineNotReady(RuntimeError):
    """The hoster or its engine cannot answer yet; try again later."""


class HosterRefused(RuntimeError):
    """The hoster answered 4xx to a request it will never accept as it is."""


@dataclass(frozen=True)
class Engine:
    engine_id: str
    base_url: str
    base_model_name: str


@dataclass(frozen=True)
class Serving:
    """The deployment answering a served name (its primary) and the registry version it serves
    (`version_id` None: a catalogue base is deployed under the name)."""

    deployment_id: str
    version_id: str | None
    version: int | None
    model: str
    base_model: str | None
    checkpoint_uri: str | None


@dataclass(frozen=True)
class Output:
    """An item's answer: what the model said, how long it took, or the engine's refusal."""

    answer: Answer
    latency_ms: float
    error: str | None = None


class HosterClient:
    """`POST /internal/engines`, `POST /internal/engines/{id}/checkpoints`, `DELETE` one, and
    `GET /internal/tenants/{tenant}/served_names/{name}` (what serves a name)."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 600.0) -> None:
        # Loading a checkpoint may pull, verify and merge it before answering: a long timeout.
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout_s, connect=5.0),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = await self._client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise EngineNotReady(f"hoster {method} {path}: {type(exc).__name__}: {exc}") from None
        if response.status_code in (404, 409, 425, 429) or response.status_code >= 500:
            # 404/409: the engine is gone or busy (the hoster restarted, a load in progress).
            raise EngineNotReady(f"hoster {method} {path}: {response.status_code} {response.text}")
        if response.status_code >= 400:
            raise HosterRefused(f"hoster {method} {path}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    async def engine(self, *, tenant: str, job_id: str, base_model: str) -> Engine:
        """The job's engine (the hoster starts it once and returns the same one after)."""
        body = {"tenant": tenant, "job_id": job_id, "base_model": base_model}
        data = await self._call("POST", "/internal/engines", body)
        try:
            return Engine(
                str(data["engine_id"]), str(data["base_url"]), str(data["base_model_name"])
            )
        except (KeyError, TypeError):
            raise EngineNotReady(
                f"hoster POST /internal/engines: unexpected answer {data!r}"
            ) from None

    async def load_checkpoint(
        self, engine_id: str, *, uri: str, step: int, version_id: str | None = None
    ) -> str:
        """The model name to send for this checkpoint, once the engine answers with it.
        `version_id`: a registered version's checkpoint (loaded under its id, not a step)."""
        body: dict[str, Any] = {"uri": uri, "step": step}
        if version_id is not None:
            body["version_id"] = version_id
        data = await self._call("POST", f"/internal/engines/{engine_id}/checkpoints", body)
        if not isinstance(data, dict) or not isinstance(data.get("model"), str):
            raise EngineNotReady(f"hoster: load of step {step} answered {data!r}")
        return str(data["model"])

    async def serving(self, tenant: str, name: str) -> Serving | None:
        """What serves the tenant's served name now (its primary); None when nothing does."""
        data = await self._call("GET", f"/internal/tenants/{tenant}/served_names/{name}")
        try:
            primary = data["primary"]
            if primary is None:
                return None
            return Serving(
                deployment_id=str(primary["deployment_id"]),
                version_id=primary["version_id"],
                version=primary["version"],
                model=str(primary["model"]),
                base_model=primary["base_model"],
                checkpoint_uri=primary["checkpoint_uri"],
            )
        except (KeyError, TypeError):
            raise EngineNotReady(
                f"hoster GET served name {name!r}: unexpected answer {data!r}"
            ) from None

    async def delete(self, engine_id: str) -> None:
        try:
            await self._call("DELETE", f"/internal/engines/{engine_id}")
        except EngineNotReady as exc:
            if "404" not in str(exc):  # already gone is what we wanted
                raise


def _answer(message: Any) -> Answer:
    calls = tuple(
        (call.function.name, call.function.arguments or "{}")
        for call in (message.tool_calls or [])
        if getattr(call, "function", None) is not None
    )
    return Answer(text=message.content or "", tool_calls=calls)


async def _generate_one(client: openai.AsyncOpenAI, model: str, item: EvalItem) -> Output:
    request: dict[str, Any] = {
        "model": model,
        "messages": item.messages,
        "temperature": 0,
        "max_tokens": item.max_tokens,
    }
    if item.tools:
        request["tools"] = item.tools
    started = time.perf_counter()
    try:
        completion = await client.chat.completions.create(**request)
    except openai.BadRequestError as exc:
        # This prompt cannot be answered (too long for the engine, say): the item scores 0.
        latency = (time.perf_counter() - started) * 1000
        return Output(Answer(), latency, error=f"engine refused the prompt: {exc.message}")
    except (openai.APIConnectionError, openai.APIStatusError) as exc:
        raise EngineNotReady(f"engine at {client.base_url}: {type(exc).__name__}: {exc}") from None
    latency = (time.perf_counter() - started) * 1000
    if not completion.choices:
        return Output(Answer(), latency, error="engine answered no choice")
    return Output(_answer(completion.choices[0].message), latency)


async def generate(
    base_url: str, model: str, items: list[EvalItem], *, concurrency: int, timeout_s: float
) -> list[Output]:
    """Every item's answer at temperature 0, `concurrency` requests in flight, in item order."""
    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key=ENGINE_API_KEY, timeout=timeout_s, max_retries=2
    ) as client:

        async def one(item: EvalItem) -> Output:
            async with gate:
                return await _generate_one(client, model, item)

        return list(await asyncio.gather(*(one(item) for item in items)))
