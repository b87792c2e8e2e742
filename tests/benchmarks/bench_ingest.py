"""Ingest benchmark (`make bench-ingest`): OTLP spans -> persisted samples per second, through a
running ingest service, against the in-process decode+map rate measured in the same run.

    .venv/bin/python -m tests.benchmarks.bench_ingest [--requests 100] [--rounds 3]

Agent traces (otlp_traces.py) are encoded as OTLP/JSON and as protobuf export requests of ~500
spans each, POSTed concurrently to `/v1/traces` of an ingest process (real NATS, S3, SQLite), and
timed until every resulting sample is in the database. The baseline is
`otlp.decode_export` + `genai_spans.spans_to_samples` on the same bodies in this process, so the
ratio shows what the pipeline (HTTP, JetStream publish, persister, SQLite) costs on top. The CPU
time the ingest process used per run is reported too ("spans per service CPU s"): on a machine
shared with other work the rates swing, the cost per span much less. Each format is measured in
`--rounds` rounds of fresh traces, the formats taking turns, and the goal is judged on the median
round, as bench-gateway does: a few-second stall of the VM hits one round, not all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import psutil
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from rich.table import Table

from services.ingest import accel
from services.ingest.otlp.export import decode_export
from services.ingest.otlp.genai_spans import spans_to_samples
from tests.benchmarks import pyspy
from tests.benchmarks.otlp_traces import SPANS_PER_TRACE, TraceFactory, export_bodies
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
from tests.plugins.infra import persister_process

ROOT = Path(__file__).resolve().parents[2]
GOAL_SPANS_PER_S = 20_000
PROFILE_S = 10
CONTENT_TYPES = {"json": "application/json", "protobuf": "application/x-protobuf"}
console = make_console()


@dataclass
class Baseline:
    spans: int
    samples: int
    seconds: float

    @property
    def spans_per_s(self) -> float:
        return self.spans / self.seconds


@dataclass
class Pipeline:
    spans: int
    samples_expected: int
    samples_persisted: int
    rejected_spans: int
    accepted_s: float  # first POST sent -> last export answered
    persisted_s: float  # first POST sent -> last sample in the database
    # CPU seconds the ingest process (all its threads) and, with --persister process, the
    # persister process used meanwhile: unlike the rates, this barely moves when other
    # processes compete for the cores.
    service_cpu_s: float
    # Of which the service's child processes (its OTLP mapping pool, the journal
    # shipper, idle here) and the persister process used.
    children_cpu_s: float
    # CPU seconds the whole machine was busy (every process: NATS, S3, the persister, this
    # client): against persisted_s it says whether the run was short of CPU or waiting.
    machine_cpu_s: float
    # Of which the hypervisor gave to other guests (steal time): when the VM is in one of its
    # slow phases, this shows whether it was short of cores or slower on the ones it had.
    stolen_cpu_s: float
    # CPU seconds this process (the load generator) used to send the exports.
    client_cpu_s: float
    # CPU seconds nats-server used (JetStream publish, store, delivery): with the service's and
    # the client's, what the run's busy cores were spent on.
    nats_cpu_s: float

    @property
    def spans_per_s(self) -> float:
        return self.spans / self.persisted_s

    @property
    def samples_per_s(self) -> float:
        return self.samples_persisted / self.persisted_s

    @property
    def spans_per_cpu_s(self) -> float:
        """What one core of the service would sustain at this cost per span."""
        return self.spans / self.service_cpu_s if self.service_cpu_s else 0.0


def in_process(bodies: list[bytes], content_type: str) -> Baseline:
    """decode + map on one core, nothing else: the ceiling the service's pipeline sits under."""
    spans = samples = 0
    start = time.perf_counter()
    for body in bodies:
        decoded = decode_export(body, content_type)
        result = spans_to_samples(decoded, tenant="bench")
        spans += len(decoded)
        samples += len(result.samples)
    return Baseline(spans, samples, time.perf_counter() - start)


