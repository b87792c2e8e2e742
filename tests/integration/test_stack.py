"""`make up` / `make status` / `make down` (the `tuneloop` CLI) on an isolated data dir and free ports."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from shared.settings import Settings
from tests.plugins.infra import make_settings, settings_env

COMPONENTS = ("nats", "s3", "ingest", "scheduler", "evaluator", "hoster", "teacher")


def tuneloop(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(settings), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "shared.dev.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=settings.app.data_dir,
    )


def recorded_pids(settings: Settings) -> list[int]:
    run_dir = settings.app.data_dir / "run"
    return (
        [int(json.loads(p.read_text())["pid"]) for p in run_dir.glob("*.pid")]
        if run_dir.exists()
        else []
    )


@pytest.mark.slow
def test_up_status_down_leaves_nothing_behind(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    try:
        up = tuneloop(settings, "up")
        assert up.returncode == 0, up.stdout + up.stderr
        status = tuneloop(settings, "status")
        assert status.returncode == 0, status.stdout
        for name in COMPONENTS:
            line = next(line for line in status.stdout.splitlines() if f" {name} " in line)
            assert " up " in line, status.stdout
        assert f"http://127.0.0.1:{settings.services.ingest_port}" in status.stdout
        pids = recorded_pids(settings)
        assert len(pids) == len(COMPONENTS)
        children = [
            child.pid for pid in pids for child in psutil.Process(pid).children(recursive=True)
        ]

        again = tuneloop(settings, "up")  # idempotent: nothing new started
        assert again.returncode == 0, again.stderr
        assert sorted(recorded_pids(settings)) == sorted(pids)
    finally:
        down = tuneloop(settings, "down")
    assert down.returncode == 0, down.stderr
    assert all(
        not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        for pid in pids + children
    )
    after = tuneloop(settings, "status")
    assert after.returncode == 3
    assert after.stdout.count(" down ") == len(COMPONENTS)


def test_up_refuses_to_half_start_when_a_port_is_taken(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", settings.services.hoster_port))
        squatter.listen()
        up = tuneloop(settings, "up")
    assert up.returncode == 1
    message = " ".join(up.stderr.split())
    assert f"port {settings.services.hoster_port} needed by hoster is already in use" in message
    assert "TUNELOOP_HOSTER_PORT" in message
    assert recorded_pids(settings) == []
    assert tuneloop(settings, "status").stdout.count(" down ") == len(COMPONENTS)


def test_bad_setting_is_one_clear_line(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    env = {**os.environ, **settings_env(settings), "TUNELOOP_NATS_PORT": "not-a-port"}
    result = subprocess.run(
        [sys.executable, "-m", "shared.dev.cli", "status"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "TUNELOOP_NATS_PORT" in result.stderr
    assert "not-a-port" in result.stderr
