"""Eval-cost benchmark (`make bench-evals`): what the evaluator's mid-run evals add to a run on
the demo task. Issue 25's goal: with ~8-10 evals a run takes at most 1.5x its time without them.

    .venv/bin/python -m tests.benchmarks.bench_evals [--tickets 250] [--epochs 1] [--keep]

- With evals: the local stack (`make up`'s services), `--tickets` demo tickets replayed through
  the gateway to the fake teacher, a dataset of them (the demo's split: 32 eval items), and a
  job with `n_epochs` `--epochs` and no time budget, so the recipe plans its default number of
  evals (8). The evaluator scores the base while training sets up, each checkpoint while training
  goes on (the trainer yields a core meanwhile), the last one after it, re-scores the top
  checkpoints on more items and decides. Its time: from its attempt's start (the event the
  scheduler records as it starts the trainer process) to the job's end (the decision).
- Without: the same trainer, the same `job.json` the scheduler wrote for that attempt (same
  steps, threads, checkpoints to the same bucket under another prefix), run alone afterwards by
  `python -m services.trainer run` with the scheduler's trainer environment and nothing else
  running; no webhook. Its time: process start to exit.
- Verdict: with / without <= 1.5.

Takes ~12 minutes on 2 cores with the defaults. Not collected by pytest; the numbers go to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from openai import AsyncOpenAI, OpenAI
from rich.console import Console
from rich.table import Table

from services.scheduler.lifecycle import trainer_env
from shared.dev import localstack, supervisor
from shared.dev.demo.run import issue_key
from shared.dev.demo.steps import BASE, dataset, replay
from shared.dev.demo.steps import follow as follow_job
from shared.dev.demo.tickets import generate
from shared.settings import Settings, get_settings

ROOT = Path(__file__).resolve().parents[2]
TENANT = "bench-evals"
GOAL = 1.5
MIN_POINTS = 8  # the goal is stated at ~8-10 evals
QUIET_S = 20  # for the load of the stopped processes to settle
console = Console()


def _attempt_started(client: OpenAI, job_id: str) -> float:
    for event in client.fine_tuning.jobs.list_events(job_id, limit=100):
        if event.message.startswith("Attempt 1 started"):
            return float(event.created_at)
    raise SystemExit(f"bench-evals: job {job_id} has no 'Attempt 1 started' event")


def _training_ended(client: OpenAI, job_id: str) -> float:
    """When the trainer's last step was reported (its metrics events carry train_loss)."""
    for event in client.fine_tuning.jobs.list_events(job_id, limit=100):
        data: Any = event.data
        if event.type == "metrics" and data and "train_loss" in data:
            return float(event.created_at)  # newest first: the last step
    raise SystemExit(f"bench-evals: job {job_id} reported no training step")


def with_evals(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    key = issue_key(settings, TENANT, "bench-evals")
    base_url = f"http://{settings.app.bind_host}:{settings.services.ingest_port}"
    client = OpenAI(base_url=f"{base_url}/v1", api_key=key, timeout=600)
    http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    tickets = generate("train")[: args.tickets]
    console.print(f"replaying {len(tickets)} tickets through the gateway ...")
    since = datetime.now(UTC)
    asyncio.run(replay(AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, timeout=600), tickets))
    dataset_id = dataset(http, len(tickets), since)
    job = client.fine_tuning.jobs.create(
        model=BASE,
        training_file=dataset_id,
        hyperparameters={"n_epochs": args.epochs},
        suffix="bench-evals",
    )
    console.print(f"job [bold]{job.id}[/] on {dataset_id}")
    job = follow_job(client, job.id)
    evaluation = http.get(f"/v1/evals/{job.id}").json()
    started = _attempt_started(client, job.id)
    return {
        "job": job,
        "evaluation": evaluation,
        "started": started,
        "trained_s": _training_ended(client, job.id) - started,
        "run_s": float(job.finished_at) - started,
    }


