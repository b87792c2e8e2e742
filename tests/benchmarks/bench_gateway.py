"""Gateway benchmark (`make bench-gateway`): the latency tuneloop's gateway adds and its maximum
throughput, with the LiteLLM proxy run against the same fake upstream in the same run.

    .venv/bin/python -m tests.benchmarks.bench_gateway [--duration 10] [--profile]

One minimal fake OpenAI upstream (fake_openai.py) serves three paths, measured one after another
under the same load (one request at a time, fixed rates, then closed-loop maximum): direct (the
baseline every "added" latency subtracts), through tuneloop's ingest gateway (a real process with
real NATS, S3 and SQLite, capture on, a tenant key), and through the LiteLLM proxy (2 workers,
from .venv-bench). Results are printed, not asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from shared.dev import localstack
from tests.benchmarks import gateway_report, pyspy
from tests.benchmarks.stack import (
    Ingest,
    launch_process,
    make_console,
    sigterm_as_interrupt,
    start_infra,
    start_ingest,
    wait_for_count,
    workdir,
)
from tests.benchmarks.wrk import WrkResult, run_wrk, wrk_version
from tests.fakes.upstream import UPSTREAM_KEYS, upstream_key_env, upstreams_yaml
from tests.plugins.infra import RunningProcess, free_port, persister_process

ROOT = Path(__file__).resolve().parents[2]
BENCH_VENV = ROOT / ".venv-bench"
LITELLM_KEY = "sk-litellm-bench-0123456789"
REQUEST = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are a concise assistant. Answer in one word."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "max_tokens": 16,
    "temperature": 0,
}
console = make_console()


@dataclass
class Target:
    name: str
    url: str
    auth: str


@dataclass
class Results:
    """Every measurement of one run, by target name."""

    # By request rate, one entry per round (each target measured once a round, back to back);
    # rate 0 holds the runs with one connection, one request at a time.
    fixed: dict[float, list[dict[str, WrkResult]]] = field(default_factory=dict)
    peak: dict[str, WrkResult] = field(default_factory=dict)
    # After each tuneloop run: seconds until its samples were all persisted.
    drain_s: dict[str, float] = field(default_factory=dict)
    answered: int = 0  # 2xx answers tuneloop gave
    captured: int = 0  # gateway samples in its database at the end
    litellm_missing: str | None = None


def launch(stack: contextlib.ExitStack, process: RunningProcess) -> None:
    """Spawn without waiting (a slow starter overlaps the others); stopped on any exit."""
    stack.callback(process.stop)
    process.process = localstack.spawn(process.component, process.log_path, env=process.env)


def await_ready(process: RunningProcess, timeout_s: float) -> None:
    proc = process.process
    assert proc is not None
    ok = localstack.wait_until(
        lambda: proc.poll() is not None or process.component.ready(), timeout_s
    )
    if not ok or proc.poll() is not None:
        raise RuntimeError(
            f"{process.component.name} did not become ready in {timeout_s:.0f}s; log tail:\n"
            + process.log()[-3000:]
        )


def fake_upstream(tmp: Path) -> RunningProcess:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    component = localstack.Component(
        name="fake-openai",
        argv=[sys.executable, "-m", "tests.benchmarks.fake_openai", "--port", str(port)],
        ports=[],
        address=url,
        ready=localstack.http_ready(url + "/", [200]),
        stop_timeout_s=5,
    )
    return RunningProcess(component, tmp / "logs" / "fake.log", env={"PYTHONPATH": str(ROOT)})


def litellm_proxy(tmp: Path, upstream_url: str, litellm: Path) -> RunningProcess:
    """LiteLLM as documented for a proxy: a config.yaml with the model list, 2 workers."""
    port = free_port()
    config = tmp / "litellm-config.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: gpt-4o-mini\n"
        "    litellm_params:\n"
        "      model: openai/gpt-4o-mini\n"
        f"      api_base: {upstream_url}/v1\n"
        f"      api_key: {UPSTREAM_KEYS['openai']}\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"
    )
    url = f"http://127.0.0.1:{port}"
    component = localstack.Component(
        name="litellm",
        argv=[
            *(str(litellm), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)),
            *("--num_workers", "2"),
        ],
        ports=[],
        address=url,
        ready=localstack.http_ready(url + "/health/liveliness", [200]),
        stop_timeout_s=10,
    )
    # No network here: the model cost map ships with the package; errors only in its log.
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    return RunningProcess(component, tmp / "logs" / "litellm.log", env=env)


class Bench:
    def __init__(self, args: argparse.Namespace, body: Path, ingest: Ingest) -> None:
        self.args = args
        self.body = body
        self.ingest = ingest
        self.results = Results()

    def wrk(
        self,
        target: Target,
        *,
        duration_s: float,
        rate: float | None = None,
        label: str = "",
        connections: int | None = None,
    ) -> WrkResult:
        result = run_wrk(
            target.url,
            body_file=self.body,
            auth=target.auth,
            duration_s=duration_s,
            connections=connections or self.args.connections,
            rate=rate,
        )
        if target.name == "tuneloop":
            self.results.answered += result.ok
        what = label or (f"{rate:g} req/s" if rate else "max")
        console.log(
            f"{target.name:>9} {what:>11}: {result.rate:8.1f} req/s  p50 {result.p50_ms:7.2f} ms"
            f"  p99 {result.p99_ms:8.2f} ms  non-2xx {result.non_2xx}  timeouts {result.timeouts}"
        )
        if target.name == "tuneloop":
            self.drain(what)
        return result

    def drain(self, label: str) -> None:
        """Wait until every sample tuneloop answered so far is persisted, so the next run (of any
        target) does not share the CPU with tuneloop's capture backlog; record how long it took."""
        ended = time.monotonic()
        captured, at = wait_for_count(
            lambda: self.ingest.count_samples("gateway"), self.results.answered, timeout_s=120
        )
        self.results.captured = captured
        self.results.drain_s[label] = max(0.0, at - ended)

    def at_rate(self, target: Target, rate: float, round_: int) -> WrkResult:
        if rate == 0:
            return self.wrk(target, duration_s=self.args.duration, connections=1,
                            label=f"1 conn #{round_}")  # fmt: skip
        return self.wrk(target, duration_s=self.args.duration, rate=rate,
                        label=f"{rate:g} req/s #{round_}")  # fmt: skip

    def run(self, targets: list[Target]) -> Results:
        for target in targets:  # open connections, fill caches (auth, routes, pools)
            self.wrk(target, duration_s=self.args.warmup, label="warm-up")
        # Rounds, each target back to back within one: a stall of the shared machine (seen
        # here: p50 x5 for a few seconds, with or without capture) hits one round, not the
        # median over rounds that the report uses.
        for rate in (0.0, *self.args.rates):
            self.results.fixed[rate] = [
                {t.name: self.at_rate(t, rate, round_) for t in targets}
                for round_ in range(1, self.args.rounds + 1)
            ]
        for target in targets:
            self.results.peak[target.name] = self.wrk(target, duration_s=self.args.duration)
        return self.results

    def profile(self, target: Target, out: Path) -> None:
        py_spy = BENCH_VENV / "bin" / "py-spy"
        if not py_spy.exists():
            console.print(f"[yellow]no profile: {py_spy} is missing (make bench-venv)")
            return
        recorder = pyspy.record(py_spy, self.ingest.pid, self.args.duration, out)
        time.sleep(0.5)
        self.wrk(target, duration_s=self.args.duration, label="profiled")
        _, err = recorder.communicate(timeout=60)
        if recorder.returncode != 0 or not out.exists():
            console.print(f"[yellow]py-spy failed ({recorder.returncode}): {err.decode()[-500:]}")
            return
        console.print(pyspy.table(pyspy.summarise(out)))
        console.print(f"folded stacks: {out} (speedscope.app or flamegraph.pl read them)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="100,1000", help="fixed request rates, req/s")
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per measured run")
    parser.add_argument("--rounds", type=int, default=3,
                        help="fixed-rate runs per target; the report takes the median")  # fmt: skip
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up per target")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--persister", choices=("inline", "process"), default="process",
                        help="process: samples are stored by a separate persister process")  # fmt: skip
    parser.add_argument("--litellm", type=Path, default=BENCH_VENV / "bin" / "litellm")
    parser.add_argument("--no-litellm", action="store_true", help="skip the baseline")
    parser.add_argument("--profile", type=Path, nargs="?", const=ROOT / ".tuneloop" / "bench-profile",
                        help="after the run, py-spy the gateway under max load (folded stacks to DIR)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    args = parser.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sigterm_as_interrupt()
    started = time.monotonic()
    generator = (
        f"wrk {wrk_version()} (1 thread, {args.connections} connections; fixed rates paced "
        "on a constant schedule in Lua, wrk2-like)"
    )
    with workdir(args.keep) as tmp, contextlib.ExitStack() as stack:
        body = tmp / "request.json"
        body.write_bytes(orjson.dumps(REQUEST))
        fake = fake_upstream(tmp)
        launch(stack, fake)
        await_ready(fake, 30)
        upstream = fake.component.address
        litellm: RunningProcess | None = None
        missing = None
        if args.no_litellm:
            missing = "skipped (--no-litellm)"
        elif not args.litellm.exists():
            missing = f"{args.litellm} not installed (make bench-venv)"
        else:
            litellm = litellm_proxy(tmp, upstream, args.litellm)
            launch(stack, litellm)  # slow to start: overlaps NATS, S3 and ingest
        console.log("starting NATS, S3 and the ingest service")
        settings = start_infra(stack, tmp)
        upstreams = tmp / "upstreams.yaml"
        upstreams.write_text(upstreams_yaml(upstream))
        env = upstream_key_env() | {
            "TUNELOOP_INGEST_UPSTREAMS_FILE": str(upstreams),
            "TUNELOOP_INGEST_PERSISTER": args.persister,
        }
        ingest = start_ingest(stack, settings, tmp, env)
        if args.persister == "process":
            launch_process(stack, persister_process(settings, tmp / "logs" / "persister.log"))
        targets = [
            Target("direct", upstream, f"Bearer {UPSTREAM_KEYS['openai']}"),
            Target("tuneloop", ingest.url, f"Bearer {ingest.key}"),
        ]
        if litellm is not None:
            try:
                await_ready(litellm, 180)
                targets.append(
                    Target("litellm", litellm.component.address, f"Bearer {LITELLM_KEY}")
                )
            except RuntimeError as exc:
                missing = f"LiteLLM proxy did not start: {exc}"
                console.print(f"[red]{missing}")
        console.log(
            f"ready after {time.monotonic() - started:.0f}s; tuneloop ingest (its shipper a "
            f"child), persister {args.persister}; load generator: {generator}"
        )
        bench = Bench(args, body, ingest)
        results = bench.run(targets)
        results.litellm_missing = missing
        gateway_report.render(console, results, generator=generator, cpus=os.cpu_count())
        if args.json:
            args.json.write_bytes(
                orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
            )
        if args.profile:
            bench.profile(targets[1], args.profile.resolve() / "ingest-gateway.folded")
    console.log(f"done in {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every process this run started has been stopped")
        raise SystemExit(130) from None
