"""Dataset build benchmark (`make bench-datasets`): 100,000 captured samples -> a built dataset
through a running ingest service (real NATS, S3, SQLite), timed from POST /v1/datasets to
`built`, against the goal of 60 s on 2 cores, with the time of each build step.

    .venv/bin/python -m tests.benchmarks.bench_datasets [--samples 100000] [--base-model ID]

The samples are realistic in shape and mess: shared system prompts, multi-turn chats, tool calls,
exact and near duplicates, refusals, cut-off answers, empty answers, e-mail addresses and phone
numbers, several models. They go straight into the sample store (samples.insert_samples), not
through HTTP: only the build is measured. The tokenizer is SmolLM2's when `make model` has
converted it, else the approximate count.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table
from sqlmodel import Session

from services.ingest.samples.store import insert_samples
from shared import db
from shared.catalogue import CATALOGUE, SMOLLM2_135M_INSTRUCT
from shared.chat import Message, ResponseMeta, Sample, ToolCall, ToolDef
from tests.benchmarks.stack import (
    make_console,
    sigterm_as_interrupt,
    start_infra,
    start_ingest,
    workdir,
)

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / ".tuneloop" / "models"
SMOLLM2 = MODELS / SMOLLM2_135M_INSTRUCT.id
GOAL_S = 60.0
TENANT = "bench"
console = make_console()

_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "sa",
    "to",
    "vi",
    "de",
    "fa",
    "gu",
    "ho",
    "ja",
    "ke",
    "li",
    "mo",
    "nu",
    "pe",
    "qi",
    "ra",
    "si",
    "tu",
    "ve",
    "wo",
    "xa",
    "yu",
    "ze",
]
_MODELS = ["gpt-4o-mini", "gpt-4o", "claude-3-5-haiku"]
_REFUSAL = "I'm sorry, but I can't help with that request."
_WEATHER = ToolDef(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


class Corpus:
    """Pseudo-text from a fixed vocabulary: random enough that MinHash sees distinct samples."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.words = sorted(
            {"".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(6000)}
        )
        self.systems = [self.text(30, 120) for _ in range(40)]

    def text(self, low: int, high: int) -> str:
        words = self.rng.choices(self.words, k=self.rng.randint(low, high))
        return " ".join(words).capitalize() + "."


def _response(rng: random.Random, finish: str = "stop") -> ResponseMeta:
    model = rng.choice(_MODELS)
    return ResponseMeta(
        provider="anthropic" if model.startswith("claude") else "openai",
        model=model,
        model_requested=model,
        finish_reason=finish,  # type: ignore[arg-type]
    )


def _messages(corpus: Corpus, kind: str) -> tuple[list[Message], list[ToolDef]]:
    rng = corpus.rng
    messages = [Message(role="system", content=rng.choice(corpus.systems))]
    for _ in range(rng.randint(1, 3) if kind == "multiturn" else 1):
        messages.append(Message(role="user", content=corpus.text(8, 150)))
        messages.append(Message(role="assistant", content=corpus.text(10, 220)))
    if kind == "pii":
        messages[-2] = Message(
            role="user",
            content=f"{corpus.text(8, 40)} Write to jane.doe{rng.randint(1, 9999)}@example.com "
            f"or call +1 415 555 {rng.randint(1000, 9999)}.",
        )
    if kind == "refusal":
        messages[-1] = Message(role="assistant", content=_REFUSAL)
    if kind == "empty":
        messages[-1] = Message(role="assistant", content="")
    if kind == "tools":
        messages[-1] = Message(
            role="assistant",
            tool_calls=[ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}')],
        )
        return messages, [_WEATHER]
    return messages, []


_KINDS = [
    ("plain", 0.74), ("multiturn", 0.10), ("tools", 0.06), ("pii", 0.03), ("refusal", 0.02),
    ("empty", 0.01), ("length", 0.01), ("duplicate", 0.02), ("near", 0.01),
]  # fmt: skip


def make_samples(count: int, seed: int = 0) -> Iterator[Sample]:
    rng = random.Random(seed)
    corpus = Corpus(rng)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    kinds, weights = zip(*_KINDS, strict=True)
    recent: list[Sample] = []
    for i in range(count):
        kind = rng.choices(kinds, weights)[0]
        created = start + timedelta(seconds=i)
        if kind in ("duplicate", "near") and recent:
            original = rng.choice(recent)
            messages = list(original.messages)
            if kind == "near":  # one word changed in a long answer
                text = messages[-1].text().split()
                text[rng.randrange(len(text))] = rng.choice(corpus.words)
                messages[-1] = Message(role="assistant", content=" ".join(text))
            copy = original.model_dump() | {
                "id": "",
                "source_ref": f"req-{i}",
                "created_at": created,
                "messages": [m.model_dump() for m in messages],
            }
            yield Sample.model_validate(copy)
            continue
        messages, tools = _messages(corpus, kind)
        sample = Sample(
            tenant=TENANT,
            source="gateway",
            source_ref=f"req-{i}",
            created_at=created,
            messages=messages,
            tools=tools,
            response=_response(rng, "length" if kind == "length" else "stop"),
            tags=["bench", f"team:{rng.choice(['search', 'support', 'billing'])}"],
        )
        if kind in ("plain", "multiturn") and len(recent) < 2000:
            recent.append(sample)
        yield sample


