"""Deploy -> ready of a LoRA version through the hoster's `Deployments` (the code a
`POST /v1/deployments` runs: checkpoint verified, engine started or adapter loaded onto the shared
one, one warm-up request naming it, `ready` in the table), on a fresh engine and onto the running
base a first version of the same base and tenant already holds; with the engine's resident
memory holding one and two adapters.

    .venv/bin/python -m tests.benchmarks.bench_deploy [--model DIR] [--rounds 3] [--threads 1]

SmolLM2-135M-Instruct by default, LoRA rank 16 on every linear layer of the blocks with random A
and B (so two versions answer differently), saved with save_pretrained as the trainer does and
placed as pulled checkpoints (the object store is not timed: a pull is the same on both paths).
Each round: version A on a fresh engine, version B onto it, both undeployed (the engine stops),
then B alone on a fresh engine. Not collected by pytest; the numbers go to docs/hoster.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from services.hoster.config import HosterSettings
from services.hoster.deployments import Deployments
from services.hoster.models import ModelVersion
from services.hoster.vllm_engine import deployment_engines
from shared import db
from shared.catalogue import MODELS_DIR_NAME, SMOLLM2_135M_INSTRUCT
from shared.db import session_scope

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / ".tuneloop" / "models" / SMOLLM2_135M_INSTRUCT.id
BASE_ID = SMOLLM2_135M_INSTRUCT.id
DIGEST = "0" * 64


class Store:
    """Every checkpoint committed with DIGEST; they are on disk already (not timed)."""

    bucket = "tuneloop"

    def get_bytes(self, key: str) -> bytes:
        return DIGEST.encode()


def make_adapter(model_dir: Path, dest: Path, seed: int) -> None:
    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), config)
    model.save_pretrained(dest)
    adapter_config = dest / "adapter_config.json"
    data = json.loads(adapter_config.read_text()) | {"base_model_name_or_path": BASE_ID}
    adapter_config.write_text(json.dumps(data))


def register(deployments: Deployments, model_dir: Path, version_id: str, seed: int) -> str:
    pulled = deployments.root / "versions" / version_id / "checkpoint"
    make_adapter(model_dir, pulled / "model", seed)
    (pulled / ".sha256").write_text(DIGEST)
    name = f"ft:{BASE_ID}:bench:{version_id}"
    with session_scope(deployments.database) as session:
        session.add(
            ModelVersion(
                id=version_id, tenant="bench", name=name, version=seed, base_model=BASE_ID,
                job_id=version_id, dataset_id="ds", dataset_version="1", step=1,
                checkpoint_uri=f"s3://tuneloop/tenants/bench/jobs/{version_id}", sha256=DIGEST,
                gate="passed",
            )
        )  # fmt: skip
        session.commit()
    return name


def deploy(deployments: Deployments, name: str) -> tuple[str, float]:
    started = time.perf_counter()
    deployment, _ = deployments.request("bench", name)
    ready = deployments.launch(deployment.id)
    assert ready.status == "ready", ready.error
    return deployment.id, time.perf_counter() - started


def rss_mib(pid: int | None) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))
    return int(kib) / 1024


def answer(endpoint: str, name: str) -> str:
    body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    reply = httpx.post(f"{endpoint}/chat/completions", json=body, timeout=120).json()
    return str(reply["choices"][0]["message"]["content"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.bench_deploy")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-deploy-"))
    (work / MODELS_DIR_NAME).mkdir()
    (work / MODELS_DIR_NAME / BASE_ID).symlink_to(args.model.resolve(), target_is_directory=True)
    url = f"sqlite:///{work / 'tuneloop.db'}"
    db.migrate(url)
    settings = HosterSettings(work_dir=work / "hoster", engine_threads=args.threads)
    deployments = Deployments(
        settings=settings, data_dir=work, store=Store(),  # type: ignore[arg-type]
        database=db.make_engine(url), factory=deployment_engines(settings),
    )  # fmt: skip
    a = register(deployments, args.model, "mv-a", 1)
    b = register(deployments, args.model, "mv-b", 2)
    times: dict[str, list[float]] = {"fresh": [], "warm": [], "alone": []}
    memory: dict[str, list[float]] = {"one": [], "two": []}
    for round_ in range(args.rounds):
        first, fresh = deploy(deployments, a)
        second, warm = deploy(deployments, b)
        row = deployments.find(second)
        memory["two"].append(rss_mib(row.pid))
        said = {name: answer(row.endpoint_url or "", name) for name in (a, b)}
        assert said[a] != said[b], said
        for deployment_id in (first, second):
            deployments.stop("bench", deployment_id)
        alone_id, alone = deploy(deployments, b)
        memory["one"].append(rss_mib(deployments.find(alone_id).pid))
        deployments.stop("bench", alone_id)
        for key, value in (("fresh", fresh), ("warm", warm), ("alone", alone)):
            times[key].append(value)
        print(f"round {round_ + 1}: A fresh {fresh:.2f} s, B onto A's engine {warm:.2f} s, "
              f"B alone {alone:.2f} s; answers {said}", flush=True)  # fmt: skip
    for key, values in times.items():
        print(
            f"{key}: median {statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"
        )
    for key, values in memory.items():
        print(f"engine RSS with {key} adapter(s): median {statistics.median(values):.0f} MiB")


if __name__ == "__main__":
    main()
