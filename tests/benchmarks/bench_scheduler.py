"""Scheduler benchmark (`make bench-scheduler`): placement latency and fairness across tenants,
with the real `Attempts` over a migrated SQLite file and fake providers.

    .venv/bin/python -m tests.benchmarks.bench_scheduler [--scenarios steady,contended,late]
        [--duration-s 1-4] [--poll-s 0.25] [--seed 1] [--no-baseline]

- Ladder: three rungs of fake providers, 4 attempts at once each (8, 4 and 1 devices of 80, 80
  and 24 GiB). `submit` notes the time and returns a handle; `poll` says running until the
  attempt's simulated duration (--duration-s, uniform) has passed, then the job succeeds (as
  after its trainer's last report) and the attempt exits, freeing its place.
- Jobs: 10 tenants x 20 = 200, each with the recipe's plan for a synthetic 400-example dataset
  (`planning.plan_job` on the local device's throughput row, as `Scheduler.start` plans it;
  every fourth job a full fine-tune). Each arrival writes the planned job `queued` and calls
  `Attempts.assign()`, as `Scheduler.start` does; a loop calls `Attempts.check()` every
  --poll-s (the service's poll interval, shortened with the runs). Default settings otherwise
  (`tenant_max_running` 2).
- Scenarios (skewed arrival): `steady`, tenant 00 queues all its jobs at 0 s and the others'
  arrive at random over 60 s (about 70 % of what the ladder runs: most jobs find a free place);
  `contended`, the same over 15 s (2.5x what the ladder runs: every tenant waits); `late`,
  tenants 00-08 queue all 180 jobs at 0 s and tenant 09 its 20 at 5 s.
- Decision latency: job written `queued` -> the provider's submit called, for the jobs the
  placement pass of their own arrival started (capacity was free for them). Goal: p99 <= 1 s.
  Beside it, how long each placement pass took (`Attempts._placements`: the queue read and
  placement.place) and the most jobs queued when one began.
- Fairness: each tenant's mean wait (written `queued` -> submit); goal: the largest no more than
  2x the median tenant's, judged where tenants compete for places (contended, late). Under
  steady load the median wait is near zero and tenant 00's wait is its own 20 jobs behind its
  cap: shown, not judged.
- Baseline (unless --no-baseline): contended and late again, same seed, with the rule before
  fairness (priority, then the oldest job, the tenant cap), to show what fairness changes.
Not collected by pytest; the numbers go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

from pydantic import SecretStr
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import Engine
from sqlmodel import select

from services.scheduler import jobs, placement, planning
from services.scheduler.attempts import Attempts
from services.scheduler.config import SchedulerSettings
from services.scheduler.ladder import Ladder, ProviderPool, ProviderSpec
from services.scheduler.models import AttemptRow, JobRow
from services.scheduler.placement import LiveAttempt, Placement, QueuedJob
from services.scheduler.protocol import JobCreate
from services.scheduler.providers import Handle, LaunchSpec, Status
from services.scheduler.throughput import THROUGHPUT
from shared.catalogue import SMOLLM2_135M_INSTRUCT
from shared.chat import Sample
from shared.db import make_engine, migrate, session_scope, utcnow
from shared.events import Event, JobAssigned

GOAL_P99_S = 1.0
GOAL_FAIRNESS = 2.0
TENANTS, JOBS_PER_TENANT = 10, 20
console = Console(width=None if sys.stdout.isatty() else 170)
LADDER = Ladder(
    providers=[
        ProviderSpec(name="h100-pool", kind="local", priority=0, capacity=4, device="nvidia-h100",
                     device_count=8, device_memory_gib=80, cost_per_hour=3.9),
        ProviderSpec(name="a100-pool", kind="local", priority=1, capacity=4,
                     device="nvidia-a100-80gb", device_count=4, device_memory_gib=80,
                     cost_per_hour=2.1),
        ProviderSpec(name="l4-spot", kind="local", priority=2, capacity=4, device="nvidia-l4",
                     device_count=1, device_memory_gib=24, cost_per_hour=0.4),
    ]
)  # fmt: skip


@dataclass(frozen=True)
class Scenario:
    name: str
    first: int  # tenants that queue all their jobs at 0 s
    window_s: float  # the others' jobs arrive at random in it...
    late_s: float | None = None  # ...or all at this time
    judge_fairness: bool = True


SCENARIOS = {
    "steady": Scenario("steady", first=1, window_s=60.0, judge_fairness=False),
    "contended": Scenario("contended", first=1, window_s=15.0),
    "late": Scenario("late", first=9, window_s=0.0, late_s=5.0),
}


@dataclass
class Clock:
    """When each job was written queued and first submitted (time.monotonic())."""

    created: dict[str, float] = field(default_factory=dict)
    submitted: dict[str, float] = field(default_factory=dict)
    placed_on_arrival: set[str] = field(default_factory=set)
    submits: Counter[str] = field(default_factory=Counter)
    # Each placement pass (`Attempts._placements`: the queue read and place()): its seconds and
    # the jobs queued and not yet submitted when it began.
    passes: list[tuple[float, int]] = field(default_factory=list)


class FakeProvider:
    """The Provider protocol with no trainer: an attempt runs for its job's simulated duration."""

    def __init__(self, name: str, engine: Engine, clock: Clock, durations: dict[str, float]):
        self.name, self.engine, self.clock, self.durations = name, engine, clock, durations
        self._ends: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def submit(self, spec: LaunchSpec) -> Handle:
        now = time.monotonic()
        with self._lock:
            self.clock.submitted.setdefault(spec.job_id, now)
            self.clock.submits[spec.job_id] += 1
            self._ends[spec.attempt_id] = (spec.job_id, now + self.durations[spec.job_id])
        return Handle(self.name, spec.attempt_id, str(spec.work_dir))

    def poll(self, handle: Handle) -> Status:
        job_id, end = self._ends[handle.ref]
        if time.monotonic() < end:
            return Status("running")
        _succeed(self.engine, job_id)  # its trainer finished: the job is done, the place free
        return Status("exited", 0)

    def cancel(self, handle: Handle, *, grace_s: float) -> Status:
        return Status("exited", 0)

    def logs(self, handle: Handle, *, tail_bytes: int = 20_000) -> str:
        return ""