def fill_store(database_url: str, count: int, batch: int = 2000) -> float:
    """Insert `count` samples; returns seconds taken (setup, not part of the result)."""
    start = time.monotonic()
    engine = db.make_engine(database_url)
    try:
        pending: list[Sample] = []
        with Session(engine) as session:
            for sample in make_samples(count):
                pending.append(sample)
                if len(pending) >= batch:
                    insert_samples(session, pending)
                    pending = []
            insert_samples(session, pending)
    finally:
        engine.dispose()
    return time.monotonic() - start


@dataclass
class Run:
    dataset: dict[str, Any]
    seconds: float  # POST sent -> `built` seen
    # The slowest GET /v1/datasets/{id} while the build ran: how responsive the service stayed.
    slowest_get_s: float


def build(url: str, key: str, base_model: str | None, timeout_s: float) -> Run:
    headers = {"Authorization": f"Bearer {key}"}
    spec = {"name": "bench", "base_model": base_model, "source": {"tags": ["bench"]},
            "cleaning": {"max_tokens": 2048}}  # fmt: skip
    start = time.monotonic()
    created = httpx.post(f"{url}/v1/datasets", json=spec, headers=headers, timeout=60)
    created.raise_for_status()
    dataset_id = created.json()["id"]
    slowest = 0.0
    with httpx.Client(headers=headers, timeout=60) as client:
        while time.monotonic() - start < timeout_s:
            asked = time.monotonic()
            dataset = client.get(f"{url}/v1/datasets/{dataset_id}").json()
            slowest = max(slowest, time.monotonic() - asked)
            if dataset["status"] in ("built", "failed"):
                return Run(dataset, time.monotonic() - start, slowest)
            time.sleep(0.1)
    raise TimeoutError(f"dataset {dataset_id} not built after {timeout_s:.0f}s")


def report(run: Run, samples: int, tokenizer: str) -> None:
    dataset, seconds = run.dataset, run.seconds
    table = Table(title=f"{samples:,} samples -> dataset (tokenizer: {tokenizer})")
    for column in ("step", "samples in", "samples out", "removed", "changed", "seconds"):
        table.add_column(column, justify="left" if column == "step" else "right")
    previous = 0.0
    for step in dataset["progress"]["steps"]:
        table.add_row(step["step"], f"{step['samples_in']:,}", f"{step['samples_out']:,}",
                      f"{step['removed']:,}", f"{step['changed']:,}",
                      f"{step['elapsed_s'] - previous:.2f}")  # fmt: skip
        previous = step["elapsed_s"]
    table.add_row("queue, claim, row updates", "", "", "", "", f"{seconds - previous:.2f}")
    console.print(table)
    console.print(
        "select includes starting the build process; the step before `overlong` includes "
        "loading the tokenizer; decontaminate includes the split."
    )
    verdict = (
        "[green]met" if seconds <= GOAL_S else f"[red]missed ({seconds / GOAL_S:.2f}x the goal)"
    )
    console.print(
        f"POST -> built: [bold]{seconds:.1f} s[/] vs goal {GOAL_S:.0f} s: {verdict}; "
        f"{samples / seconds:,.0f} samples/s; train {dataset['train_count']:,}, "
        f"eval {dataset['eval_count']:,}, version {dataset['version']}; "
        f"slowest GET during the build {run.slowest_get_s * 1000:.0f} ms"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--base-model", default=SMOLLM2_135M_INSTRUCT.id if SMOLLM2.is_dir() else None,
                        help="a catalogue id (default: SmolLM2 if `make model` has run)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, database)")
    return parser.parse_args(argv)


def link_models(data_dir: Path) -> None:
    """The catalogue models `make model` prepared, seen from the benchmark's own data dir."""
    (data_dir / "models").mkdir(parents=True, exist_ok=True)
    for model_id in CATALOGUE:
        if (MODELS / model_id).is_dir():
            (data_dir / "models" / model_id).symlink_to(MODELS / model_id)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sigterm_as_interrupt()
    with workdir(args.keep) as tmp, contextlib.ExitStack() as stack:
        settings = start_infra(stack, tmp)
        link_models(settings.app.data_dir)
        ingest = start_ingest(stack, settings, tmp)
        console.print(f"inserting {args.samples:,} samples ...")
        setup_s = fill_store(settings.database_url, args.samples)
        console.print(f"inserted in {setup_s:.1f} s (setup, not measured); building ...")
        run = build(ingest.url, ingest.key, args.base_model, args.timeout)
        if run.dataset["status"] != "built":
            console.print(f"[red]build failed: {run.dataset['error']}")
            return 1
        report(run, args.samples, args.base_model or "approx:chars/4")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