def _rejected(content: bytes, encoding: str) -> int:
    if encoding == "json":
        partial = orjson.loads(content or b"{}").get("partialSuccess") or {}
        return int(partial.get("rejectedSpans", 0))
    answer = ExportTraceServiceResponse.FromString(content)
    return int(answer.partial_success.rejected_spans)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response off a kept-alive connection: (status, body). The service answers
    with Content-Length; anything else is an error here, not a guess."""
    status_line = await reader.readline()
    if not status_line:
        raise RuntimeError("the service closed the connection instead of answering")
    status = int(status_line.split(b" ", 2)[1])
    length = None
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length is None:
        raise RuntimeError(f"/v1/traces answered {status} without a Content-Length")
    return status, await reader.readexactly(length)


async def _post_all(ingest: Ingest, bodies: list[bytes], encoding: str, concurrency: int) -> int:
    """POST every body, `concurrency` in flight on kept-alive connections; returns the rejected
    span count. A bare HTTP/1.1 client on asyncio streams, because the load generator shares
    the two cores with the service: httpx spent ~2 ms of CPU per 450 KiB export, 5-10 % of the
    machine during a run, which the service's rate then lacked."""
    url = urlsplit(ingest.url)
    head = (
        f"POST /v1/traces HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {ingest.key}\r\nContent-Type: {CONTENT_TYPES[encoding]}\r\n"
    ).encode()
    queue = list(reversed(bodies))
    rejected = 0

    async def worker() -> None:
        nonlocal rejected
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        try:
            while queue:
                body = queue.pop()
                writer.writelines([head, b"Content-Length: %d\r\n\r\n" % len(body), body])
                status, content = await asyncio.wait_for(_read_response(reader), 120)
                if status != 200:
                    raise RuntimeError(f"/v1/traces answered {status}: {content[:500]!r}")
                rejected += _rejected(content, encoding)
        finally:
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return rejected


def through_service(
    ingest: Ingest,
    bodies: list[bytes],
    encoding: str,
    *,
    samples: int,
    concurrency: int,
    persister: psutil.Process | None = None,
) -> Pipeline:
    """POST the bodies and wait for their samples; `persister`, a persister process of its own
    (--persister process), is part of the pipeline and its CPU is counted with the service's."""
    before = ingest.count_samples("otlp")
    service = psutil.Process(ingest.pid)
    cpu_before = _cpu_s(service, persister)
    nats_before = _nats_cpu_s()
    machine_before, stolen_before = _busy_s(), _stolen_s()
    start, client_before = time.monotonic(), time.process_time()
    rejected = asyncio.run(_post_all(ingest, bodies, encoding, concurrency))
    accepted, client = time.monotonic(), time.process_time() - client_before
    persisted, at = wait_for_count(
        lambda: ingest.count_samples("otlp") - before, samples, timeout_s=120
    )
    cpu, children = (a - b for a, b in zip(_cpu_s(service, persister), cpu_before, strict=True))
    machine, stolen = _busy_s() - machine_before, _stolen_s() - stolen_before
    nats = _nats_cpu_s() - nats_before
    spans = samples * SPANS_PER_TRACE
    return Pipeline(
        spans, samples, persisted, rejected, accepted - start, at - start, cpu, children, machine,
        stolen, client, nats,
    )  # fmt: skip


