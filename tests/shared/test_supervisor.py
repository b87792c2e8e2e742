"""The local stack's supervisor (`tuneloop up|down`) on a stand-in component: what its processes
inherit. The real stack: tests/integration/test_stack.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shared.dev import localstack, supervisor
from tests.plugins.infra import make_settings

# Writes what it sees (whole, then renamed: readiness is the file's existence), then waits to be
# stopped as a stack component would.
_PROBE = """
import os, sys, time
with open(sys.argv[1] + ".tmp", "w") as out:
    out.write(repr(os.environ.get("TUNELOOP_ENV")))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


def test_components_run_in_the_environment_of_the_settings_they_were_started_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unset in the caller, a service would start as production and refuse the local stack's
    # development secrets.
    monkeypatch.delenv("TUNELOOP_ENV", raising=False)
    settings = make_settings(tmp_path, app={"env": "development"})
    seen = tmp_path / "seen"
    probe = localstack.Component(
        name="probe",
        argv=[sys.executable, "-c", _PROBE, str(seen)],
        ports=[],
        address="-",
        ready=seen.exists,
        stop_timeout_s=5,
    )
    monkeypatch.setattr(localstack, "stack_components", lambda _settings: [probe])

    supervisor.up(settings)
    try:
        assert seen.read_text() == "'development'"
    finally:
        assert supervisor.down(settings) == ["probe"]
