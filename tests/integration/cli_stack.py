"""The running stack the `tuneloop` tests drive (tests/integration/test_cli.py): ingest, the
scheduler, the evaluator and the hoster as processes on the session's SeaweedFS and a nats-server
of their own, a tenant's key, the CLI's environment; and the helpers to run the CLI in this
process (typer's runner) or as a process whose output is read as it comes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import openai
from typer.testing import CliRunner, Result

from services.hoster.engines import stop_leftovers
from shared.dev import localstack
from shared.dev.cli import app
from shared.settings import Settings
from tests.plugins.infra import RunningProcess, make_settings, settings_env
from tests.plugins.waiting import until
from tests.services.hoster.process import prepare

LABEL = "billing"
_WORDS = ("invoice", "refund", "card", "plan", "receipt", "charge", "tax", "discount")
BAD_ROLE_LINE = 5  # a message whose role is not one of OpenAI's
NOT_JSON_LINE = 12


@dataclass
class Stack:
    tmp: Path
    client: openai.OpenAI  # the tenant's, to check what the commands did
    env: dict[str, str]  # a `tuneloop` process's: the settings, the base URL and key
    nats_url: str
    processes: dict[str, RunningProcess] = field(default_factory=dict)


@contextmanager
def running(tmp: Path, stack_settings: Settings, model_dir: Path) -> Iterator[Stack]:
    """The four services as processes in `tmp` on a nats-server of their own and the session's
    S3; on the way out, stopped, and their logs checked for errors."""
    prepared = prepare(tmp, stack_settings, model_dir)
    settings = prepared.settings
    # A nats-server of its own (as the retrain loop's test says why): services stopped with
    # events in flight would leave them to the next test's processes of the same names.
    own_nats = make_settings(tmp / "nats")
    env = settings_env(settings) | {
        "TUNELOOP_SCHEDULER_POLL_INTERVAL_S": "0.5",
        "TUNELOOP_SCHEDULER_TRAINER_THREADS": "1",
        "TUNELOOP_HOSTER_ENGINE_LOAD_TIMEOUT_S": "240",
        "TUNELOOP_HOSTER_WATCH_INTERVAL_S": "0.5",
    }  # fmt: skip
    env |= {k: v for k, v in settings_env(own_nats).items() if k.startswith("TUNELOOP_NATS_")}
    processes = [RunningProcess(localstack.component(own_nats, "nats"), tmp / "logs" / "nats.log")]
    processes[0].start()
    try:
        for name in ("ingest", "hoster", "evaluator", "scheduler"):
            process = RunningProcess(
                localstack.component(settings, name), tmp / "logs" / f"{name}.log", env=env
            )
            process.start(timeout_s=90)
            processes.append(process)
        url = f"http://127.0.0.1:{settings.services.ingest_port}/v1"
        cli_env = env | {
            "TUNELOOP_BASE_URL": url,
            "TUNELOOP_API_KEY": prepared.key,
            "COLUMNS": "250",  # tables wide enough that ids are never folded
            "PYTHONUNBUFFERED": "1",
        }
        client = openai.OpenAI(base_url=url, api_key=prepared.key, max_retries=0)
        named = {p.component.name: p for p in processes}
        yield Stack(tmp, client, cli_env, own_nats.nats.url, named)
    finally:
        for process in reversed(processes):
            process.stop()
        stop_leftovers(tmp / "hoster" / "deployments")  # deployments outlive the hoster
    errors = [
        line
        for process in processes
        for line in process.log().splitlines()
        if '"level":"ERROR"' in line and '.faststream"' not in line
    ]
    assert not errors, errors


def tuneloop(stack: Stack, *args: str, input: str | None = None) -> Result:
    """The command in this process (typer's runner), with the stack's environment."""
    return CliRunner().invoke(app, list(args), env=stack.env, input=input)


# `python -m shared.dev.cli` with Ctrl-C raising KeyboardInterrupt, as at a terminal. A process
# started in the background by a non-interactive shell (`make test &`, some CI runners) ignores
# SIGINT, its children inherit that, and Python then leaves SIGINT ignored: the test's Ctrl-C
# would do nothing.
_AS_AT_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('shared.dev.cli', run_name='__main__', alter_sys=True)"
)


class Running:
    """`python -m shared.dev.cli ...` as a process (Ctrl-C as at a terminal), its output read as
    it comes."""

    def __init__(self, stack: Stack, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _AS_AT_A_TERMINAL, *args],
            env=os.environ | stack.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        for stream, lines in (
            (self.process.stdout, self.stdout),
            (self.process.stderr, self.stderr),
        ):
            threading.Thread(target=lambda s=stream, ls=lines: ls.extend(s), daemon=True).start()

    def wait_for(self, pattern: str, *, stderr: bool = False, timeout_s: float = 180) -> str:
        lines = self.stderr if stderr else self.stdout
        return until(
            f"{pattern!r} in the output",
            lambda: next((line for line in list(lines) if re.search(pattern, line)), None),
            timeout_s,
            alive=lambda: self.process.poll() is None,
        )

    def finish(self, timeout_s: float = 60) -> int:
        code = self.process.wait(timeout_s)
        time.sleep(0.2)  # the reader threads take the last lines
        return code

    def text(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)


def training_lines() -> list[str]:
    """16 tickets answered with one word, and two lines ingest must reject."""
    lines = []
    for n in range(16):
        question = f"Ticket {n}: a question about my {_WORDS[n % 8]} and {_WORDS[n // 8 % 8]}."
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": LABEL}]
        lines.append(json.dumps({"messages": messages}))
    bad = {
        "messages": [{"role": "robot", "content": "beep"}, {"role": "assistant", "content": "x"}]
    }
    lines.insert(BAD_ROLE_LINE - 1, json.dumps(bad))
    lines.insert(NOT_JSON_LINE - 1, '{"messages": [')
    return lines
