"""The SkyPilot provider against a fake `sky` (tests/fakes/sky): the task it launches, how each
SkyPilot status reads as ours, cancel, logs, and a scheduler without SkyPilot installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.scheduler import skypilot_provider as sp
from services.scheduler.ladder import ProviderSpec, SkyPilotOptions
from services.scheduler.providers import Handle, LaunchSpec, Status
from tests.fakes import sky as fake_sky
from tests.fakes.sky import ManagedJobStatus as Sky

WEBHOOK_SECRET = "whsec-never-printed"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def _controller() -> Iterator[None]:
    fake_sky.controller.reset()
    yield
    fake_sky.controller.reset()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _provider(
    clock: FakeClock | None = None,
    *,
    device: str = "nvidia-h100",
    device_count: int = 2,
    **options: Any,
) -> sp.SkyPilotProvider:
    spec = ProviderSpec(
        name="sky-h100",
        kind="skypilot",
        device=device,
        device_count=device_count,
        skypilot=SkyPilotOptions(**options),
    )
    clock = clock or FakeClock()
    return sp.SkyPilotProvider(spec, sky=fake_sky, clock=clock, sleep=clock.sleep)


def _spec(tmp_path: Path, **changes: Any) -> LaunchSpec:
    fields: dict[str, Any] = {
        "job_id": "ftjob-1",
        "attempt_id": "attempt-0a1b2c3d4e5f",
        "tenant": "acme",
        "config": {"job_id": "ftjob-1", "webhook": {"url": "https://x", "secret": WEBHOOK_SECRET}},
        "work_dir": tmp_path / "attempt",
        "env": {"OMP_NUM_THREADS": "8"},
        "device": "nvidia-h100",
        "device_count": 2,
    }
    return LaunchSpec(**{**fields, **changes})


def _launched() -> fake_sky.Task:
    (call,) = fake_sky.controller.calls_of("launch")
    task: fake_sky.Task = call["task"]
    return task


# --- the task ----------------------------------------------------------------------------------


def test_submit_launches_one_managed_job_named_for_the_attempt(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    handle = _provider().submit(spec)

    assert handle == Handle("sky-h100", "1", str(spec.work_dir))
    (call,) = fake_sky.controller.calls_of("launch")
    assert call["name"] == "tuneloop-attempt-0a1b2c3d4e5f"
    assert call["task"].name == "tuneloop-attempt-0a1b2c3d4e5f"


def test_older_skypilot_launch_results_give_the_same_handle(tmp_path: Path) -> None:
    fake_sky.controller.launch_returns_list = False  # (job_id, handle), not ([job_id], handle)
    assert _provider().submit(_spec(tmp_path)).ref == "1"


def test_the_config_travels_as_a_secret_and_nowhere_else(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    _provider(setup="pip install -e .").submit(spec)
    task = _launched()

    assert task.secrets == {sp.CONFIG_SECRET: json.dumps(spec.config)}
    assert task.envs == {"OMP_NUM_THREADS": "8"}
    for printed in (json.dumps(task.envs), task.run, task.setup):
        assert WEBHOOK_SECRET not in str(printed)
    # What SkyPilot shows (`sky jobs queue`, the dashboard, its logs) has the secret redacted.
    assert WEBHOOK_SECRET not in str(task.to_yaml_config(use_user_specified_yaml=True))


def test_resources_follow_the_rung(tmp_path: Path) -> None:
    _provider(infra="aws", use_spot=True, image_id="docker:ghcr.io/acme/tuneloop:1").submit(
        _spec(tmp_path)
    )
    resources = _launched().resources
    assert resources is not None
    assert resources.accelerators == "H100:2"
    assert (resources.infra, resources.use_spot) == ("aws", True)
    assert resources.image_id == "docker:ghcr.io/acme/tuneloop:1"
    # SkyPilot recovers preemptions only; a failing trainer is the scheduler's to retry.
    assert resources.job_recovery == {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 0}


def test_given_accelerators_setup_and_workdir_are_passed_through(tmp_path: Path) -> None:
    _provider(
        accelerators="A100-80GB:8", setup="uv sync", workdir=str(tmp_path), use_spot=False
    ).submit(_spec(tmp_path))
    task = _launched()
    assert task.resources is not None
    assert (task.resources.accelerators, task.resources.use_spot) == ("A100-80GB:8", False)
    assert (task.setup, task.workdir) == ("uv sync", str(tmp_path))


@pytest.mark.parametrize(
    ("device", "count", "expected"),
    [
        ("cpu", 1, None),
        ("nvidia-h100", 1, "H100:1"),
        ("nvidia-a100-80gb", 8, "A100-80GB:8"),
        ("nvidia-l4", 1, "L4:1"),
        ("nvidia-a10g", 4, "A10G:4"),
    ],
)
def test_accelerators_from_the_device_class(device: str, count: int, expected: str | None) -> None:
    assert sp.accelerators_for(device, count) == expected


def test_a_device_class_without_a_skypilot_name_is_refused_at_start() -> None:
    with pytest.raises(sp.SkyPilotConfigError, match=r"skypilot\.accelerators"):
        _provider(device="gpu-24g")
    assert _provider(device="gpu-24g", accelerators="L4:1").name == "sky-h100"


def test_a_rung_of_another_kind_is_refused() -> None:
    spec = ProviderSpec(name="local", kind="local")
    with pytest.raises(sp.SkyPilotConfigError, match="not skypilot"):
        sp.SkyPilotProvider(spec, sky=fake_sky)


# --- the run command ---------------------------------------------------------------------------


def test_without_a_checkpoint_the_trainer_resumes_from_latest(tmp_path: Path) -> None:
    run = sp.run_command(_spec(tmp_path))
    # The first run finds no checkpoint under the attempt's prefix and starts at step 0; a run
    # SkyPilot recovered after a preemption finds the ones the attempt committed.
    assert "python -m services.trainer run --config .tuneloop/job.json --resume-from latest" in run
    assert run.count("--resume-from") == 1


CHECKPOINT = "s3://tuneloop/tenants/acme/jobs/ftjob-1/attempt-1/checkpoints/step-00000040"


def test_a_given_checkpoint_and_its_fallbacks_come_after_the_attempts_own(tmp_path: Path) -> None:
    # The first run has nothing of its own and takes the given checkpoint (or, when that fails
    # its check, the older ones); a run SkyPilot recovered keeps the attempt's own progress.
    older = CHECKPOINT.replace("step-00000040", "step-00000030")
    spec = _spec(tmp_path, resume_from=CHECKPOINT, resume_fallbacks=(older,))
    argv = sp.trainer_argv(spec)
    assert argv[-6:] == [
        "--resume-from", "latest",
        "--resume-fallback", CHECKPOINT,
        "--resume-fallback", older,
    ]  # fmt: skip
    assert argv.count("--resume-from") == 1
    assert f"--resume-from latest --resume-fallback {CHECKPOINT} --resume-fallback" in (
        sp.run_command(spec)
    )
    assert sp.trainer_argv(_spec(tmp_path))[-2:] == ["--resume-from", "latest"]


def test_a_max_runtime_stops_the_trainer_with_sigterm_first(tmp_path: Path) -> None:
    run = sp.run_command(_spec(tmp_path, max_runtime_s=3599.5))
    assert "timeout --signal=TERM --kill-after=300 3600 python -m services.trainer run" in run


def test_the_run_command_writes_a_private_config_and_reports_the_exit_code(tmp_path: Path) -> None:
    """The run command in bash, with a stand-in trainer that reports what it found."""
    trainer = (
        "import json, os, stat, sys\n"
        "args = sys.argv[1:]\n"
        "path = args[args.index('--config') + 1]\n"
        "print('mode', oct(stat.S_IMODE(os.stat(path).st_mode)))\n"
        f"print('secret in env', {sp.CONFIG_SECRET!r} in os.environ)\n"
        "print('config', json.load(open(path))['webhook']['secret'])\n"
        "sys.exit(4)\n"
    )
    spec = _spec(tmp_path, command=(sys.executable, "-c", trainer))
    env = {**os.environ, sp.CONFIG_SECRET: json.dumps(spec.config)}
    done = subprocess.run(
        ["bash", "-c", sp.run_command(spec)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )

    assert done.returncode == 4, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["mode 0o600", "secret in env False", f"config {WEBHOOK_SECRET}"]
    assert lines[-1] == f"{sp.EXIT_MARKER}4"


# --- poll --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "state", "returncode"),
    [
        (Sky.PENDING, "pending", None),
        (Sky.DEPRECATED_SUBMITTED, "pending", None),
        (Sky.STARTING, "pending", None),
        (Sky.RUNNING, "running", None),
        (Sky.WINDING_DOWN, "running", None),
        (Sky.RECOVERING, "pending", None),
        (Sky.CANCELLING, "running", None),
        (Sky.SUCCEEDED, "exited", 0),
        (Sky.CANCELLED, "exited", 143),
        (Sky.FAILED, "exited", 1),
        (Sky.FAILED_SETUP, "exited", 1),
        (Sky.FAILED_PRECHECKS, "exited", 1),
        (Sky.FAILED_NO_RESOURCE, "exited", 1),
        (Sky.FAILED_CONTROLLER, "exited", 1),
    ],
)
def test_every_skypilot_status_maps_to_ours(
    tmp_path: Path, status: Sky, state: str, returncode: int | None
) -> None:
    provider = _provider()
    handle = provider.submit(_spec(tmp_path))
    fake_sky.controller.set_status(1, status)

    polled = provider.poll(handle)
    assert (polled.state, polled.returncode) == (state, returncode)
    if status.name.startswith("FAILED"):
        assert status.value in polled.reason


def test_recovering_is_pending_and_says_why(tmp_path: Path) -> None:
    provider = _provider()
    handle = provider.submit(_spec(tmp_path))
    fake_sky.controller.set_status(1, Sky.RECOVERING, recovery_count=2)

    status = provider.poll(handle)
    assert status.state == "pending"
    assert "recovering" in status.reason
    assert "recovery 2" in status.reason


def test_a_failed_job_carries_the_trainers_exit_code_from_its_log(tmp_path: Path) -> None:
    provider = _provider()
    handle = provider.submit(_spec(tmp_path))
    log = "step 40 loss nan\nerror (nan_loss): the loss is NaN\n" + f"{sp.EXIT_MARKER}4\n"
    fake_sky.controller.set_status(1, Sky.FAILED, failure_reason="The user job failed.", log=log)

    assert provider.poll(handle) == Status("exited", 4, "SkyPilot FAILED: The user job failed.")


def test_an_unknown_status_keeps_the_attempt_alive(tmp_path: Path) -> None:
    provider = _provider()
    handle = provider.submit(_spec(tmp_path))
    fake_sky.controller.jobs[1].status = "PAUSED"  # type: ignore[assignment]

    status = provider.poll(handle)
    assert status.state == "pending"
    assert "PAUSED" in status.reason


def test_a_job_skypilot_does_not_know_is_lost(tmp_path: Path) -> None:
    status = _provider().poll(Handle("sky-h100", "41", str(tmp_path)))
    assert status.state == "lost"
    assert "41" in status.reason


def test_poll_asks_for_the_one_job_whoever_launched_it(tmp_path: Path) -> None:
    provider = _provider()
    handle = provider.submit(_spec(tmp_path))
    provider.poll(handle)
    (call,) = fake_sky.controller.calls_of("queue")
    assert call == {"refresh": False, "skip_finished": False, "all_users": True, "job_ids": [1]}


def test_a_queue_answered_as_a_tuple_reads_the_same(tmp_path: Path) -> None:
    fake_sky.controller.queue_returns_tuple = True
    provider = _provider()
    handle = provider.submit(_spec(tmp_path))
    fake_sky.controller.set_status(1, Sky.RUNNING)
    assert provider.poll(handle).state == "running"


# --- cancel and logs ---------------------------------------------------------------------------


def test_cancel_asks_skypilot_and_waits_for_the_end(tmp_path: Path, clock: FakeClock) -> None:
    provider = _provider(clock)
    handle = provider.submit(_spec(tmp_path))
    fake_sky.controller.set_status(1, Sky.RUNNING)

    status = provider.cancel(handle, grace_s=30)
    assert fake_sky.controller.calls_of("cancel") == [{"name": None, "job_ids": [1], "all": False}]
    assert status == Status("exited", 143, "cancelled in SkyPilot")
    assert clock.now == sp.CANCEL_POLL_S


def test_cancel_stops_waiting_after_the_grace(tmp_path: Path, clock: FakeClock) -> None:
    fake_sky.controller.cancel_polls = 100
    provider = _provider(clock)
    handle = provider.submit(_spec(tmp_path))
    fake_sky.controller.set_status(1, Sky.RUNNING)

    status = provider.cancel(handle, grace_s=12)
    assert (status.state, status.reason) == ("running", "SkyPilot is cancelling the job")
    assert clock.now == 12


def test_cancelling_an_ended_job_reports_how_it_ended(tmp_path: Path, clock: FakeClock) -> None:
    provider = _provider(clock)
    handle = provider.submit(_spec(tmp_path))
    fake_sky.controller.set_status(1, Sky.SUCCEEDED)

    assert provider.cancel(handle, grace_s=30) == Status("exited", 0)
    assert clock.now == 0


def test_logs_are_the_tail_of_the_jobs_log(tmp_path: Path) -> None:
    provider = _provider()
    handle = provider.submit(_spec(tmp_path))
    lines = [f"{i:04d} " + "x" * 95 for i in range(1000)]  # 100-byte lines with the newline
    fake_sky.controller.set_status(1, Sky.RUNNING, log="\n".join(lines) + "\n")

    text = provider.logs(handle, tail_bytes=250)
    assert len(text.encode()) == 250
    assert text.endswith(lines[-1] + "\n")
    (call,) = fake_sky.controller.calls_of("tail_logs")
    assert call == {"job_id": 1, "follow": False, "tail": 250 // sp.MIN_LINE_BYTES + 1}


def test_logs_of_a_job_skypilot_cannot_show_say_so(tmp_path: Path) -> None:
    text = _provider().logs(Handle("sky-h100", "41", str(tmp_path)))
    assert "unavailable" in text
    assert "41" in text


# --- SkyPilot itself ---------------------------------------------------------------------------


def _rung() -> ProviderSpec:
    return ProviderSpec(name="sky-l4", kind="skypilot", device="nvidia-l4")


def test_without_skypilot_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sky", None)  # `import sky` raises ImportError
    with pytest.raises(sp.SkyPilotUnavailable, match=r"pip install 'skypilot\["):
        sp.SkyPilotProvider(_rung())


def test_the_sky_module_is_imported_when_a_provider_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "sky", fake_sky)
    handle = sp.SkyPilotProvider(_rung()).submit(_spec(tmp_path, device="nvidia-l4"))
    assert handle.ref == "1"
    assert _launched().resources.accelerators == "L4:2"  # type: ignore[union-attr]


def test_a_skypilot_without_task_secrets_is_refused() -> None:
    def old_task(name: str | None = None, *, run: str | None = None, envs: Any = None) -> Any:
        raise AssertionError("never called")

    old_sky = types.SimpleNamespace(
        Task=old_task, Resources=fake_sky.Resources, jobs=fake_sky.jobs, get=fake_sky.get
    )
    with pytest.raises(sp.SkyPilotUnavailable, match="secrets"):
        sp.SkyPilotProvider(_rung(), sky=old_sky)