def _succeed(engine: Engine, job_id: str) -> None:
    with session_scope(engine) as session:
        row = session.get(JobRow, job_id)
        if row is not None and row.status != "succeeded":
            row.status, row.finished_at = "succeeded", utcnow()
            session.add(row)
            session.commit()


def plan_document() -> dict[str, Any]:
    """The recipe's plan for a synthetic 400-example JSON-answer dataset, as planning writes it."""
    samples = [
        Sample.model_validate({
            "tenant": "bench", "source": "upload", "created_at": datetime(2026, 12, 5, tzinfo=UTC),
            "messages": [
                {"role": "user", "content": f"Ticket {n}: the printer on floor {n % 7} jams"},
                {"role": "assistant", "content": json.dumps({"team": f"t{n % 5}"})},
            ],
        })
        for n in range(400)
    ]  # fmt: skip
    tokens = {"prompt": {"p50": 120, "p90": 160, "p99": 190, "max": 200},
              "completion": {"p50": 12, "p90": 14, "p99": 16, "max": 16}}  # fmt: skip
    meta = {"stats": {"train": {"count": 400, "tokens": tokens}, "eval": {"count": 40}}}
    job = JobRow(id="plan", tenant="bench", status="validating_files",
                 model=SMOLLM2_135M_INSTRUCT.id, training_file="f", request=b"{}")  # fmt: skip
    device = THROUGHPUT[SchedulerSettings().local_device]
    return planning.plan_job(job, meta, samples, 40, device)[1]


@dataclass(frozen=True)
class Arrival:
    job_id: str
    tenant: str
    at_s: float  # after the start
    full: bool  # a full fine-tune rather than LoRA


