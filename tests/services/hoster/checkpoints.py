"""Checkpoints as the trainer stores them, for hoster tests: a committed `step-XXXXXXXX/` prefix
under the tenant's job, holding `model/` (a PEFT LoRA adapter dir naming its base by catalogue id,
plus the tokenizer) and the trainer's state, with manifest and commit marker (ObjectStore.put_dir).
The base is the tiny random Llama standing in for the catalogue's model in a test data dir."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model

from shared.catalogue import MODELS_DIR_NAME, SMOLLM2_135M_INSTRUCT
from shared.storage import ObjectStore
from tests.plugins.models import build_tiny_causal_lm, build_tiny_tokenizer

BASE_ID = SMOLLM2_135M_INSTRUCT.id


def install_base(data_dir: Path, model_dir: Path) -> Path:
    """The catalogue id resolves to model_dir inside data_dir (as `make model` would put it)."""
    link = data_dir / MODELS_DIR_NAME / BASE_ID
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(model_dir, target_is_directory=True)
    return link


def checkpoint_uri(store: ObjectStore, tenant: str, job_id: str, step: int) -> str:
    return store.uri(f"tenants/{tenant}/jobs/{job_id}/checkpoints/step-{step:08d}")


def store_checkpoint(
    store: ObjectStore, work: Path, *, tenant: str, job_id: str, step: int, seed: int = 1
) -> str:
    """A LoRA checkpoint of the tiny model (random, non-zero B so it changes the answers; the
    same seed gives the same adapter)."""
    local = work / f"{job_id}-step-{step}"
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(seed)
        model = get_peft_model(build_tiny_causal_lm(seed), config)
    model.save_pretrained(local / "model")
    build_tiny_tokenizer().save_pretrained(local / "model")
    adapter_config = local / "model" / "adapter_config.json"
    data = json.loads(adapter_config.read_text())
    data["base_model_name_or_path"] = BASE_ID
    adapter_config.write_text(json.dumps(data))
    (local / "trainer_state.json").write_text(json.dumps({"step": step}))
    uri = checkpoint_uri(store, tenant, job_id, step)
    store.put_dir(local, uri)
    return uri
