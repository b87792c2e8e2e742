"""Engine bookkeeping without a model: the command line an engine runs, its environment, the
leftovers a killed hoster leaves, and which checkpoint URIs a tenant may name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.hoster.artifacts import check_uri
from services.hoster.config import HosterSettings
from services.hoster.engines import (
    PID_FILE,
    EngineSpec,
    LoraEngine,
    TransformersServe,
    make_engine,
    stop_leftovers,
)
from services.hoster.errors import BadRequest
from shared.processes import pid_alive


def test_an_eval_engine_serves_its_directory_with_bounded_cache_and_threads(tmp_path: Path) -> None:
    settings = HosterSettings(engine_threads=1, engine_bind_host="127.0.0.1", eval_model_idle_s=30)
    engine = TransformersServe(EngineSpec("eng-1", tmp_path / "eng-1"), settings)
    argv = engine.argv()
    assert argv[1:4] == ["-m", "transformers.cli.transformers", "serve"]
    assert "--continuous-batching" in argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == str(engine.port)
    assert argv[argv.index("--model-timeout") + 1] == "30"
    assert argv[argv.index("--cb-num-blocks") + 1] == "64"
    assert engine.env()["OMP_NUM_THREADS"] == "1"
    assert engine.base_url == f"http://127.0.0.1:{engine.port}/v1"
    assert engine.models_dir == tmp_path / "eng-1" / "models"


def test_a_deployment_engine_pins_its_served_name(tmp_path: Path) -> None:
    settings = HosterSettings(engine_bind_host="0.0.0.0", engine_threads=2)  # noqa: S104
    name = "ft:SmolLM2-135M-Instruct:sfx:ftjob-x"
    engine = TransformersServe(EngineSpec("dep-1", tmp_path, pinned=name, port=5555), settings)
    argv = engine.argv()
    assert argv[-1] == name
    assert "--model-timeout" not in argv
    assert engine.env()["OMP_NUM_THREADS"] == "2"
    assert engine.base_url == "http://127.0.0.1:5555/v1"  # reachable, not the wildcard


def test_a_lora_engine_loads_its_base_and_checkpoints_at_start(tmp_path: Path) -> None:
    settings = HosterSettings(engine_threads=1, engine_max_batch=12)
    name = "ft:SmolLM2-135M-Instruct:sfx:ftjob-x"
    spec = EngineSpec(
        "dep-2", tmp_path, base_name="SmolLM2-135M-Instruct", base_dir=tmp_path / "base",
        models={name: tmp_path / "ckpt"},
    )  # fmt: skip
    engine = make_engine(spec, settings)
    assert isinstance(engine, LoraEngine)
    argv = engine.argv()
    assert argv[1:3] == ["-m", "services.hoster.lora_engine"]
    assert argv[argv.index("--base") + 1] == str(tmp_path / "base")
    assert argv[argv.index("--base-name") + 1] == "SmolLM2-135M-Instruct"
    assert argv[argv.index("--model") + 1] == f"{name}={tmp_path / 'ckpt'}"
    assert argv[argv.index("--threads") + 1] == "1"
    assert "--share-cores" in argv  # one thread beside a trainer, every core after it
    assert argv[argv.index("--max-batch") + 1] == "12"
    assert engine.load_timeout_s == settings.engine_load_timeout_s  # the base loads first
    assert isinstance(
        make_engine(EngineSpec("dep-3", tmp_path, pinned=name), settings), TransformersServe
    )


def test_engines_a_killed_hoster_left_are_stopped_at_start_up(tmp_path: Path) -> None:
    # Stands in for `transformers serve` by its command line (what stop_leftovers checks).
    code = "import time; time.sleep(60)"
    left = subprocess.Popen(
        [sys.executable, "-c", code, "transformers", "serve"], start_new_session=True
    )
    other = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        for name, proc in (("eng-a", left), ("eng-b", other)):
            (tmp_path / name).mkdir()
            (tmp_path / name / PID_FILE).write_text(str(proc.pid))
        assert stop_leftovers(tmp_path) == [left.pid]
        left.wait(10)
        assert pid_alive(other.pid)  # a reused pid of another program is left alone
        assert not list(tmp_path.glob(f"*/{PID_FILE}"))
    finally:
        for proc in (left, other):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "uri",
    [
        "s3://tuneloop/tenants/globex/jobs/j/checkpoints/step-00000010",
        "s3://other/tenants/acme/jobs/j/checkpoints/step-00000010",
        "s3://tuneloop/tenants/acme/../globex/x",
        "/etc/passwd",
    ],
)
def test_a_checkpoint_outside_the_tenants_storage_is_refused(uri: str) -> None:
    with pytest.raises(BadRequest, match=r"uri: .* not under this tenant's storage"):
        check_uri(uri, tenant="acme", bucket="tuneloop")


def test_a_checkpoint_of_the_tenant_is_accepted() -> None:
    uri = "s3://tuneloop/tenants/acme/jobs/j/checkpoints/step-00000010/"
    assert check_uri(uri, tenant="acme", bucket="tuneloop") == uri.rstrip("/")