def workload(scenario: Scenario, rng: random.Random) -> list[Arrival]:
    """The scenario's first tenants queue all their jobs at 0 s, the others' arrive at random in
    its window, or all at once at its late time."""

    def at(tenant: int) -> float:
        if tenant < scenario.first:
            return 0.0
        return scenario.late_s if scenario.late_s is not None else rng.uniform(0, scenario.window_s)

    timed = sorted(
        (at(t), f"ftjob-t{t:02}-{n:03}", f"tenant-{t:02}")
        for t in range(TENANTS)
        for n in range(JOBS_PER_TENANT)
    )
    return [Arrival(j, tenant, at, i % 4 == 3) for i, (at, j, tenant) in enumerate(timed)]


def fifo_place(
    queued: Iterable[QueuedJob],
    live: Iterable[LiveAttempt],
    rungs: Sequence[ProviderSpec],
    *,
    settings: SchedulerSettings,
    now: datetime,
) -> list[Placement]:
    """The baseline: the rule before fairness (priority, the oldest job first, the tenant cap)."""
    live = list(live)
    per_rung = Counter(a.provider for a in live)
    per_tenant = Counter(a.tenant for a in live)
    busy = {a.job_id for a in live}
    order = sorted(queued, key=lambda j: (placement.PRIORITY_ORDER.get(j.priority, 1),
                                          j.created_at, j.id))  # fmt: skip
    placements = []
    for job in order:
        if job.id in busy or per_tenant[job.tenant] >= settings.tenant_max_running:
            continue
        if job.priority == "batch" and not settings.in_batch_window(now.hour):
            continue
        room = [r for r in sorted(rungs, key=lambda r: r.priority) if per_rung[r.name] < r.capacity]
        if not room:
            break
        chosen = next(((r, n) for r in room if (n := placement.device_count(job.size, r))), None)
        if chosen is not None:
            placements.append(Placement(job.id, *chosen))
            per_rung[chosen[0].name] += 1
            per_tenant[job.tenant] += 1
    return placements


@dataclass
class Outcome:
    scenario: Scenario
    rule: str
    clock: Clock
    arrivals: list[Arrival]
    wall_s: float
    assigned: list[JobAssigned]
    recorded: list[AttemptRow]

    def latencies(self) -> list[float]:
        c = self.clock
        return sorted(c.submitted[j] - c.created[j] for j in c.placed_on_arrival)

    def waits(self) -> dict[str, float]:
        waits: dict[str, list[float]] = {}
        for a in self.arrivals:
            wait = self.clock.submitted[a.job_id] - self.clock.created[a.job_id]
            waits.setdefault(a.tenant, []).append(wait)
        return {t: statistics.fmean(w) for t, w in sorted(waits.items())}

    def pass_times(self) -> str:
        seconds = sorted(s for s, _ in self.clock.passes)
        p50, p99 = (_percentile(seconds, pct) * 1000 for pct in (50, 99))
        return f"{p50:.0f} / {p99:.0f} (≤ {max(q for _, q in self.clock.passes)})"

    def fairness(self) -> float:
        waits = self.waits().values()
        return max(waits) / max(statistics.median(waits), 1e-9)

    def problems(self) -> list[str]:
        """Anything the run did that placement must never do."""
        said = []
        if any(n > 1 for n in self.clock.submits.values()) or len(self.recorded) != len(
            self.arrivals
        ):
            said.append(f"{len(self.recorded)} attempts for {len(self.arrivals)} jobs")
        rungs = {r.name: r for r in LADDER.providers}
        for a in self.recorded:
            rung = rungs[a.provider]
            if (a.device, a.device_count, a.cost_per_hour) != (rung.device, 1, rung.cost_per_hour):
                said.append(f"attempt {a.id} recorded {a.device} x{a.device_count}")
        said += [f"{e.job_id}: {e.resources}" for e in self.assigned
                 if e.resources.get("device_count") != 1]  # fmt: skip
        return said


