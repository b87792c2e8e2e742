"""Eval engines for real: a LoRA engine process on the tiny model (standing in for the catalogue
base), LoRA checkpoints pulled from real S3, verified, loaded onto the base and answered under
their own names through the official openai SDK, plainly and streamed; the checkpoint scored
before is unloaded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from services.hoster.config import HosterSettings
from services.hoster.engines import EngineSpec, LoraEngine
from services.hoster.errors import ArtifactFailed, BadRequest, NotFound
from services.hoster.eval_engines import EvalEngines
from shared.processes import pid_alive
from shared.storage import ObjectStore
from tests.services.hoster.checkpoints import BASE_ID, install_base, store_checkpoint

pytestmark = pytest.mark.slow
TENANT, JOB = "acme", "ftjob-evals"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def engines(
    tmp_path: Path, tiny_model_dir: Path, object_store: ObjectStore
) -> Iterator[EvalEngines]:
    install_base(tmp_path, tiny_model_dir)
    settings = HosterSettings(work_dir=tmp_path / "hoster", engine_load_timeout_s=240)

    def serve(spec: EngineSpec) -> LoraEngine:
        return LoraEngine(spec, settings)

    pool = EvalEngines(settings=settings, data_dir=tmp_path, store=object_store, factory=serve)
    yield pool
    pool.close_all()


def test_a_checkpoint_is_loaded_and_answers_under_its_name(
    engines: EvalEngines, object_store: ObjectStore, tmp_path: Path
) -> None:
    entry = engines.open(TENANT, JOB, BASE_ID)
    assert engines.open(TENANT, JOB, BASE_ID).engine_id == entry.engine_id  # idempotent
    client = openai.OpenAI(base_url=entry.engine.base_url, api_key="unused", max_retries=0)
    base = client.chat.completions.create(model=BASE_ID, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert base.choices[0].message.content is not None

    uri = store_checkpoint(object_store, tmp_path, tenant=TENANT, job_id=JOB, step=10)
    name = engines.add_checkpoint(entry.engine_id, uri, 10)
    assert name == f"{JOB}:ckpt-step-10"
    served = {m.id: m for m in client.models.list().data}
    assert set(served) == {BASE_ID, name}
    assert served[name].parent == BASE_ID  # type: ignore[attr-defined]

    answer = client.chat.completions.create(
        model=name,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0,
    )
    assert answer.model == name
    assert answer.usage is not None
    assert answer.usage.completion_tokens >= 1
    stream = client.chat.completions.create(
        model=name,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0,
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    assert chunks[-1].choices[0].finish_reason is not None
    # A random model's tokens may decode to nothing; the streamed text is the plain answer's.
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == (answer.choices[0].message.content or "")
    assert engines.add_checkpoint(entry.engine_id, uri, 10) == name  # a retried call is a no-op

    later = store_checkpoint(object_store, tmp_path, tenant=TENANT, job_id=JOB, step=20, seed=2)
    next_name = engines.add_checkpoint(entry.engine_id, later, 20)
    assert {m.id for m in client.models.list().data} == {BASE_ID, next_name}  # step 10 unloaded
    other = client.chat.completions.create(
        model=next_name,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0,
    )
    assert other.model == next_name

    pid = entry.engine.pid
    assert pid is not None
    engines.close(entry.engine_id)
    assert not pid_alive(pid)
    with pytest.raises(NotFound, match=entry.engine_id):
        engines.add_checkpoint(entry.engine_id, uri, 10)


def test_a_tampered_or_foreign_checkpoint_is_refused(
    engines: EvalEngines, object_store: ObjectStore, tmp_path: Path
) -> None:
    entry = engines.open(TENANT, "ftjob-tamper", BASE_ID)
    uri = store_checkpoint(object_store, tmp_path, tenant=TENANT, job_id="ftjob-tamper", step=5)
    object_store.put_bytes(f"{uri}/model/adapter_model.safetensors", b"not the trained weights")
    with pytest.raises(ArtifactFailed, match=r"sha256|size"):
        engines.add_checkpoint(entry.engine_id, uri, 5)
    foreign = uri.replace(f"/tenants/{TENANT}/", "/tenants/globex/")
    with pytest.raises(BadRequest, match=r"uri: .*not under this tenant's storage"):
        engines.add_checkpoint(entry.engine_id, foreign, 5)
    with pytest.raises(BadRequest, match="job_id"):
        engines.open(TENANT, "../escape", BASE_ID)
