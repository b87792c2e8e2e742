"""Shadow scoring: a served name's shadow judged against its primary on the calls the gateway
mirrored to both (the pairs ingest keeps, tagged `shadow_pair:<id>`), and a verdict the hoster's
promote and automatic rollback read (`eval.shadow_scored`).

Every `SHADOW_POLL_S` the scorer reads, for each tenant with a shadow somewhere, the pairs
captured since its cursor (ingest's `/internal/tenants/{tenant}/shadow_pairs`), asks the judge
which answer is better (pairwise.py: both orders, a disagreement is a tie), stores one verdict
per pair, and publishes the counts of each (served name, primary version, shadow version) the
page touched. The shadow's win rate is (wins + ties/2) / decided pairs, with a 95 % Wilson
interval; `better` when its lower bound is above 0.5, `worse` when its upper bound is below,
else (or under `SHADOW_MIN_PAIRS` decided pairs) `undecided`. A pair the judge could not answer
is a judge_error and a pair whose shadow failed a shadow failure: both counted, neither decided.
Without a judge nothing is scored.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import httpx
from sqlalchemy.engine import Engine

from services.evaluator import shadow_store as store
from services.evaluator.judge import JudgeClient
from services.evaluator.judge_records import rubric_id, rubric_of
from services.evaluator.models import ShadowTargetRow, ShadowVerdictRow
from services.evaluator.pairwise import compare
from services.evaluator.rubric import Rubric, conversation_text
from services.evaluator.shadow_store import Tally
from shared.events import Event, PairwiseScore, ServedNameChanged, ShadowScored

log = logging.getLogger("tuneloop.evaluator.shadow")
Verdict = Literal["better", "worse", "undecided"]
Z95 = 1.959963984540054

# When the shadow's job has no rubric (it was not judged, or is no job of ours): what any
# answer to a user is judged by.
DEFAULT_RUBRIC = Rubric(
    criteria=[
        "Does what the conversation asks: answers the question or carries out the task",
        "Is correct: no wrong facts, no made-up details",
        "Follows the instructions and the format the conversation sets",
        "Is clear and no longer than it needs to be",
    ],
    low="ignores or misreads the request, is wrong, or breaks the format asked for",
    high="does exactly what was asked, correctly, in the format asked for",
)
DEFAULT_RUBRIC_ID = "shadow-default@1"


# --- the numbers ---------------------------------------------------------------------------------


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion (successes may be fractional: a tie is half)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    denominator = 1 + z * z / n
    return max(0.0, (centre - spread) / denominator), min(1.0, (centre + spread) / denominator)


def pairwise_score(tally: Tally, min_pairs: int) -> PairwiseScore:
    """A tally's win rate, interval and verdict."""
    decided = tally.decided
    rate = low = high = None
    verdict: Verdict = "undecided"
    if decided:
        wins = tally.shadow_wins + tally.ties / 2
        rate = wins / decided
        low, high = wilson(wins, decided)
        if decided >= min_pairs and low > 0.5:
            verdict = "better"
        elif decided >= min_pairs and high < 0.5:
            verdict = "worse"
    return PairwiseScore(
        pairs=tally.pairs,
        shadow_wins=tally.shadow_wins,
        primary_wins=tally.primary_wins,
        ties=tally.ties,
        judge_errors=tally.judge_errors,
        shadow_failures=tally.shadow_failures,
        decided=decided,
        win_rate=rate,
        low=low,
        high=high,
        min_pairs=min_pairs,
        verdict=verdict,
    )


def scored(tenant: str, tally: Tally, min_pairs: int) -> ShadowScored:
    score = pairwise_score(tally, min_pairs)
    key = [tenant, tally.name, tally.primary_version, tally.shadow_version, score.model_dump()]
    # The same numbers are one event: a page read again after a restart publishes no new fact.
    event_id = "shadow-" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:40]
    return ShadowScored(
        event_id=event_id,
        tenant=tenant,
        name=tally.name,
        primary_version=tally.primary_version,
        shadow_version=tally.shadow_version,
        score=score,
    )


# --- ingest's pairs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairsReader:
    """Ingest's shadow pairs of a tenant, read with the service token."""

    http: httpx.AsyncClient
    ingest_url: str
    service_token: str

    async def page(self, tenant: str, after: str | None, limit: int) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit} | ({"after": after} if after else {})
        response = await self.http.get(
            f"{self.ingest_url}/internal/tenants/{tenant}/shadow_pairs",
            params=params,
            headers={"Authorization": f"Bearer {self.service_token}"},
        )
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body


def _version(side: dict[str, Any]) -> str:
    """How a pair's side names its version: its tag, else the model it answered as (a base)."""
    return str(side.get("model_version") or side.get("model") or "unknown")


# --- the scorer ----------------------------------------------------------------------------------

Publish = Callable[[Event], Awaitable[None]]


