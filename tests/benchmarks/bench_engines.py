"""CPU eval-engine benchmark: merge + load into a warm `transformers serve --continuous-batching`
(a) against swapping a LoRA adapter in-process on transformers' continuous-batching API (b).

    .venv/bin/python -m tests.benchmarks.bench_engines [--model DIR] [--threads 1] [--checkpoints 2]

For each engine: the time to swap in a new checkpoint and the time for 16 chat requests at
concurrency 8 (max 80 new tokens each), on the real SmolLM2-135M-Instruct, one torch thread. The
checkpoints are LoRA adapters (rank 16, every linear layer of the blocks) made here with peft and
saved with save_pretrained, as the trainer writes them; their random init is enough for timing.
Not collected by pytest; the numbers go to docs/benchmarks.md and docs/hoster.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / ".tuneloop" / "models" / "SmolLM2-135M-Instruct"
PROMPT = "Write a short story about a lighthouse keeper and a storm, in plain sentences."
REQUESTS, CONCURRENCY, MAX_TOKENS = 16, 8, 80
# The hoster's defaults (services/hoster/config.py): on CPU an unbounded cache takes most of RAM.
CACHE_BLOCKS, MAX_BATCH_TOKENS = 64, 2048


def report(rows: list[str], row: str) -> None:
    rows.append(row)
    print(row, flush=True)


def make_adapter(base_dir: Path, dest: Path, seed: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=16, lora_alpha=32, target_modules=targets, task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(dest)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(dest)


def merge(base_dir: Path, adapter_dir: Path, dest: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(dest, safe_serialization=True)
    AutoTokenizer.from_pretrained(adapter_dir).save_pretrained(dest)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _chat(client: httpx.Client, model: str) -> int:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    response = client.post("/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return int(response.json().get("usage", {}).get("completion_tokens", 0))


def _batch(client: httpx.Client, model: str) -> tuple[float, int]:
    start = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        tokens = sum(pool.map(lambda _: _chat(client, model), range(REQUESTS)))
    return time.perf_counter() - start, tokens


def bench_serve(base_dir: Path, adapters: list[Path], work: Path, threads: int) -> list[str]:
    cwd = work / "serve"
    cwd.mkdir()
    (cwd / "base").symlink_to(base_dir)
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    serve = [sys.executable, "-m", "transformers.cli.transformers", "serve"]
    args = ["--continuous-batching", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--cb-num-blocks", str(CACHE_BLOCKS), "--cb-max-batch-tokens", str(MAX_BATCH_TOKENS)]
    log = (work / "serve.log").open("wb")
    proc = subprocess.Popen(
        [*serve, *args], cwd=cwd, env=env, start_new_session=True, stdout=log, stderr=log
    )
    rows = []
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}")
        start = time.perf_counter()
        while True:
            try:
                client.get("/health", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        ready = time.perf_counter() - start
        _chat(client, "base")
        report(
            rows,
            f"(a) serve: up {ready:.1f} s, first base request at {time.perf_counter() - start:.1f} s",
        )
        took, tokens = _batch(client, "base")
        report(
            rows, f"(a) base: {REQUESTS} requests @ {CONCURRENCY}: {took:.1f} s, {tokens} tokens"
        )
        for i, adapter in enumerate(adapters):
            t0 = time.perf_counter()
            merge(base_dir, adapter, cwd / f"ckpt-{i}")
            merged = time.perf_counter() - t0
            _chat(client, f"ckpt-{i}")
            swapped = time.perf_counter() - t0
            took, tokens = _batch(client, f"ckpt-{i}")
            report(
                rows,
                f"(a) ckpt-{i}: merge+save {merged:.1f} s, swap (merge + first request) "
                f"{swapped:.1f} s; {REQUESTS} requests @ {CONCURRENCY}: {took:.1f} s, {tokens} tokens",
            )
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
    return rows


def bench_inprocess(base_dir: Path, adapters: list[Path], threads: int) -> list[str]:
    import torch
    from peft import PeftModel
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        ContinuousBatchingConfig,
        GenerationConfig,
    )

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    t0 = time.perf_counter()
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    model = PeftModel.from_pretrained(base, adapters[0], adapter_name="ckpt-0")
    rows: list[str] = []
    report(rows, f"(b) load base + first adapter: {time.perf_counter() - t0:.1f} s")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False
    )
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    cb_config = ContinuousBatchingConfig(num_blocks=CACHE_BLOCKS, max_batch_tokens=MAX_BATCH_TOKENS)
    config = GenerationConfig(
        max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=tokenizer.eos_token_id
    )
    for i, adapter in enumerate(adapters):
        t0 = time.perf_counter()
        if i:
            model.load_adapter(str(adapter), adapter_name=f"ckpt-{i}")
            model.set_adapter(f"ckpt-{i}")
            model.delete_adapter(f"ckpt-{i - 1}")
        swapped = time.perf_counter() - t0
        t0 = time.perf_counter()
        # The LoRA layers live inside the base's modules: its generate_batch runs them.
        out = model.base_model.model.generate_batch(
            [ids] * REQUESTS, generation_config=config, continuous_batching_config=cb_config
        )
        took = time.perf_counter() - t0
        tokens = sum(len(r.generated_tokens) for r in out.values())
        report(
            rows,
            f"(b) ckpt-{i}: swap (load_adapter + set_adapter) {swapped:.2f} s; "
            f"{REQUESTS} requests in one generate_batch: {took:.1f} s, {tokens} tokens",
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoints", type=int, default=2)
    parser.add_argument("--only", choices=["a", "b"], default=None)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    try:
        adapters = [work / f"adapter-{i}" for i in range(args.checkpoints)]
        for i, dest in enumerate(adapters):
            make_adapter(args.model, dest, seed=i)
        rows = []
        if args.only in (None, "a"):
            rows += bench_serve(args.model, adapters, work, args.threads)
        if args.only in (None, "b"):
            rows += bench_inprocess(args.model, adapters, args.threads)
        print(f"SmolLM2-135M-Instruct, {args.threads} thread(s), {time.strftime('%Y-%m-%d')}")
        print("\n".join(rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
