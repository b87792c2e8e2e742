"""The memory estimate (KNOWLEDGE.md's rule) picks the rungs a job fits, and a model that fits
none is refused when the job is created, with the numbers."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import URL

from services.scheduler.config import SchedulerSettings
from services.scheduler.jobs import JobError
from services.scheduler.ladder import Ladder, ProviderPool, ProviderSpec
from services.scheduler.lifecycle import Scheduler
from services.scheduler.memory import lora_parameters, training_memory
from services.scheduler.models import JobRow
from services.scheduler.placement import device_count, size_of
from services.scheduler.protocol import JobCreate
from shared.catalogue import SMOLLM2_135M_INSTRUCT, CatalogueEntry
from shared.db import make_engine
from shared.events import Event
from shared.storage import ObjectStore

# Llama-2-7B's shape, for KNOWLEDGE.md's worked example.
LLAMA_7B = CatalogueEntry(
    "Llama-2-7b", "Llama 2 7B", "test", 4096, "llama2", 6_738_415_616, "llama2",
    layers=32, hidden_size=4096, intermediate_size=11008,
)  # fmt: skip


def test_a_full_fine_tune_costs_about_16_bytes_a_parameter_and_lora_the_base_alone() -> None:
    full = training_memory(LLAMA_7B, method="full", precision="bf16", rows=2, row_len=1024)
    assert full.weights_gib == pytest.approx(6_738_415_616 * 2 / 1024**3)
    assert (full.weights_gib + full.training_state_gib) * 1024**3 == pytest.approx(
        6_738_415_616 * 16
    )
    assert 100 < full.total_gib < 160  # KNOWLEDGE.md: ~94 GB and more with the fp32 master copy
    lora = training_memory(LLAMA_7B, method="lora", precision="bf16", rows=2, row_len=1024)
    qlora = training_memory(LLAMA_7B, method="qlora", precision="bf16", rows=2, row_len=1024)
    assert qlora.weights_gib == pytest.approx(lora.weights_gib / 4)
    assert lora.total_gib < 40 < full.total_gib
    # Rank 64 on every linear layer of Llama-2-7B: the known ~160 M adapter parameters.
    assert lora_parameters(LLAMA_7B, 64) == pytest.approx(160e6, rel=0.01)


def test_fsdp_shards_a_full_fine_tune_and_checkpointing_cuts_activations() -> None:
    one = training_memory(LLAMA_7B, method="full", precision="bf16", rows=2, row_len=1024)
    four = training_memory(
        LLAMA_7B, method="full", precision="bf16", rows=2, row_len=1024, devices=4
    )
    assert four.weights_gib + four.training_state_gib == pytest.approx(
        (one.weights_gib + one.training_state_gib) / 4
    )
    checkpointed = training_memory(
        LLAMA_7B, method="full", precision="bf16", rows=2, row_len=1024,
        gradient_checkpointing=True,
    )  # fmt: skip
    assert checkpointed.activations_gib == pytest.approx(one.activations_gib / 17)


def _rung(name: str, memory_gib: float, device: str = "nvidia-l4", count: int = 1) -> ProviderSpec:
    return ProviderSpec(
        name=name, kind="local", device=device, device_count=count, device_memory_gib=memory_gib
    )


def test_a_plan_goes_only_to_the_rungs_whose_devices_hold_it() -> None:
    plan = {"trainer": {"method": "lora", "lora": {"rank": 16},
                        "hyperparameters": {"micro_batch_size": 8, "max_seq_len": 2048}}}  # fmt: skip
    job = JobRow(id="j", tenant="acme", status="queued", model=SMOLLM2_135M_INSTRUCT.id,
                 training_file="f", request=b"{}", plan=json.dumps(plan).encode())  # fmt: skip
    needs = training_memory(
        SMOLLM2_135M_INSTRUCT, method="lora", precision="bf16", rows=8, row_len=2048
    ).total_gib
    assert 2 < needs < 24
    size = size_of(job.model, job.plan)
    assert device_count(size, _rung("big", 24.0)) is not None
    assert device_count(size, _rung("small", 2.0)) is None
    # A model or a plan it cannot size is not held back.
    assert size_of(job.model, b"{}") is None
    assert device_count(None, _rung("small", 2.0)) is not None


async def test_a_model_that_fits_no_rung_is_refused_at_create_naming_the_numbers(
    sqlite_url: URL, object_store: ObjectStore, tmp_path: Path
) -> None:
    engine: Engine = make_engine(sqlite_url)

    async def publish(_: Event) -> None:
        pass

    ladder = Ladder(providers=[_rung("tiny-gpu", 0.25), _rung("cpu-box", 0.5, device="cpu")])
    scheduler = Scheduler(
        engine=engine,
        store=object_store,
        publish=publish,
        pool=ProviderPool(ladder),
        settings=SchedulerSettings(webhook_secret=SecretStr("x" * 40), work_dir=tmp_path),
        data_dir=tmp_path,
        webhook_base="http://127.0.0.1:1",
        ingest_url="http://127.0.0.1:1",
        http=httpx.AsyncClient(),
    )
    try:
        with pytest.raises(JobError) as refused:
            await scheduler.create(
                JobCreate(model=SMOLLM2_135M_INSTRUCT.id, training_file="ds_1"),
                tenant="acme",
                authorization={},
            )
    finally:
        await scheduler.http.aclose()
        engine.dispose()
    assert (refused.value.status, refused.value.param) == (422, "model")
    message = str(refused.value)
    assert message.startswith(f"model: {SMOLLM2_135M_INSTRUCT.id} fits no provider")
    assert "on tiny-gpu (nvidia-l4, 0.25 GiB a device) it needs" in message
    assert "on cpu-box (cpu, 0.5 GiB a device) it needs" in message
    assert "weights 0.25" in message
    assert "weights 0.50" in message
