"""From a built dataset to a planned job: read the snapshot, profile it, plan, write the trainer's
config. The snapshot layout is the dataset builder's (`train.jsonl`, `eval.jsonl`,
`dataset.json` under a committed prefix); it is read here through object storage, never through
the ingest service's code.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from services.scheduler.analysis import profile_dataset
from services.scheduler.models import JobRow
from services.scheduler.protocol import fine_tuned_name
from services.scheduler.recipe import Plan, UserChoices, plan
from services.scheduler.throughput import Throughput
from shared.catalogue import get_entry
from shared.chat import Sample
from shared.storage import ObjectStore

TRAIN_FILE, EVAL_FILE, META_FILE = "train.jsonl", "eval.jsonl", "dataset.json"


class SnapshotError(ValueError):
    """The dataset snapshot cannot be used for training; the message says why."""


def read_snapshot(store: ObjectStore, uri: str) -> tuple[dict[str, Any], list[Sample], int]:
    """(dataset.json, training samples, eval sample count) of a committed snapshot; get_dir
    checks every file against the manifest's sha256."""
    with tempfile.TemporaryDirectory(prefix="snapshot-") as tmp:
        dest = Path(tmp)
        store.get_dir(uri, dest)
        meta = json.loads((dest / META_FILE).read_bytes())
        with (dest / TRAIN_FILE).open("rb") as lines:
            train = [Sample.model_validate_json(line) for line in lines if line.strip()]
        eval_path = dest / EVAL_FILE
        with eval_path.open("rb") as lines:
            n_eval = sum(1 for line in lines if line.strip())
    if not train:
        raise SnapshotError(f"dataset {uri} has no training samples")
    return meta, train, n_eval


def user_choices(job: JobRow) -> UserChoices:
    request = json.loads(job.request)
    method = request.get("method") or {}
    hyper = (
        (method.get("supervised") or {}).get("hyperparameters")
        or request.get("hyperparameters")
        or {}
    )

    def given(name: str) -> Any:
        value = hyper.get(name, "auto")
        return None if value == "auto" else value

    return UserChoices(
        n_epochs=given("n_epochs"),
        batch_size=given("batch_size"),
        learning_rate_multiplier=given("learning_rate_multiplier"),
        max_duration_s=job.max_duration_s,
    )


def plan_job(
    job: JobRow, meta: dict[str, Any], train: list[Sample], n_eval: int, device: Throughput
) -> tuple[Plan, dict[str, Any]]:
    """The recipe's plan for this job and the document stored with it (`JobRow.plan`)."""
    entry = get_entry(job.model, field="model")
    profile = profile_dataset(meta.get("stats", {}), train, n_eval=n_eval)
    result = plan(
        profile,
        device,
        params=entry.parameters,
        context_len=entry.context_length,
        user=user_choices(job),
    )
    eval_items = min(n_eval, device.eval_items)
    document = {
        "task_kind": result.task_kind,
        "steps": result.steps,
        "eval_every": result.eval_every if eval_items else 0,
        "eval_items": eval_items,
        "estimated_s": result.estimated_s,
        "fine_tuned_model": fine_tuned_name(job.model, job.suffix, job.id),
        "hyperparameters": {
            "n_epochs": result.n_epochs,
            "batch_size": result.batch_size,
            "learning_rate_multiplier": result.learning_rate_multiplier,
        },
        "decisions": [asdict(d) for d in result.decisions],
        "trainer": result.trainer,
    }
    return result, document


def webhook_secret(master: str, job_id: str) -> str:
    """The job's own webhook secret, derived, so none is stored or travels on the bus."""
    return hmac.new(master.encode(), job_id.encode(), hashlib.sha256).hexdigest()


def trainer_config(
    job: JobRow,
    document: dict[str, Any],
    *,
    attempt_id: str,
    output_prefix: str,
    webhook_url: str,
    secret: str,
    torch_threads: int,
) -> dict[str, Any]:
    """The trainer's JobConfig (services/trainer/config.py) as a JSON document."""
    trainer = document["trainer"]
    hyperparameters = {**trainer["hyperparameters"], "seed": job.seed}
    return {
        "config_version": 1,
        "job_id": job.id,
        "attempt_id": attempt_id,
        "tenant": job.tenant,
        "base_model": job.model,
        "dataset": job.dataset_uri,
        "method": trainer["method"],
        "lora": trainer["lora"],
        "hyperparameters": hyperparameters,
        "checkpoints": trainer["checkpoints"],
        "output": {"prefix": output_prefix},
        "webhook": {"url": webhook_url, "secret": secret},
        # share_cores: on CPU, the trainer yields a core to the eval engine while it scores a
        # checkpoint (shared/cpu_share.py); a GPU trainer ignores it.
        "runtime": {"torch_threads": torch_threads, "share_cores": True},
    }