async def run(scenario: Scenario, rule: str, args: argparse.Namespace, database: Path) -> Outcome:
    """One simulation on a fresh database: every job arrives, is placed and runs to its end."""
    migrate(f"sqlite:///{database}")
    engine = make_engine(f"sqlite:///{database}")
    rng = random.Random(args.seed)
    arrivals = workload(scenario, rng)
    durations = {a.job_id: rng.uniform(*args.duration_s) for a in arrivals}
    clock = Clock()
    providers = {s.name: FakeProvider(s.name, engine, clock, durations) for s in LADDER.providers}
    events: list[Event] = []

    async def publish(event: Event) -> None:
        events.append(event)

    async def fail(job_id: str, code: str, message: str) -> None:
        raise AssertionError(f"{job_id} failed: {code}: {message}")

    settings = SchedulerSettings(
        webhook_secret=SecretStr("bench-scheduler-webhook-secret-0123456789"),
        poll_interval_s=args.poll_s,
    )
    attempts = Attempts(
        engine=engine, publish=publish, pool=ProviderPool(LADDER, providers), settings=settings,
        work_root=database.parent / "work",
        output_prefix=lambda job: f"s3://bench/tenants/{job.tenant}/jobs/{job.id}",
        trainer_config=lambda job, attempt, prefix, _reports: planning.trainer_config(
            job, json.loads(job.plan or b"{}"), attempt_id=attempt, output_prefix=prefix,
            webhook_url="http://127.0.0.1:1", secret="bench", torch_threads=1,
        ),
        fail=fail,
    )  # fmt: skip
    decide = attempts._placements

    def timed() -> list[tuple[str, ProviderSpec, int]]:
        waiting, began = len(clock.created) - len(clock.submitted), time.perf_counter()
        decided = decide()
        clock.passes.append((time.perf_counter() - began, waiting))
        return decided

    attempts._placements = timed  # type: ignore[method-assign]
    try:
        wall = await _simulate(attempts, arrivals, plan_document(), clock, args.poll_s)
        with session_scope(engine) as session:
            recorded = list(session.exec(select(AttemptRow)).all())
    finally:
        engine.dispose()
    assigned = [e for e in events if isinstance(e, JobAssigned)]
    return Outcome(scenario, rule, clock, arrivals, wall, assigned, recorded)


async def _simulate(
    attempts: Attempts, arrivals: list[Arrival], plan: dict[str, Any], clock: Clock, poll_s: float
) -> float:
    start = time.monotonic()

    async def arrive(arrival: Arrival) -> None:
        await asyncio.sleep(max(0.0, start + arrival.at_s - time.monotonic()))
        trainer = {**plan["trainer"], "method": "full" if arrival.full else "lora"}
        clock.created[arrival.job_id] = time.monotonic()
        await asyncio.to_thread(_queue, attempts.engine, arrival, {**plan, "trainer": trainer})
        await attempts.assign()
        if arrival.job_id in clock.submitted:
            clock.placed_on_arrival.add(arrival.job_id)

    async def poll() -> None:
        while True:
            await attempts.check()
            await asyncio.sleep(poll_s)

    polling = asyncio.create_task(poll())
    try:
        await asyncio.gather(*(arrive(a) for a in arrivals))
        while len(clock.submitted) < len(arrivals):
            await asyncio.sleep(0.05)
    finally:
        polling.cancel()
        await asyncio.gather(polling, return_exceptions=True)
    return time.monotonic() - start


def _queue(engine: Engine, arrival: Arrival, plan: dict[str, Any]) -> None:
    """The planned job, written `queued` as Scheduler.start leaves it."""
    with session_scope(engine) as session:
        row = jobs.create(
            session,
            job_id=arrival.job_id,
            tenant=arrival.tenant,
            request=JobCreate(model=SMOLLM2_135M_INSTRUCT.id, training_file="ds_bench"),
            dataset_id="ds_bench",
        )
        row.status, row.plan = "queued", jobs.dumps(plan)
        session.add(row)
        session.commit()


