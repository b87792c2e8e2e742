"""Serving benchmark (`make bench-serve`): deploy -> first token of a LoRA adapter, and generated
tokens/s of the CPU LoRA engine at concurrency 1, 8 and 32 against plain `model.generate` one
request at a time, on SmolLM2-135M-Instruct, in the same run.

    .venv/bin/python -m tests.benchmarks.bench_serve [--threads 1] [--requests 32]
        [--max-tokens 64] [--concurrency 1,8,32] [--rounds 3] [--model DIR]

- Adapters: PEFT LoRA, rank 16 on every linear layer of the blocks (`all-linear`), peft's own
  init (A random, B zero: a trainer's step 0), saved with `save_pretrained` beside the tokenizer
  and naming the base by catalogue id, as the trainer writes a checkpoint. A new one each round.
- Warm deploy (goal <= 15 s): a `LoraEngine` of the base is running and has served; the clock
  starts when it is asked to load the adapter (`LoraEngine.load_model`, the hoster's call) and
  stops when the first streamed content of a chat completion naming the adapter arrives (the
  official `openai` SDK, stream=True). The adapter is unloaded after its round.
- Cold deploy (shown, not judged): a new `LoraEngine` started with the adapter and pinned to it,
  as a deployment's engine is (process start, imports, base and adapter load) -> first token.
  Both are the median of --rounds rounds, with the spread.
- Throughput: --requests held-out demo tickets (shared/dev/demo/tickets.py, the demo's system
  prompt), greedy, at most --max-tokens new tokens each, through the engine's OpenAI endpoint
  (`AsyncOpenAI`, non-streamed, --concurrency requests kept in flight) against the baseline: the
  same model in this process, `model.generate` one request at a time on the same token ids, same
  max_new_tokens, same torch threads (--threads, the engine's and this process's; the engine is
  idle meanwhile). The baseline runs before and after the engine's runs and the faster of the
  two is the one compared (on shared cores a slow phase must not flatter the engine). Tokens:
  usage.completion_tokens and the baseline's new tokens, both counting an end-of-sequence
  token. Goal: >= 3x the baseline's tokens/s at 8 concurrent.
Not collected by pytest; the numbers go to docs/benchmarks.md. Exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletionMessageParam
from rich.console import Console
from rich.table import Table

from services.hoster.config import HosterSettings
from services.hoster.engines import EngineSpec, LoraEngine
from shared.catalogue import SMOLLM2_135M_INSTRUCT, locate
from shared.dev.demo.tickets import generate as generate_tickets

ROOT = Path(__file__).resolve().parents[2]
BASE = SMOLLM2_135M_INSTRUCT.id
GOAL_DEPLOY_S = 15.0
GOAL_RATIO, GOAL_CONCURRENCY = 3.0, 8
FIRST_TOKEN_MAX_TOKENS = 16  # the deploy rounds' answers: only their first token is timed
API_KEY = "unused"  # the engine checks no key; the SDK wants one
console = Console(width=120, highlight=False)  # the tables unwrapped in logs too

Messages = list[ChatCompletionMessageParam]


@dataclass
class Deploy:
    """One deploy round: until the engine took the adapter (warm: load_model answered; cold:
    /health answered), and until the first token arrived, both from the round's start."""

    loaded_s: float
    first_token_s: float


@dataclass
class Run:
    """One throughput run: the tokens generated, its wall time, each request's latency."""

    label: str
    concurrency: int
    tokens: int
    wall_s: float
    latencies: list[float]
    answers: list[str]

    @property
    def rate(self) -> float:
        return self.tokens / self.wall_s


# --- set-up ----------------------------------------------------------------------------------------


def ticket_prompts(count: int) -> list[Messages]:
    tickets = generate_tickets("heldout")
    return [cast(Messages, tickets[i % len(tickets)].messages()) for i in range(count)]


def make_adapter(base_dir: Path, dest: Path, seed: int) -> Path:
    """A LoRA checkpoint as the trainer saves one: adapter, tokenizer, the base's catalogue id."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(str(dest))
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(dest)
    adapter_config = dest / "adapter_config.json"
    document = json.loads(adapter_config.read_text())
    document["base_model_name_or_path"] = BASE
    adapter_config.write_text(json.dumps(document))
    return dest


def start_engine(
    settings: HosterSettings, work: Path, base_dir: Path, engine_id: str, adapter: Path | None
) -> LoraEngine:
    """A LoRA engine of the base; with an adapter, loaded at start and pinned as a deployment's."""
    models = {engine_id: adapter} if adapter is not None else {}
    spec = EngineSpec(
        engine_id,
        work / engine_id,
        pinned=engine_id if adapter is not None else None,
        base_name=BASE,
        base_dir=base_dir,
        models=models,
    )
    engine = LoraEngine(spec, settings)
    engine.start()
    return engine


# --- deploy -> first token -----------------------------------------------------------------------


