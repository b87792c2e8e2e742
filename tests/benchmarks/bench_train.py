"""Training benchmark (`make bench-train`): non-pad tokens/s of our trainer against a plain
Hugging Face `Trainer` + peft baseline, on SmolLM2-135M-Instruct, in the same run.

    .venv/bin/python -m tests.benchmarks.bench_train [--steps 6] [--samples 400] [--batch 8]

Both sides train the same LoRA (rank 16, all linear layers, fp32 on CPU) on the same samples,
rendered by the same chat-template code, with a realistic long-tailed (lognormal) length mix:

- baseline: no packing, a batch of `--batch` samples padded to its longest
  (`DataCollatorForSeq2Seq`), the model's own loss;
- ours: `python -m services.trainer run`, packed rows of `--max-seq-len` tokens (block-diagonal
  attention, positions restarting per sample), as many rows per step as hold `--batch` samples
  on average, so both take the same effective batch.

Each side runs in its own process (peak RSS is per process) and its first step is left out of
the rate (allocation and warm-up). Goals: ratio >= 2x, our padding waste <= 3%. `--steps` sets
the measured length; a few steps keep the default run short, more steps steady the numbers.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
RESULT_PREFIX = "BENCH_RESULT "
GOAL_RATIO = 2.0
GOAL_WASTE = 0.03
LORA = {"rank": 16, "alpha": 32.0, "dropout": 0.05}
console = Console()


@dataclass
class Spec:
    model_dir: str
    snapshot: str
    work_dir: str
    steps: int
    batch: int
    max_seq_len: int
    learning_rate: float = 2e-4
    seed: int = 0
    rows_per_step: int = 1  # ours: packed rows per step holding ~`batch` samples


def _rendered(spec: Spec) -> list[Any]:
    """The training examples both sides use: our renderer, so the tokens are identical."""
    from services.trainer.config import Hyperparameters
    from services.trainer.data import load_snapshot_samples, tokenize_samples
    from services.trainer.model_setup import load_tokenizer

    tokenizer = load_tokenizer(Path(spec.model_dir))
    samples = load_snapshot_samples(spec.snapshot, store=None)
    hp = Hyperparameters(max_seq_len=spec.max_seq_len)
    examples, _ = tokenize_samples(samples, tokenizer, hp)
    return examples


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# -- ours -------------------------------------------------------------------------------------


def run_ours(spec: Spec) -> dict[str, Any]:
    from services.trainer.__main__ import main

    out = Path(spec.work_dir) / "ours-out"
    job = {
        "job_id": "bench-train",
        "tenant": "bench",
        "base_model": spec.model_dir,
        "dataset": spec.snapshot,
        "lora": LORA,
        "hyperparameters": {
            "max_steps": spec.steps + 1,
            "micro_batch_size": spec.rows_per_step,
            "max_seq_len": spec.max_seq_len,
            "learning_rate": spec.learning_rate,
            "warmup_steps": 0,
            "seed": spec.seed,
            "precision": "fp32",
            "gradient_checkpointing": False,
        },
        "checkpoints": {"every_n_steps": 1_000_000},
        "output": {"prefix": str(out)},
    }
    config = Path(spec.work_dir) / "ours-job.json"
    config.write_text(json.dumps(job))
    code = main(["run", "--config", str(config), "--progress", "off"])
    if code != 0:
        raise SystemExit(f"our trainer exited {code}")
    history = json.loads((out / "final" / "trainer_state.json").read_text())["history"]
    measured = history[1:]
    return {
        "tokens": sum(h["tokens"] for h in measured),
        "seconds": sum(h["seconds"] for h in measured),
        "steps": len(measured),
        "waste": _our_waste(spec),
        "loss_first": history[0]["loss"],
        "loss_last": history[-1]["loss"],
        "peak_rss_mib": _peak_rss_mib(),
    }


def _our_waste(spec: Spec) -> float:
    """Pad share of the micro-batches ours feeds the model, over a whole epoch."""
    from services.trainer.config import Hyperparameters
    from services.trainer.data import TrainingData

    hp = Hyperparameters(
        max_seq_len=spec.max_seq_len, micro_batch_size=spec.rows_per_step, seed=spec.seed
    )
    data = TrainingData(_rendered(spec), hp, pad_token_id=0)
    real = total = 0
    for step in data.steps():
        real += step.num_tokens
        total += sum(int(micro["input_ids"].numel()) for micro in step.micro_batches)
    return 1 - real / total


# -- the baseline -----------------------------------------------------------------------------


def run_baseline(spec: Spec) -> dict[str, Any]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        DataCollatorForSeq2Seq,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from services.trainer.model_setup import load_tokenizer

    tokenizer = load_tokenizer(Path(spec.model_dir))
    # Our labels are pre-shifted; the model's own loss wants them aligned with input_ids.
    features = [
        {
            "input_ids": e.input_ids,
            "attention_mask": [1] * len(e.input_ids),
            "labels": [-100, *e.labels[:-1]],
        }
        for e in _rendered(spec)
    ]
    model = AutoModelForCausalLM.from_pretrained(
        spec.model_dir, local_files_only=True, dtype=torch.float32, attn_implementation="sdpa"
    )
    model = get_peft_model(
        model,
        LoraConfig(
            task_type="CAUSAL_LM",
            r=LORA["rank"],
            lora_alpha=LORA["alpha"],
            lora_dropout=LORA["dropout"],
            target_modules="all-linear",
        ),
    )
    pad = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100)
    batches: list[tuple[int, int]] = []  # (non-pad tokens, all tokens) per collated batch

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        batch = pad(items)
        batches.append((int(batch["attention_mask"].sum()), int(batch["input_ids"].numel())))
        return batch

    step_ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step_ends.append(time.perf_counter())

    args = TrainingArguments(
        output_dir=str(Path(spec.work_dir) / "hf-out"),
        per_device_train_batch_size=spec.batch,
        gradient_accumulation_steps=1,
        max_steps=spec.steps + 1,
        learning_rate=spec.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        seed=spec.seed,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=features,
        data_collator=collate,
        callbacks=[Clock()],
    )
    trainer.train()
    measured = batches[1 : spec.steps + 1]
    return {
        "tokens": sum(real for real, _ in measured),
        "seconds": step_ends[spec.steps] - step_ends[0],
        "steps": spec.steps,
        "waste": 1 - sum(r for r, _ in batches) / sum(t for _, t in batches),
        "peak_rss_mib": _peak_rss_mib(),
    }


# -- the parent -------------------------------------------------------------------------------


def _rows_per_step(spec: Spec) -> tuple[int, str]:
    """Packed rows that hold `batch` samples on average (the same effective batch), and a line
    describing the length mix."""
    from services.trainer.packing import pack

    examples = _rendered(spec)
    rows = pack(examples, spec.max_seq_len)
    lengths = sorted(len(e) for e in examples)
    mix = (
        f"{len(examples)} samples, tokens after truncation at {spec.max_seq_len}: median "
        f"{lengths[len(lengths) // 2]}, p90 {lengths[int(len(lengths) * 0.9)]}, "
        f"max {lengths[-1]}; {sum(e.truncated for e in examples)} truncated"
    )
    return max(1, round(spec.batch * len(rows) / len(examples))), mix


def _worker(side: str, spec: Spec) -> dict[str, Any]:
    spec_path = Path(spec.work_dir) / f"{side}-spec.json"
    spec_path.write_text(json.dumps(spec.__dict__))
    console.print(f"running {side} ({spec.steps + 1} steps, first one not measured)...")
    done = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.bench_train", "--worker", side, str(spec_path)],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    lines = done.stdout.decode(errors="replace").splitlines()
    results = [line[len(RESULT_PREFIX) :] for line in lines if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not results:
        tail = done.stderr.decode(errors="replace")[-3000:]
        raise SystemExit(f"{side} worker failed ({done.returncode}):\n{tail}")
    return dict(json.loads(results[-1]))


def _report(spec: Spec, ours: dict[str, Any], base: dict[str, Any]) -> None:
    table = Table(title=f"bench-train: SmolLM2-135M LoRA, {spec.batch} samples/step (CPU)")
    for column in ("trainer", "rows/step", "non-pad tok/s", "pad waste", "peak RSS MiB"):
        table.add_column(column, justify="right")
    rate_ours = ours["tokens"] / ours["seconds"]
    rate_base = base["tokens"] / base["seconds"]
    table.add_row(
        "tuneloop (packed)",
        str(spec.rows_per_step),
        f"{rate_ours:,.0f}",
        f"{ours['waste']:.1%}",
        f"{ours['peak_rss_mib']:,.0f}",
    )
    table.add_row(
        "HF Trainer + peft",
        f"{spec.batch} samples",
        f"{rate_base:,.0f}",
        f"{base['waste']:.1%}",
        f"{base['peak_rss_mib']:,.0f}",
    )
    console.print(table)
    ratio = rate_ours / rate_base
    ok = "[green]met[/]" if ratio >= GOAL_RATIO else "[red]missed[/]"
    console.print(f"throughput ratio: {ratio:.2f}x (goal >= {GOAL_RATIO:.0f}x: {ok})")
    ok = "[green]met[/]" if ours["waste"] <= GOAL_WASTE else "[red]missed[/]"
    console.print(f"our padding waste: {ours['waste']:.2%} (goal <= {GOAL_WASTE:.0%}: {ok})")
    console.print(
        f"RSS ratio (ours / baseline): {ours['peak_rss_mib'] / base['peak_rss_mib']:.2f}; "
        f"our loss {ours['loss_first']:.3f} -> {ours['loss_last']:.3f}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="measured steps per side")
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--batch", type=int, default=8, help="samples per optimizer step")
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--model", help="model dir (default: the converted SmolLM2)")
    parser.add_argument("--worker", nargs=2, metavar=("SIDE", "SPEC"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        side, spec_path = args.worker
        spec = Spec(**json.loads(Path(spec_path).read_text()))
        result = run_ours(spec) if side == "ours" else run_baseline(spec)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return
    from shared.dev.base_models import convert_gguf_to_hf, smollm2_gguf_path
    from tests.plugins.models import smollm2_model_dir
    from tests.services.trainer.synthetic_chats import make_samples, write_snapshot

    model_dir = Path(args.model) if args.model else smollm2_model_dir()
    if not args.model:
        convert_gguf_to_hf(smollm2_gguf_path(), model_dir)  # no-op once converted
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        snapshot = write_snapshot(
            Path(tmp) / "snapshot", make_samples(args.samples, seed=11, length="lognormal")
        )
        spec = Spec(
            model_dir=str(model_dir),
            snapshot=str(snapshot),
            work_dir=tmp,
            steps=args.steps,
            batch=args.batch,
            max_seq_len=args.max_seq_len,
        )
        spec.rows_per_step, mix = _rows_per_step(spec)
        console.print(f"length mix: {mix}")
        ours = _worker("ours", spec)
        base = _worker("hf", spec)
        _report(spec, ours, base)


if __name__ == "__main__":
    main()