def report(outcomes: list[Outcome]) -> bool:
    table = Table(title="Placement: decision latency (ms) and each tenant's mean wait (s)")
    for column in ("scenario", "rule", "placed on arrival", "latency p50 / p99 / max"):
        table.add_column(column, justify="left" if column in ("scenario", "rule") else "right")
    tenants = list(outcomes[0].waits())
    for tenant in tenants:
        table.add_column(tenant.removeprefix("tenant-"), justify="right")
    table.add_column("max / median", justify="right")
    table.add_column("pass p50 / p99 ms (queued)", justify="right")
    met = True
    for outcome in outcomes:
        lat = outcome.latencies()
        p99 = _percentile(lat, 99)
        waits = outcome.waits()
        table.add_row(
            outcome.scenario.name,
            outcome.rule,
            str(len(lat)),
            f"{_percentile(lat, 50) * 1000:.0f} / {p99 * 1000:.0f} / {max(lat, default=0) * 1000:.0f}",
            *(f"{waits[t]:.1f}" for t in tenants),
            f"{outcome.fairness():.2f}",
            outcome.pass_times(),
        )
        if outcome.rule == "fair":
            met &= _verdicts(outcome, p99)
    console.print(table)
    return met


def _verdicts(outcome: Outcome, p99: float) -> bool:
    name, fair = outcome.scenario.name, outcome.fairness()
    ok = p99 <= GOAL_P99_S and not outcome.problems()
    line = f"{name}: latency p99 {p99 * 1000:.0f} ms (goal <= 1000): {_mark(p99 <= GOAL_P99_S)}"
    if outcome.scenario.judge_fairness:
        ok &= fair <= GOAL_FAIRNESS
        line += f"; fairness {fair:.2f} (goal <= {GOAL_FAIRNESS:g}): {_mark(fair <= GOAL_FAIRNESS)}"
    problems = outcome.problems()
    line += f"; one attempt a job, device, count and price recorded: {_mark(not problems)}"
    console.print(line + f"; {outcome.wall_s:.0f} s")
    for problem in problems[:5]:
        console.print(f"  [red]{problem}")
    return ok


def _mark(ok: bool) -> str:
    return "[green]PASS[/green]" if ok else "[red]FAIL[/red]"


def _percentile(values: list[float], pct: float) -> float:
    """Nearest rank: the smallest value at or above pct % of them."""
    return values[max(0, -(-len(values) * int(pct) // 100) - 1)] if values else 0.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument(
        "--duration-s", type=lambda s: tuple(map(float, s.split("-"))), default=(1.0, 4.0)
    )
    parser.add_argument("--poll-s", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-baseline", action="store_true")
    return parser.parse_args(argv)


async def amain(args: argparse.Namespace) -> bool:
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="bench-scheduler-") as tmp:
        for name in args.scenarios.split(","):
            scenario = SCENARIOS[name]
            outcomes.append(await run(scenario, "fair", args, Path(tmp) / f"{name}-fair.db"))
            if scenario.judge_fairness and not args.no_baseline:
                with mock.patch("services.scheduler.attempts.place", fifo_place):
                    database = Path(tmp) / f"{name}-fifo.db"
                    outcomes.append(await run(scenario, "oldest first", args, database))
    places = sum(r.capacity for r in LADDER.providers)
    console.print(
        f"{TENANTS} tenants x {JOBS_PER_TENANT} jobs; {places} "
        f"places on {len(LADDER.providers)} rungs; runs of {args.duration_s[0]:g}-"
        f"{args.duration_s[1]:g} s; poll every {args.poll_s:g} s; seed {args.seed}"
    )
    return report(outcomes)


def main(argv: list[str] | None = None) -> None:
    sys.exit(0 if asyncio.run(amain(parse_args(argv))) else 1)


if __name__ == "__main__":
    main()
