"""`make bench-shadow`: what mirroring a served name's calls to a shadow adds to the caller.

Goal (issue 24): a shadow adds <= 1 ms to the caller's p50 latency.

A real ingest process (nats-server, SeaweedFS, SQLite as processes) routes two served names of
one tenant to the same fake engine (an OpenAI chat-completions server answering at once, in
its own process, so its time is not the gateway's): `plain` with no shadow and `mirrored` whose
every call (shadow_percent 100) is mirrored to a second fake engine. Calls go one at a time
through the official openai SDK, alternating between the two names so both see the same
machine, for --calls calls each; the report is each name's p50 / p90 latency as the caller sees
it and the p50 difference, over --rounds rounds (the median round is judged).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time

import openai
from rich.table import Table

from shared import bus
from shared.events import ServedNameChanged, ServedTarget
from tests.benchmarks.stack import (
    make_console,
    sigterm_as_interrupt,
    start_infra,
    start_ingest,
    workdir,
)
from tests.plugins.infra import free_port

GOAL_MS = 1.0
# A fake engine in its own process: answers every chat completion at once with its own name.
ENGINE = """
import sys
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
import uvicorn

NAME = sys.argv[2]

async def chat(request):
    body = await request.json()
    message = {"role": "assistant", "content": NAME}
    return JSONResponse({"id": "c", "object": "chat.completion", "created": 1,
        "model": body["model"], "choices": [{"index": 0, "message": message,
        "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
        "total_tokens": 2}})

uvicorn.run(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]),
            host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def target(name: str, port: int) -> ServedTarget:
    return ServedTarget(
        deployment_id=f"dep-{name}", endpoint_url=f"http://127.0.0.1:{port}/v1",
        version_id=f"mv-{name}", model=f"ft:{name}",
    )  # fmt: skip


async def announce(settings: object, events: list[ServedNameChanged]) -> None:
    broker = bus.make_broker(settings.nats, service="bench-shadow")  # type: ignore[attr-defined]
    await bus.connect(broker, settings.nats)  # type: ignore[attr-defined]
    try:
        for event in events:
            await bus.publish(broker, event)
    finally:
        await broker.stop()


def measure(client: openai.OpenAI, calls: int) -> dict[str, list[float]]:
    latencies: dict[str, list[float]] = {"plain": [], "mirrored": []}
    messages: list[dict[str, str]] = [{"role": "user", "content": "Where is my order?"}]
    for n in range(calls * 2):
        name = "plain" if n % 2 == 0 else "mirrored"
        started = time.perf_counter()
        client.chat.completions.create(model=name, messages=messages)  # type: ignore[arg-type]
        latencies[name].append((time.perf_counter() - started) * 1000)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls to each name a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = parser.parse_args()
    sigterm_as_interrupt()
    console = make_console()
    with workdir(args.keep) as tmp, contextlib.ExitStack() as stack:
        settings = start_infra(stack, tmp)
        ingest = start_ingest(stack, settings, tmp)
        ports = {"live": free_port(), "shadow": free_port()}
        for name, port in ports.items():
            engine = subprocess.Popen([sys.executable, "-c", ENGINE, str(port), name])
            stack.callback(engine.terminate)
        time.sleep(2.0)
        live, shadow = target("live", ports["live"]), target("shadow", ports["shadow"])
        plain = ServedNameChanged(tenant="bench", name="plain", revision=1, primary=live)
        mirrored = ServedNameChanged(
            tenant="bench", name="mirrored", revision=1, primary=live, shadow=shadow,
            shadow_percent=100.0,
        )  # fmt: skip
        asyncio.run(announce(settings, [plain, mirrored]))
        client = openai.OpenAI(base_url=f"{ingest.url}/v1", api_key=ingest.key, max_retries=0)
        deadline = time.monotonic() + 30
        while True:  # routed once both answer
            try:
                measure(client, 5)
                break
            except openai.NotFoundError:
                assert time.monotonic() < deadline, "the served names were never routed"
                time.sleep(0.2)
        measure(client, 200)  # warm-up
        table = Table(title=f"Caller latency, ms ({args.calls} calls a name a round)")
        for column in (
            "round",
            "plain p50",
            "plain p90",
            "mirrored p50",
            "mirrored p90",
            "added p50",
        ):
            table.add_column(column, justify="right")
        added = []
        for round_ in range(1, args.rounds + 1):
            got = measure(client, args.calls)
            p50 = {k: statistics.median(v) for k, v in got.items()}
            p90 = {k: statistics.quantiles(v, n=10)[-1] for k, v in got.items()}
            added.append(p50["mirrored"] - p50["plain"])
            table.add_row(
                str(round_), f"{p50['plain']:.2f}", f"{p90['plain']:.2f}",
                f"{p50['mirrored']:.2f}", f"{p90['mirrored']:.2f}", f"{added[-1]:+.2f}",
            )  # fmt: skip
        console.print(table)
        median = statistics.median(added)
        verdict = "PASS" if median <= GOAL_MS else "FAIL"
        console.print(
            f"shadow adds {median:+.2f} ms at p50 (median of {args.rounds} rounds, spread "
            f"{min(added):+.2f} to {max(added):+.2f}); goal <= {GOAL_MS:g} ms: {verdict}"
        )


if __name__ == "__main__":
    main()