def first_token_at(base_url: str, model: str, messages: Messages) -> float:
    """perf_counter() when the first streamed content arrives (the stream is read to its end)."""
    client = OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=600)
    first: float | None = None
    with client.chat.completions.create(
        model=model,
        messages=messages,
        stream=True,
        max_tokens=FIRST_TOKEN_MAX_TOKENS,
        temperature=0,
    ) as stream:
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter()
    if first is None:
        raise RuntimeError(f"{model}: the stream carried no content")
    return first


def warm_deploys(engine: LoraEngine, adapters: list[Path], messages: Messages) -> list[Deploy]:
    rounds = []
    for index, adapter in enumerate(adapters):
        name = f"ft:{BASE}:bench:warm-{index}"
        start = time.perf_counter()
        engine.load_model(name, adapter)
        loaded = time.perf_counter()
        first = first_token_at(engine.base_url, name, messages)
        rounds.append(Deploy(loaded - start, first - start))
        engine.unload_model(name)  # the next round's adapter replaces it, as a redeploy would
    return rounds


def cold_deploys(
    settings: HosterSettings, work: Path, base_dir: Path, adapters: list[Path], messages: Messages
) -> list[Deploy]:
    rounds = []
    for index, adapter in enumerate(adapters):
        name = f"ft:{BASE}:bench:cold-{index}"
        start = time.perf_counter()
        engine = start_engine(settings, work, base_dir, name, adapter)
        try:
            loaded = time.perf_counter()
            first = first_token_at(engine.base_url, name, messages)
        finally:
            engine.stop()
        rounds.append(Deploy(loaded - start, first - start))
    return rounds


# --- throughput ----------------------------------------------------------------------------------