def job_config(settings: Settings, job_id: str) -> dict[str, Any]:
    data_dir = settings.app.data_dir
    data_dir = data_dir if data_dir.is_absolute() else ROOT / data_dir
    found = sorted((data_dir / "jobs" / job_id).glob("*/job.json"))
    if len(found) != 1:
        raise SystemExit(
            f"bench-evals: expected one attempt's job.json for {job_id}, found {found}"
        )
    config: dict[str, Any] = json.loads(found[0].read_text())
    return config


def without_evals(config: dict[str, Any], work: Path) -> float:
    """The attempt's trainer alone, as the local provider starts it, timed start to exit."""
    alone = {**config, "attempt_id": f"{config['attempt_id']}-alone"}
    alone["output"] = {"prefix": config["output"]["prefix"].rstrip("/") + "-alone"}
    del alone["webhook"]  # the trainer reports only when a webhook is configured
    path = work / "job.json"
    path.write_text(json.dumps(alone))
    threads = int(config["runtime"]["torch_threads"])
    argv = [sys.executable, "-m", "services.trainer", "run", "--config", str(path)]
    console.print(f"the same trainer alone ({threads} threads) ...")
    started = time.perf_counter()
    with (work / "trainer.log").open("wb") as log:
        done = subprocess.run(
            argv,
            cwd=ROOT,
            env=os.environ | trainer_env(threads),
            stdout=log,
            stderr=log,
            check=False,
        )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        tail = (work / "trainer.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"bench-evals: the trainer alone exited {done.returncode}:\n{tail}")
    return wall


def report(run: dict[str, Any], alone_s: float) -> bool:
    evaluation, job = run["evaluation"], run["job"]
    points = [p for p in evaluation["points"] if p["status"] == "scored"]
    table = Table(title=f"{job.id}: {len(points)} evals ({job.trained_tokens} trained tokens)")
    for column in ("", "seconds", "x alone"):
        table.add_column(column, justify="right" if column else "left")
    rows = [
        ("trainer alone (start -> exit)", alone_s),
        ("with evals: attempt start -> last step", run["trained_s"]),
        ("with evals: attempt start -> decision", run["run_s"]),
    ]
    for label, seconds in rows:
        table.add_row(label, f"{seconds:.1f}", f"{seconds / alone_s:.2f}")
    console.print(table)
    durations = ", ".join(f"{p['step']}: {p['duration_s']:.1f}" for p in points)
    console.print(f"eval points (step: seconds): {durations}")
    console.print(f"decision: {json.dumps(evaluation.get('decision'))}")
    ratio = run["run_s"] / alone_s
    ok = len(points) >= MIN_POINTS and ratio <= GOAL
    console.print(
        f"[{'green' if ok else 'red'}]{'MET' if ok else 'MISSED'}[/]: {ratio:.2f}x at "
        f"{len(points)} evals (goal <= {GOAL}x at ~8-10)"
    )
    return ok


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make bench-evals", description=__doc__)
    parser.add_argument("--tickets", type=int, default=250, help="demo tickets captured")
    parser.add_argument("--epochs", type=int, default=1, help="the job's n_epochs")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave S3 running (the rest stops before the trainer alone)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    settings = get_settings()
    supervisor.up(settings)
    try:
        run = with_evals(settings, args)
        config = job_config(settings, run["job"].id)
        # The trainer alone reads its dataset from the bucket and writes checkpoints there: S3
        # stays up, everything else stops, so nothing but the trainer uses the cores.
        others = [c.name for c in localstack.stack_components(settings) if c.name != "s3"]
        supervisor.stop(settings, others)
        time.sleep(QUIET_S)
        console.print(f"load average before the trainer alone: {os.getloadavg()[0]:.2f}")
        work = ROOT / ".tuneloop" / "bench-evals" / run["job"].id
        work.mkdir(parents=True, exist_ok=True)
        ok = report(run, without_evals(config, work))
    finally:
        if not args.keep:
            supervisor.down(settings)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