def _nats_cpu_s() -> float:
    """User + system CPU seconds of the nats-server this benchmark started (its child)."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.name() == "nats-server":
                times = child.cpu_times()
                total += times.user + times.system
    return total


def _stolen_s() -> float:
    return float(getattr(psutil.cpu_times(), "steal", 0.0))


def _busy_s() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _cpu_s(process: psutil.Process, persister: psutil.Process | None) -> tuple[float, float]:
    """User + system CPU seconds of the service with its child processes (OTLP mapping pool,
    the journal shipper) and the persister process if there is one,
    and of all but the service process."""
    total = children = 0.0
    others = [persister] if persister is not None else []
    for member in [process, *process.children(recursive=True), *others]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = member.cpu_times()
            total += times.user + times.system
            if member.pid != process.pid:
                children += times.user + times.system
    return total, children


def median_run(runs: list[Pipeline]) -> Pipeline:
    """The round with the median persisted rate (the lower middle one of an even count)."""
    return sorted(runs, key=lambda run: run.spans_per_s)[(len(runs) - 1) // 2]


def report(
    baselines: dict[str, list[Baseline]],
    pipelines: dict[str, list[Pipeline]],
    sizes: dict[str, int],
) -> None:
    rounds = len(next(iter(pipelines.values())))
    table = Table(title=f"OTLP spans -> persisted samples (median of {rounds} rounds; "
                        "the baseline on the same bodies, same run)")  # fmt: skip
    columns = ("format", "spans a round", "samples", "request body",
               "in-process decode+map spans/s", "answered spans/s", "persisted spans/s",
               "persisted spans/s, each round", "service CPU s", "spans per service CPU s",
               "pipeline / in-process", f"goal >= {GOAL_SPANS_PER_S:,} spans/s")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "format" else "right")
    for encoding, runs in pipelines.items():
        run = median_run(runs)
        base = sorted(baselines[encoding], key=lambda b: b.spans_per_s)[(rounds - 1) // 2]
        complete = all(r.samples_persisted >= r.samples_expected for r in runs)
        table.add_row(
            encoding,
            f"{run.spans:,}",
            f"{run.samples_persisted:,}" + ("" if complete else " (a round incomplete!)"),
            f"{sizes[encoding] / 1024:.0f} KiB",
            f"{base.spans_per_s:,.0f}",
            f"{run.spans / run.accepted_s:,.0f}",
            f"{run.spans_per_s:,.0f}",
            " / ".join(f"{r.spans_per_s / 1000:.1f}k" for r in runs),
            f"{run.service_cpu_s:.1f}",
            f"{run.spans_per_cpu_s:,.0f}",
            f"{run.spans_per_s / base.spans_per_s:.2f}x",
            "[green]met" if run.spans_per_s >= GOAL_SPANS_PER_S else
            f"[red]missed ({run.spans_per_s / GOAL_SPANS_PER_S:.2f}x of goal)",
        )  # fmt: skip
    console.print(table)
    for encoding, runs in pipelines.items():
        for number, run in enumerate(runs, 1):
            if run.rejected_spans:
                console.print(f"[red]{encoding} round {number}: {run.rejected_spans} spans "
                              "rejected (partial success)")  # fmt: skip


def warm_up(
    args: argparse.Namespace, factory: TraceFactory, ingest: Ingest, formats: list[str]
) -> None:
    """A few exports of each format, not in the results: the service's first large export
    starts its OTLP mapping processes, and first calls fill caches (API key, stream contexts)."""
    for encoding in formats:
        bodies = export_bodies(factory, requests=args.warmup,
                               traces_per_request=args.traces_per_request, encoding=encoding)  # fmt: skip
        through_service(ingest, bodies, encoding, samples=len(bodies) * args.traces_per_request,
                        concurrency=args.concurrency)  # fmt: skip
    console.log(f"warmed up with {args.warmup} exports of each format")


def settle(
    service: psutil.Process, persister: psutil.Process | None, *, timeout_s: float = 20.0
) -> None:
    """Wait until the service and its child processes are idle: the journal shipper it starts
    spends about a second of CPU importing and connecting, which would land in a short run."""
    deadline = time.monotonic() + timeout_s
    before = _cpu_s(service, persister)[0]
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _cpu_s(service, persister)[0]
        if now - before < 0.05:  # under a tenth of a core: idle (polls, heartbeats)
            return
        before = now
    console.print(f"[yellow]the service was still busy after {timeout_s:.0f} s; measuring anyway")


def opted_in() -> str:
    """TUNELOOP_INGEST_ACCEL for the service: as this process has it, else on."""
    return os.environ.get(accel.OPT_IN, "1")


def accel_note() -> str:
    """Whether the service ran the compiled modules (its log says which, if any, were stale)."""
    if opted_in() != "1":
        return f"compiled modules off ({accel.OPT_IN}={opted_in()})"
    build = accel.finder_for(accel.DEFAULT_DIR)
    if isinstance(build, str):
        return f"compiled modules off: {build}"
    return f"compiled modules on in the service, here {accel.status().describe()}"


def start_profile(ingest: Ingest, out: Path) -> tuple[subprocess.Popen[bytes], Path] | None:
    py_spy = ROOT / ".venv-bench" / "bin" / "py-spy"
    if not py_spy.exists():
        console.print(f"[yellow]no profile: {py_spy} is missing (make bench-venv)")
        return None
    return pyspy.record(py_spy, ingest.pid, PROFILE_S, out), out


def profile_run(
    args: argparse.Namespace, factory: TraceFactory, ingest: Ingest, encoding: str
) -> None:
    """An extra run with fresh traces, not in the results, with py-spy on the service."""
    bodies = export_bodies(factory, requests=args.requests,
                           traces_per_request=args.traces_per_request, encoding=encoding)  # fmt: skip
    recorder = start_profile(ingest, args.profile.resolve() / "ingest-otlp.folded")
    through_service(ingest, bodies, encoding, samples=len(bodies) * args.traces_per_request,
                    concurrency=args.concurrency)  # fmt: skip
    if recorder is not None:
        finish_profile(*recorder)


def finish_profile(recorder: subprocess.Popen[bytes], out: Path) -> None:
    _, err = recorder.communicate(timeout=PROFILE_S + 60)
    if recorder.returncode != 0 or not out.exists():
        console.print(f"[yellow]py-spy failed ({recorder.returncode}): {err.decode()[-500:]}")
        return
    console.print(pyspy.table(pyspy.summarise(out)))
    console.print(f"folded stacks: {out} (speedscope.app or flamegraph.pl read them)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100,
                        help="export requests per format and round")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3,
                        help="measured rounds per format; the goal is judged on the median")  # fmt: skip
    parser.add_argument("--traces-per-request", type=int, default=56, help="9 spans each")
    parser.add_argument("--concurrency", type=int, default=4, help="exports in flight")
    parser.add_argument(
        "--warmup", type=int, default=8, help="export requests per format, unmeasured"
    )
    parser.add_argument("--formats", default="json,protobuf")
    parser.add_argument("--persister", choices=("inline", "process"), default="inline",
                        help="process: samples are stored by a separate persister process")  # fmt: skip
    parser.add_argument("--profile", type=Path, nargs="?", const=ROOT / ".tuneloop" / "bench-profile",
                        help="py-spy the ingest process during the last format's run (to DIR); "
                             "with TUNELOOP_INGEST_ACCEL=0 it sees into the modules otherwise compiled")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sigterm_as_interrupt()
    started = time.monotonic()
    formats = args.formats.split(",")
    factory = TraceFactory()
    # Fresh traces for every round: a sample already stored is not stored again.
    bodies = [
        {encoding: export_bodies(factory, requests=args.requests,
                                 traces_per_request=args.traces_per_request, encoding=encoding)
         for encoding in formats}
        for _ in range(args.rounds)
    ]  # fmt: skip
    sizes = {encoding: sum(map(len, b)) // len(b) for encoding, b in bodies[0].items()}
    baselines = {e: [in_process(r[e], CONTENT_TYPES[e]) for r in bodies] for e in formats}
    for encoding, bases in baselines.items():
        rates = " / ".join(f"{base.spans_per_s:,.0f}" for base in bases)
        console.log(f"in-process {encoding}: {rates} spans/s ({bases[0].samples} samples a round)")
    pipelines: dict[str, list[Pipeline]] = {encoding: [] for encoding in formats}
    with workdir(args.keep) as tmp, contextlib.ExitStack() as stack:
        console.log("starting NATS, S3 and the ingest service")
        settings = start_infra(stack, tmp)
        # Opted in to the compiled modules unless told otherwise, as the recorded runs were.
        env = {"TUNELOOP_INGEST_PERSISTER": args.persister, accel.OPT_IN: opted_in()}
        ingest = start_ingest(stack, settings, tmp, env)
        persister = None
        if args.persister == "process":
            running = persister_process(settings, tmp / "logs" / "persister.log")
            launch_process(stack, running)
            assert running.process is not None
            persister = psutil.Process(running.process.pid)
        warm_up(args, factory, ingest, formats)
        settle(psutil.Process(ingest.pid), persister)
        for number, encoding in ((n, e) for n in range(args.rounds) for e in formats):
            run = through_service(ingest, bodies[number][encoding], encoding,
                                  samples=baselines[encoding][number].samples,
                                  concurrency=args.concurrency, persister=persister)  # fmt: skip
            pipelines[encoding].append(run)
            console.log(f"round {number + 1}, {encoding}: {run.spans_per_s:,.0f} spans/s persisted "
                        f"({run.samples_persisted} samples in {run.persisted_s:.1f}s, "
                        f"{run.service_cpu_s:.1f} s of service CPU ({run.children_cpu_s:.1f} in "
                        f"its child processes{' and the persister' if persister else ''}), "
                        f"{run.nats_cpu_s:.2f} s of nats-server CPU, "
                        f"{run.client_cpu_s:.2f} s of client CPU, machine busy "
                        f"{run.machine_cpu_s / run.persisted_s:.2f} of {os.cpu_count()} cores, "
                        f"{run.stolen_cpu_s / run.persisted_s:.2f} of them stolen by the "
                        "hypervisor)")  # fmt: skip
        console.print(f"\nmachine: {os.cpu_count()} CPUs shared by the service, NATS, S3, SQLite "
                      "and this client (other processes may be running); samples counted in SQLite; "
                      f"{accel_note()} ({accel.OPT_IN}=0 runs all from source)")  # fmt: skip
        report(baselines, pipelines, sizes)
        if args.json:
            args.json.write_bytes(orjson.dumps({"baselines": baselines, "pipelines": pipelines},
                                               option=orjson.OPT_INDENT_2))  # fmt: skip
        if args.profile:
            profile_run(args, factory, ingest, formats[-1])
    console.log(f"done in {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every process this run started has been stopped")
        raise SystemExit(130) from None
