"""The vLLM engine against a fake `vllm` executable (tests/fakes/vllm_server.py: vLLM's routes,
status codes and error bodies, no GPU): the command line and environment it starts with,
adapters loaded and unloaded at runtime and answering through the official openai SDK, a rank
above max_lora_rank refused before the call, vLLM's errors mapped, a start that exits or never
gets healthy failing with the log's tail, stop and adoption, and which engine deployments get."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from pydantic import ValidationError

from services.hoster.config import HosterSettings
from services.hoster.engines import PID_FILE, EngineSpec, LoraEngine, TransformersServe
from services.hoster.errors import BadRequest, Conflict, EngineFailed
from services.hoster.vllm_engine import VllmEngine, deployment_engines
from services.hoster.vllm_profiles import VLLM_PROFILES
from shared.catalogue import SMOLLM2_135M_INSTRUCT
from shared.processes import pid_alive

FAKE_VLLM = Path(__file__).parents[2] / "fakes" / "vllm_server.py"
BASE = SMOLLM2_135M_INSTRUCT.id
GPU = "nvidia-l4"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]


def make_base(root: Path) -> Path:
    base = root / "base"
    base.mkdir(parents=True)
    shape = {"num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536}
    (base / "config.json").write_text(json.dumps({"model_type": "llama"} | shape))
    return base


def make_adapter(root: Path, name: str, rank: int, **extra: object) -> Path:
    adapter = root / "adapters" / name
    adapter.mkdir(parents=True)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "base_model_name_or_path": BASE,
    }
    (adapter / "adapter_config.json").write_text(json.dumps(config | extra))
    (adapter / "adapter_model.safetensors").write_bytes(b"")  # the fake only checks it is there
    return adapter


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "vllm-record.json"
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(path))
    return path


def vllm_settings(tmp_path: Path, command: str = "", **values: float) -> HosterSettings:
    return HosterSettings(
        engine="vllm",
        vllm_gpu=GPU,
        vllm_command=command or f"{sys.executable} {FAKE_VLLM}",
        work_dir=tmp_path / "hoster",
        engine_start_timeout_s=values.get("start", 60.0),
        engine_load_timeout_s=values.get("load", 30.0),
    )


@pytest.fixture
def engines() -> Iterator[list[VllmEngine]]:
    started: list[VllmEngine] = []
    yield started
    for engine in started:
        engine.stop()


def base_engine(tmp_path: Path, settings: HosterSettings, **models: Path) -> VllmEngine:
    spec = EngineSpec(
        "dep-vllm", tmp_path / "dep-vllm", base_name=BASE, base_dir=make_base(tmp_path),
        models=dict(models),
    )  # fmt: skip
    return VllmEngine(spec, settings)


def calls(record: Path) -> list[dict[str, object]]:
    path = record.with_name(record.name + ".calls.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_vllm_serves_the_base_with_lora_sized_from_the_gpu_table(
    tmp_path: Path, record: Path, engines: list[VllmEngine]
) -> None:
    name = "ft:SmolLM2-135M-Instruct:sfx:ftjob-x"
    adapter = make_adapter(tmp_path, "x", 16)
    engine = base_engine(tmp_path, vllm_settings(tmp_path), **{name: adapter})
    engines.append(engine)
    engine.start()

    profile = VLLM_PROFILES[BASE][GPU]
    started = json.loads(record.read_text())
    assert engine.argv()[:2] == [sys.executable, str(FAKE_VLLM)]
    assert started["argv"] == [
        "serve", str(tmp_path / "base"), "--served-model-name", BASE,
        "--host", "127.0.0.1", "--port", str(engine.port),
        "--enable-lora", "--max-loras", str(profile.max_loras),
        "--max-lora-rank", str(profile.max_lora_rank),
        "--max-model-len", str(profile.max_model_len),
        "--gpu-memory-utilization", str(profile.gpu_memory_utilization),
        "--max-num-seqs", str(profile.max_num_seqs),
    ]  # fmt: skip
    assert (profile.max_loras, profile.max_lora_rank, profile.max_model_len) == (16, 64, 8192)
    assert started["env"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert started["env"]["VLLM_NO_USAGE_STATS"] == "1"
    assert started["env"]["HF_HUB_OFFLINE"] == "1"
    assert (tmp_path / "dep-vllm" / PID_FILE).read_text() == str(engine.pid)
    assert calls(record) == [
        {"call": "load", "body": {"lora_name": name, "lora_path": str(adapter)}}
    ]

    client = openai.OpenAI(base_url=engine.base_url, api_key="unused", max_retries=0)
    served = {m.id: m for m in client.models.list().data}
    assert served[name].parent == BASE  # type: ignore[attr-defined]
    assert served[name].root == str(adapter)  # type: ignore[attr-defined]
    assert served[BASE].parent is None  # type: ignore[attr-defined]
    answer = client.chat.completions.create(model=name, messages=MESSAGES)
    assert name in (answer.choices[0].message.content or "")
    engine.warm_up(name)


def test_adapters_are_loaded_and_unloaded_at_runtime(
    tmp_path: Path, record: Path, engines: list[VllmEngine]
) -> None:
    engine = base_engine(tmp_path, vllm_settings(tmp_path))
    engines.append(engine)
    engine.start()
    client = openai.OpenAI(base_url=engine.base_url, api_key="unused", max_retries=0)
    paths = {
        n: make_adapter(tmp_path, n, 8 * i) for i, n in enumerate(("job:step-1", "job:step-2"), 1)
    }
    for name, path in paths.items():
        engine.load_model(name, path)
    assert engine.adapters() == {n: str(p) for n, p in paths.items()}
    for name in paths:  # each answers as itself
        text = (
            client.chat.completions.create(model=name, messages=MESSAGES).choices[0].message.content
        )
        assert name in (text or "")

    engine.unload_model("job:step-1")
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="job:step-1", messages=MESSAGES)
    engine.unload_model("job:step-1")  # already gone: what was asked for
    assert engine.adapters() == {"job:step-2": str(paths["job:step-2"])}
    assert [c["call"] for c in calls(record)] == ["load", "load", "unload", "unload"]
    assert calls(record)[2]["body"] == {"lora_name": "job:step-1"}


def test_an_adapter_above_max_lora_rank_is_refused_before_the_call(
    tmp_path: Path, record: Path, engines: list[VllmEngine]
) -> None:
    too_high = make_adapter(tmp_path, "wide", 128)
    engine = base_engine(tmp_path, vllm_settings(tmp_path), **{"ft:wide": too_high})
    with pytest.raises(
        BadRequest, match=r"adapter_config.json r: 128 for 'ft:wide' exceeds .*max_lora_rank 64"
    ) as refused:
        engine.start()
    assert refused.value.details == {"rank": 128, "max_lora_rank": 64}
    assert not record.exists()  # refused before any process took the GPU
    assert engine.pid is None

    engine = base_engine(tmp_path / "second", vllm_settings(tmp_path))
    engines.append(engine)
    engine.start()
    patterned = make_adapter(tmp_path, "patterned", 16, rank_pattern={"q_proj": 256})
    with pytest.raises(BadRequest, match="r: 256"):
        engine.load_model("ft:patterned", patterned)
    assert calls(record) == []
    assert engine.adapters() == {}


def test_a_duplicate_name_and_vllms_own_errors_are_mapped(
    tmp_path: Path, record: Path, engines: list[VllmEngine]
) -> None:
    engine = base_engine(tmp_path, vllm_settings(tmp_path))
    engines.append(engine)
    engine.start()
    first, second = make_adapter(tmp_path, "a", 16), make_adapter(tmp_path, "b", 16)
    engine.load_model("ft:a", first)
    engine.load_model("ft:a", first)  # vLLM's 400 "already been loaded", same path: a no-op
    with pytest.raises(Conflict, match="name: 'ft:a' already serves another adapter"):
        engine.load_model("ft:a", second)

    no_weights = make_adapter(tmp_path, "empty", 16)
    (no_weights / "adapter_model.safetensors").unlink()
    with pytest.raises(EngineFailed, match=r"answered 404 NotFoundError: .*No adapter found for"):
        engine.load_model("ft:empty", no_weights)
    with pytest.raises(BadRequest, match=r"has no adapter_config\.json"):
        engine.load_model("ft:whole", make_base(tmp_path / "whole"))
    assert engine.adapters() == {"ft:a": str(first)}


def test_without_the_runtime_lora_variable_the_error_says_so(
    tmp_path: Path, record: Path, engines: list[VllmEngine]
) -> None:
    # A container started without `-e VLLM_ALLOW_RUNTIME_LORA_UPDATING` serves no LoRA routes.
    command = f"env -u VLLM_ALLOW_RUNTIME_LORA_UPDATING {sys.executable} {FAKE_VLLM}"
    engine = base_engine(tmp_path, vllm_settings(tmp_path, command))
    engines.append(engine)
    engine.start()
    assert engine.argv()[:4] == ["env", "-u", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", sys.executable]
    with pytest.raises(EngineFailed, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING did not reach it"):
        engine.load_model("ft:a", make_adapter(tmp_path, "a", 16))


def test_an_engine_that_exits_at_start_fails_with_its_log_tail(
    tmp_path: Path, record: Path
) -> None:
    spec = EngineSpec("dep-bad", tmp_path / "dep-bad", base_name=BASE, base_dir=tmp_path / "gone")
    engine = VllmEngine(spec, vllm_settings(tmp_path))
    with pytest.raises(EngineFailed, match="exited at start-up") as failed:
        engine.start()
    assert "does not appear to have a file named config.json" in failed.value.message
    assert not engine.alive()


def test_an_adapter_that_fails_to_load_at_start_stops_the_engine(
    tmp_path: Path, record: Path, engines: list[VllmEngine]
) -> None:
    broken = make_adapter(tmp_path, "broken", 16)
    (broken / "adapter_model.safetensors").unlink()
    engine = base_engine(tmp_path, vllm_settings(tmp_path), **{"ft:broken": broken})
    engines.append(engine)  # stopped after the test whatever happens
    with pytest.raises(EngineFailed, match="No adapter found for"):
        engine.start()
    pid = engine.pid
    assert pid is not None
    assert not pid_alive(pid)  # not left holding the GPU for a deployment that failed


def test_an_engine_that_never_answers_health_fails_after_the_timeout(
    tmp_path: Path, record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_HANG", "1")
    engine = base_engine(tmp_path, vllm_settings(tmp_path, start=1.0, load=1.0))
    with pytest.raises(EngineFailed, match=r"(?s)did not answer /health in 2 s: .*never done"):
        engine.start()
    pid = engine.pid
    assert pid is not None
    assert not engine.alive()
    assert not pid_alive(pid)  # stopped, not left holding a GPU


def test_a_running_engine_is_adopted_by_pid_and_port_and_stopped(
    tmp_path: Path, record: Path, engines: list[VllmEngine]
) -> None:
    settings = vllm_settings(tmp_path)
    engine = base_engine(tmp_path, settings)
    engines.append(engine)
    engine.start()
    # What a restarted hoster knows of a deployment: its id, work dir, name, port and pid.
    spec = EngineSpec("dep-vllm", tmp_path / "dep-vllm", pinned=BASE, port=engine.port)
    adopted = deployment_engines(settings)(spec, engine.pid)
    assert isinstance(adopted, VllmEngine)
    assert adopted.alive()
    assert adopted.healthy()
    assert adopted.base_url == engine.base_url
    # Stopped by its starter here (an adopted engine's parent has died, so it is reaped by
    # init; this test's own child would linger as a zombie until the test waits for it).
    pid = engine.pid
    assert pid is not None
    engine.stop()
    assert not pid_alive(pid)
    assert not adopted.alive()
    assert not adopted.healthy()


def test_deployments_run_vllm_when_the_setting_says_so(tmp_path: Path) -> None:
    lora_spec = EngineSpec(
        "dep-1", tmp_path / "dep-1", pinned="ft:x", base_name=BASE, base_dir=tmp_path
    )
    whole_spec = EngineSpec("dep-2", tmp_path / "dep-2", pinned="ft:SmolLM2-135M-Instruct:s:j")
    cpu = deployment_engines(HosterSettings())
    assert isinstance(cpu(lora_spec, None), LoraEngine)
    assert isinstance(cpu(whole_spec, None), TransformersServe)

    vllm = deployment_engines(vllm_settings(tmp_path))
    assert isinstance(vllm(lora_spec, None), VllmEngine)
    whole = vllm(whole_spec, None)
    assert isinstance(whole, VllmEngine)
    # A full fine-tune: its model directory (linked under the ft: name) on its own, no LoRA,
    # sized as the catalogue model of its shape.
    make_base(tmp_path / "pulled")
    whole.models_dir.mkdir(parents=True)
    (whole.models_dir / "ft:SmolLM2-135M-Instruct:s:j").symlink_to(tmp_path / "pulled" / "base")
    argv = whole.argv()
    assert argv[argv.index("serve") + 1] == str(tmp_path / "pulled" / "base")
    assert argv[argv.index("--served-model-name") + 1] == "ft:SmolLM2-135M-Instruct:s:j"
    assert "--enable-lora" not in argv
    with pytest.raises(BadRequest, match="without LoRA"):
        whole.check_adapter("ft:a", make_adapter(tmp_path, "a", 8))


def test_a_model_the_table_cannot_size_fails_with_its_reason(tmp_path: Path) -> None:
    spec = EngineSpec("dep-3", tmp_path / "dep-3", pinned="ft:other")
    other = tmp_path / "dep-3" / "models" / "ft:other"
    other.mkdir(parents=True)
    (other / "config.json").write_text(json.dumps({"num_hidden_layers": 80, "hidden_size": 8192}))
    with pytest.raises(EngineFailed, match="no catalogue model has the shape"):
        VllmEngine(spec, vllm_settings(tmp_path)).start()


def test_vllm_needs_a_gpu_class() -> None:
    with pytest.raises(
        ValidationError, match="TUNELOOP_HOSTER_VLLM_GPU: 'nvidia-t4' must be one of"
    ):
        HosterSettings(engine="vllm", vllm_gpu="nvidia-t4")
    with pytest.raises(ValidationError, match="TUNELOOP_HOSTER_VLLM_COMMAND"):
        HosterSettings(engine="vllm", vllm_gpu=GPU, vllm_command="  ")
