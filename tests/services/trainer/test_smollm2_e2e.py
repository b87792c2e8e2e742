"""End to end on the real SmolLM2-135M-Instruct: LoRA on 200 realistic chats (support, QA,
tool calls) through the CLI; the loss falls and the artifact loads in plain transformers + peft
and generates. Sized for 2 CPU cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.trainer.__main__ import EXIT_OK, main
from tests.services.trainer.jobs import isolated_logging, write_job
from tests.services.trainer.synthetic_chats import make_samples, write_snapshot

STEPS = 24

pytestmark = pytest.mark.usefixtures(isolated_logging.__name__)


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~1 min on 2 idle cores; shared CI runners can be much slower
def test_smollm2_lora_learns_and_its_adapter_generates(smollm2_dir: Path, tmp_path: Path) -> None:
    samples = make_samples(200, seed=3)
    snapshot = write_snapshot(tmp_path / "snapshot", samples)
    out = tmp_path / "out"
    document = {
        "job_id": "smollm2-e2e",
        "tenant": "acme",
        "base_model": str(smollm2_dir),
        "dataset": str(snapshot),
        "method": "lora",
        "lora": {"rank": 8, "alpha": 16, "dropout": 0.05},
        "hyperparameters": {
            "max_steps": STEPS,
            "micro_batch_size": 1,
            "max_seq_len": 256,
            "learning_rate": 2e-3,
            "warmup_steps": 2,
            "seed": 1,
        },
        "checkpoints": {"every_n_steps": 12},
        "output": {"prefix": str(out)},
    }
    job = write_job(tmp_path / "job.json", document)
    code = main(["run", "--config", str(job), "--work-dir", str(tmp_path / "work")])
    assert code == EXIT_OK

    final = out / "final"
    state = json.loads((final / "trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["history"]]
    assert len(losses) == STEPS
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.8 * first, f"loss did not fall enough: {first:.3f} -> {last:.3f}"

    config = json.loads((final / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(smollm2_dir)
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, local_files_only=True)
    model = PeftModel.from_pretrained(base, final)
    tokenizer = AutoTokenizer.from_pretrained(final, local_files_only=True)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi, the mobile app shows a blank screen."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    reply = tokenizer.decode(generated[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert reply.strip(), "the adapter generated nothing"