async def serve_run(
    base_url: str, prompts: list[Messages], concurrency: int, max_tokens: int
) -> Run:
    """The prompts through the engine, `concurrency` requests in flight until all are answered."""
    todo = list(enumerate(prompts))
    answers, latencies, tokens = [""] * len(prompts), [], 0

    async def worker(client: AsyncOpenAI) -> None:
        nonlocal tokens
        while todo:
            index, messages = todo.pop(0)
            sent = time.perf_counter()
            response = await client.chat.completions.create(
                model=BASE, messages=messages, max_tokens=max_tokens, temperature=0
            )
            latencies.append(time.perf_counter() - sent)
            if response.usage is None:
                raise RuntimeError("the engine's answer carried no usage")
            tokens += response.usage.completion_tokens
            answers[index] = response.choices[0].message.content or ""

    async with AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=1800) as c:
        start = time.perf_counter()
        await asyncio.gather(*(worker(c) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return Run(f"engine, {concurrency} in flight", concurrency, tokens, wall, latencies, answers)


class Baseline:
    """Plain transformers: the model in this process, `model.generate` one request at a time."""

    def __init__(self, base_dir: Path, max_tokens: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(base_dir)
        model: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        self.model: Any = model.eval()
        self.max_tokens, self.prompt_tokens = max_tokens, 0

    def one(self, messages: Messages) -> tuple[int, str]:
        """The new tokens' count (an end-of-sequence token included) and the answer's text."""
        import torch

        tokenizer = self.tokenizer
        eos = tokenizer.eos_token_id
        # The engine's rendering (completions.prompt_ids): the template as text, then its ids.
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        with torch.inference_mode():
            out = self.model.generate(
                **ids, max_new_tokens=self.max_tokens, do_sample=False, pad_token_id=pad
            )
        prompt = int(ids["input_ids"].shape[1])
        self.prompt_tokens += prompt
        new: list[int] = out[0, prompt:].tolist()
        body = new[:-1] if new and new[-1] == eos else new
        return len(new), str(tokenizer.decode(body, skip_special_tokens=True))

    def run(self, prompts: list[Messages], label: str) -> Run:
        self.one(prompts[0])  # warm-up, not counted
        self.prompt_tokens = 0
        answers, latencies, tokens = [], [], 0
        start = time.perf_counter()
        for messages in prompts:
            sent = time.perf_counter()
            generated, answer = self.one(messages)
            latencies.append(time.perf_counter() - sent)
            tokens += generated
            answers.append(answer)
        run = Run(label, 1, tokens, time.perf_counter() - start, latencies, answers)
        console.print(f"{label}: {run.tokens} tokens in {run.wall_s:.1f} s; {_load()}")
        return run


def engine_runs(engine: LoraEngine, prompts: list[Messages], args: argparse.Namespace) -> list[Run]:
    asyncio.run(serve_run(engine.base_url, prompts[:1], 1, args.max_tokens))  # warm-up
    runs = []
    for concurrency in args.concurrency:
        run = asyncio.run(serve_run(engine.base_url, prompts, concurrency, args.max_tokens))
        console.print(f"{run.label}: {run.tokens} tokens in {run.wall_s:.1f} s; {_load()}")
        runs.append(run)
    return runs


# --- report ------------------------------------------------------------------------------------


def _load() -> str:
    """The machine's load (ours included): other work on these cores shows in the numbers."""
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def _mark(ok: bool) -> str:
    return "[green]PASS[/green]" if ok else "[red]FAIL[/red]"


def report_deploys(warm: list[Deploy], cold: list[Deploy]) -> bool:
    table = Table(title="deploy -> first token (s)")
    for column in ("path", "each round: adapter in / first token", "median", "spread", "goal"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for label, rounds in (("warm base", warm), ("cold engine", cold)):
        firsts = [r.first_token_s for r in rounds]
        table.add_row(
            label,
            ", ".join(f"{r.loaded_s:.2f} / {r.first_token_s:.2f}" for r in rounds),
            f"{statistics.median(firsts):.2f}",
            f"{min(firsts):.2f}-{max(firsts):.2f}",
            f"<= {GOAL_DEPLOY_S:g}" if rounds is warm else "(shown)",
        )
    console.print(table)
    median = statistics.median(r.first_token_s for r in warm)
    ok = median <= GOAL_DEPLOY_S
    console.print(
        f"warm-base adapter deploy -> first token: median {median:.2f} s "
        f"(goal <= {GOAL_DEPLOY_S:g} s): {_mark(ok)}"
    )
    return ok


def report_throughput(baselines: list[Run], runs: list[Run]) -> bool:
    baseline = max(baselines, key=lambda r: r.rate)  # the ratios are over the faster one
    table = Table(title="generated tokens/s")
    columns = ("run", "requests", "tokens", "wall s", "tokens/s", "x baseline")
    for column in (*columns, "latency p50 / max s", "same answer"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for run in (*baselines, *runs):
        same = sum(a == b for a, b in zip(run.answers, baseline.answers, strict=True))
        table.add_row(
            run.label,
            str(len(run.answers)),
            str(run.tokens),
            f"{run.wall_s:.1f}",
            f"{run.rate:.1f}",
            f"{run.rate / baseline.rate:.2f}x",
            f"{statistics.median(run.latencies):.2f} / {max(run.latencies):.2f}",
            f"{same}/{len(run.answers)}",
        )
    console.print(table)
    judged = [r for r in runs if r.concurrency == GOAL_CONCURRENCY]
    if not judged:
        console.print(f"no run at {GOAL_CONCURRENCY} in flight: the throughput goal not judged")
        return True
    ratio = judged[0].rate / baseline.rate
    met = ratio >= GOAL_RATIO
    console.print(
        f"tokens/s at {GOAL_CONCURRENCY} in flight over the faster baseline: {ratio:.2f}x "
        f"(goal >= {GOAL_RATIO:g}x): {_mark(met)}"
    )
    return met


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="the base model directory")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, engine and baseline")
    parser.add_argument("--requests", type=int, default=32, help="prompts a throughput run sends")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 8, 32]
    )
    parser.add_argument("--rounds", type=int, default=3, help="deploy rounds, each path")
    return parser.parse_args(argv)


def _base_dir(given: Path | None) -> Path:
    if given is not None:
        return given.resolve()
    from shared.settings import AppSettings

    data_dir = AppSettings().data_dir
    data_dir = data_dir if data_dir.is_absolute() else ROOT / data_dir
    return Path(locate(BASE, data_dir=data_dir))


def run(args: argparse.Namespace, work: Path) -> bool:
    base_dir, prompts = _base_dir(args.model), ticket_prompts(args.requests)
    # The same threads for the engine and the baseline: the engine must not take the cores it
    # finds free (engine_share_cores), or the ratio would compare two cores with one.
    settings = HosterSettings(engine_threads=args.threads, engine_share_cores=False)
    adapters = [make_adapter(base_dir, work / f"adapter-{i}", i) for i in range(2 * args.rounds)]
    # The baseline runs before and after the engine (idle then): the faster of the two is the
    # one compared, so a slow phase of a shared machine cannot flatter the engine.
    baseline = Baseline(base_dir, args.max_tokens)
    baselines = [baseline.run(prompts, "generate, 1 at a time, before")]
    start = time.perf_counter()
    engine = start_engine(settings, work, base_dir, "bench-base", None)
    try:
        console.print(f"base engine: /health after {time.perf_counter() - start:.1f} s")
        runs = engine_runs(engine, prompts, args)
        warm = warm_deploys(engine, adapters[: args.rounds], prompts[0])
    finally:
        engine.stop()
    baselines.append(baseline.run(prompts, "generate, 1 at a time, after"))
    cold = cold_deploys(settings, work, base_dir, adapters[args.rounds :], prompts[0])
    console.print(
        f"{BASE}, {args.threads} torch thread(s), {os.cpu_count()} CPUs; {len(prompts)} demo "
        f"tickets (mean {baseline.prompt_tokens / len(prompts):.0f} prompt tokens), <= {args.max_tokens} new tokens, "
        f"greedy; LoRA r16 all-linear; {time.strftime('%Y-%m-%d %H:%M')}",
    )
    deploy_ok = report_deploys(warm, cold)
    return report_throughput(baselines, runs) and deploy_ok


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        met = run(args, Path(tmp))
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