@dataclass
class ShadowScorer:
    db: Engine
    client: JudgeClient | None
    model: str | None
    reader: PairsReader | None
    publish: Publish
    min_pairs: int = 20
    poll_s: float = 30.0
    page_size: int = 50
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    @property
    def configured(self) -> bool:
        return self.client is not None and self.model is not None and self.reader is not None

    async def served_name_changed(self, event: ServedNameChanged) -> None:
        await asyncio.to_thread(store.save_target, self.db, event)

    async def start(self) -> None:
        if not self.configured:
            log.info("no judge configured (TUNELOOP_EVALUATOR_JUDGE_*): shadows are not scored")
            return
        self._task = asyncio.create_task(self._run(), name="shadow scorer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.reader is not None:
            await self.reader.http.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:  # ingest or the database away: tried again next round
                log.exception("scoring shadow pairs failed")
            await asyncio.sleep(self.poll_s)

    async def poll(self) -> list[ShadowScored]:
        """Every tenant with a shadow: its new pairs judged, the scores they moved published."""
        published: list[ShadowScored] = []
        for tenant in await asyncio.to_thread(store.shadow_tenants, self.db):
            published += await self.score_tenant(tenant)
        return published

    async def score_tenant(self, tenant: str) -> list[ShadowScored]:
        """Read the tenant's pairs page by page until none are left; one event per score a
        page moved, after that page's verdicts are stored (and before its cursor is)."""
        published: list[ShadowScored] = []
        if not self.configured:
            return published
        assert self.reader is not None
        cursor = await asyncio.to_thread(store.get_cursor, self.db, tenant)
        while True:
            page = await self.reader.page(tenant, cursor, self.page_size)
            pairs: list[dict[str, Any]] = page["data"]
            await self._judge_page(tenant, pairs)
            touched = sorted({(str(p["served_name"] or ""), _version(p["primary"]),
                               _version(p["shadow"])) for p in pairs})  # fmt: skip
            for name, primary, shadow in touched:
                tally = await asyncio.to_thread(store.tally, self.db, tenant, name, primary, shadow)
                event = scored(tenant, tally, self.min_pairs)
                await self.publish(event)
                published.append(event)
            if page["next_cursor"] and page["next_cursor"] != cursor:
                cursor = page["next_cursor"]
                await asyncio.to_thread(store.put_cursor, self.db, tenant, cursor)
            if not page["has_more"]:
                return published

    async def _judge_page(self, tenant: str, pairs: list[dict[str, Any]]) -> None:
        ids = [str(p["pair_id"]) for p in pairs]
        seen = await asyncio.to_thread(store.judged, self.db, tenant, ids)
        targets = await asyncio.to_thread(store.targets_of, self.db, tenant)
        fresh = [p for p in pairs if p["pair_id"] not in seen]
        rows = await asyncio.gather(*(self._verdict(tenant, p, targets) for p in fresh))
        await asyncio.to_thread(store.add_verdicts, self.db, list(rows))

    async def _rubric(self, tenant: str, shadow_model: str | None) -> tuple[str, str]:
        """(rubric text, its id): the shadow's job's rubric, else the default one."""
        found = (
            await asyncio.to_thread(store.job_rubric, self.db, tenant, shadow_model)
            if shadow_model
            else None
        )
        if found is None:
            return DEFAULT_RUBRIC.text(), DEFAULT_RUBRIC_ID
        return rubric_of(found).text(), rubric_id(found.dataset_version, found.version)

    async def _verdict(
        self, tenant: str, pair: dict[str, Any], targets: dict[str, ShadowTargetRow]
    ) -> ShadowVerdictRow:
        assert self.client is not None
        assert self.model is not None
        primary, shadow = pair["primary"], pair["shadow"]
        name = str(pair["served_name"] or "")
        known = targets.get(name)
        shadow_model = (
            known.shadow_model
            if known is not None and known.shadow_version == shadow.get("model_version")
            else shadow.get("model")
        )
        text, rubric = await self._rubric(tenant, shadow_model)
        row = ShadowVerdictRow(
            tenant=tenant,
            pair_id=str(pair["pair_id"]),
            name=name,
            primary_version=_version(primary),
            shadow_version=_version(shadow),
            outcome=store.SHADOW_FAILED,
            rubric=rubric,
            judge_model=self.model,
            captured_at=datetime.fromisoformat(pair["captured_at"]),
        )
        if shadow["status"] != "ok":
            row.error = str(shadow.get("error") or "the shadow failed")[:2000]
            return row
        if primary["status"] != "ok":
            row.outcome, row.error = store.PRIMARY_FAILED, str(primary.get("error") or "")[:2000]
            return row
        comparison = await compare(
            self.client,
            model=self.model,
            rubric_text=text,
            conversation=conversation_text(pair["conversation"]),
            first=shadow["answer"],
            second=primary["answer"],
            tenant=tenant,
            rubric=rubric,
        )
        outcomes = {"first": store.SHADOW, "second": store.PRIMARY, "tie": store.TIE}
        row.outcome = outcomes.get(comparison.winner, store.JUDGE_ERROR)
        row.verdicts = json.dumps(list(comparison.verdicts))
        row.error = comparison.error[:2000] if comparison.error else None
        return row
