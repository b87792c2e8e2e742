"""The local provider runs real detached processes: exit codes, cancel with grace, lost ones."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from dataclasses import replace
from pathlib import Path

from services.scheduler.providers import Handle, LaunchSpec, LocalProvider, Status

PY = sys.executable
# Exits 0 on SIGTERM after "checkpointing" (a line in its log), as the trainer does.
POLITE = (
    "import signal, sys, time\n"
    "def stop(*_):\n"
    "    print('checkpoint saved', flush=True); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('training', flush=True)\n"
    "time.sleep(60)\n"
)
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"


def wait_for(provider: LocalProvider, handle: Handle, timeout_s: float = 20.0) -> Status:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = provider.poll(handle)
        if status.state != "running":
            return status
        time.sleep(0.1)
    raise AssertionError(f"still running after {timeout_s}s")


def wait_for_log(provider: LocalProvider, handle: Handle, text: str) -> None:
    deadline = time.monotonic() + 20
    while text not in provider.logs(handle):
        assert time.monotonic() < deadline, provider.logs(handle)
        time.sleep(0.05)


def _spec(tmp_path: Path, script: str) -> LaunchSpec:
    """An attempt whose "trainer" is `script` (it gets the trainer's arguments and ignores them)."""
    return LaunchSpec(
        job_id="ftjob-1",
        attempt_id="attempt-1",
        tenant="acme",
        config={"secret": "s"},
        work_dir=tmp_path,
        command=(PY, "-c", script),
    )


def test_an_exit_code_is_recorded(tmp_path: Path) -> None:
    provider = LocalProvider()
    handle = provider.submit(_spec(tmp_path, "print('boom'); raise SystemExit(3)"))
    status = wait_for(provider, handle)
    assert status == Status("exited", 3, "exited with status 3")
    assert "boom" in provider.logs(handle)


def test_cancel_lets_the_trainer_checkpoint_and_exit(tmp_path: Path) -> None:
    provider = LocalProvider()
    handle = provider.submit(_spec(tmp_path, POLITE))
    wait_for_log(provider, handle, "training")
    assert provider.poll(handle).state == "running"
    status = provider.cancel(handle, grace_s=10)
    assert status == Status("exited", 0, "exited normally")
    assert "checkpoint saved" in provider.logs(handle)


def test_cancel_kills_a_trainer_that_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    provider = LocalProvider()
    handle = provider.submit(_spec(tmp_path, STUBBORN))
    time.sleep(0.5)
    status = provider.cancel(handle, grace_s=1)
    assert status == Status("exited", -signal.SIGKILL, "killed by SIGKILL")


def test_a_killed_launcher_is_lost_and_a_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    provider = LocalProvider()
    handle = provider.submit(_spec(tmp_path, POLITE))
    wait_for_log(provider, handle, "training")
    pid = int(handle.ref.partition(":")[0])
    impostor = Handle("local", f"{os.getpid()}:0.0", str(tmp_path / "other"))
    assert provider.poll(impostor).state == "lost"
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    assert wait_for(provider, handle).state == "lost"


def test_the_trainer_gets_its_config_as_a_private_file_and_the_checkpoint_to_resume(
    tmp_path: Path,
) -> None:
    provider = LocalProvider()
    spec = LaunchSpec(
        job_id="ftjob-1",
        attempt_id="attempt-2",
        tenant="acme",
        config={"job_id": "ftjob-1", "webhook": {"secret": "s3cr3t"}},
        work_dir=tmp_path,
        resume_from="s3://bucket/ckpt/step-40",
        resume_fallbacks=("s3://bucket/ckpt/step-30", "s3://bucket/ckpt/step-20"),
        env={"OMP_NUM_THREADS": "1"},
        command=(PY, "-c", "import os, sys; print(sys.argv[1:], os.environ['OMP_NUM_THREADS'])"),
    )
    handle = provider.submit(spec)
    assert wait_for(provider, handle).returncode == 0
    config = tmp_path / "job.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert json.loads(config.read_text())["webhook"]["secret"] == "s3cr3t"
    expected = ["--config", str(config), "--resume-from", "s3://bucket/ckpt/step-40"]
    expected += ["--resume-fallback", "s3://bucket/ckpt/step-30"]
    expected += ["--resume-fallback", "s3://bucket/ckpt/step-20"]
    assert f"{expected} 1" in provider.logs(handle)
    # Fallbacks are tried after a resume_from only: without one, the trainer starts fresh.
    fresh = replace(spec, resume_from=None).trainer_argv("job.json")
    assert "--resume-fallback" not in fresh
