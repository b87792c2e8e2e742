"""Inference engines as subprocesses: `transformers serve --continuous-batching` on CPU, behind an
`Engine` Protocol that a vLLM adapter implements later.

An engine serves the model directories in its working directory, each under the name a client
sends: `transformers serve` resolves a request's `model` as a local path first, so a directory
named `ft:SmolLM2-135M-Instruct:sfx:ftjob-x` (colons are valid in POSIX names) is what answers to
that name. No proxy rewrites model names. Blocking calls; the service runs them in threads.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from services.hoster.config import HosterSettings
from services.hoster.errors import EngineFailed
from shared.processes import pid_alive

LOG_TAIL_CHARS = 2000
PID_FILE = "engine.pid"
WARM_UP_PROMPT = [{"role": "user", "content": "Hi"}]


class Engine(Protocol):
    """What the hoster needs of an inference engine speaking the OpenAI API."""

    engine_id: str
    port: int
    base_url: str  # the OpenAI base URL, ending in /v1

    @property
    def pid(self) -> int | None: ...

    @property
    def models_dir(self) -> Path:
        """Where a model directory goes to be served under its directory name."""
        ...

    def start(self) -> None: ...

    def alive(self) -> bool: ...

    def healthy(self) -> bool: ...

    def warm_up(self, model: str) -> None:
        """Return once the engine has answered one request naming `model` (it is loaded)."""
        ...

    def stop(self) -> None: ...


@dataclass
class EngineSpec:
    """What an engine serves: any model in its directory, or one model it preloads (`pinned`)."""

    engine_id: str
    work_dir: Path
    pinned: str | None = None
    port: int | None = None


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class TransformersServe:
    """One `transformers serve --continuous-batching` process (CPU; streams; OpenAI API)."""

    def __init__(self, spec: EngineSpec, settings: HosterSettings, pid: int | None = None) -> None:
        self.spec, self.settings = spec, settings
        self.engine_id = spec.engine_id
        self.port = spec.port or free_port(settings.engine_bind_host)
        self.base_url = f"http://{settings.advertised_host}:{self.port}/v1"
        self._process: subprocess.Popen[bytes] | None = None
        self._adopted_pid = pid  # a process a previous hoster started

    @property
    def models_dir(self) -> Path:
        return self.spec.work_dir / "models"

    @property
    def log_path(self) -> Path:
        return self.spec.work_dir / "engine.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else self._adopted_pid

    def argv(self) -> list[str]:
        settings = self.settings
        argv = [sys.executable, "-m", "transformers.cli.transformers", "serve"]
        argv += ["--continuous-batching", "--host", settings.engine_bind_host]
        argv += ["--port", str(self.port), "--log-level", "warning"]
        argv += ["--cb-num-blocks", str(settings.engine_cache_blocks)]
        argv += ["--cb-max-batch-tokens", str(settings.engine_max_batch_tokens)]
        if self.spec.pinned is None:
            argv += ["--model-timeout", str(settings.eval_model_idle_s)]
        else:
            argv.append(self.spec.pinned)  # preloaded; resolved in models_dir (the cwd)
        return argv

    def env(self) -> dict[str, str]:
        threads = str(self.settings.engine_threads)
        return os.environ | {
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",  # no hub here: a name that is no local directory fails fast
        }

    def start(self) -> None:
        self.models_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.argv(),
                cwd=self.models_dir,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # stopped as a group, never by the hoster's signals
            )
        self._adopted_pid = None
        # Who to stop if this hoster dies without stopping it (see `stop_leftovers`).
        (self.spec.work_dir / PID_FILE).write_text(str(self._process.pid))
        # A pinned engine loads its model before it serves, so it waits as long as a load.
        timeout = self.settings.engine_start_timeout_s
        if self.spec.pinned is not None:
            timeout += self.settings.engine_load_timeout_s
        self._wait_ready(timeout)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise EngineFailed(f"engine {self.engine_id} exited at start-up: {self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.5)
        self.stop()
        raise EngineFailed(
            f"engine {self.engine_id} did not answer /health in {timeout_s:.0f} s: {self.log_tail()}"
        )

    def healthy(self) -> bool:
        try:
            response = httpx.get(f"{self.base_url.removesuffix('/v1')}/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def alive(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        return self._adopted_pid is not None and pid_alive(self._adopted_pid)

    def warm_up(self, model: str) -> None:
        body = {"model": model, "messages": WARM_UP_PROMPT, "max_tokens": 1, "temperature": 0}
        try:
            response = httpx.post(
                f"{self.base_url}/chat/completions",
                json=body,
                timeout=self.settings.engine_load_timeout_s,
            )
        except httpx.HTTPError as exc:
            raise EngineFailed(
                f"engine {self.engine_id} did not answer for {model!r}: {exc!r}; {self.log_tail()}"
            ) from None
        if response.status_code != 200:
            raise EngineFailed(
                f"engine {self.engine_id} answered {response.status_code} for {model!r}: "
                f"{response.text[:500]}"
            )

    def stop(self) -> None:
        pid = self.pid
        if pid is None or not self.alive():
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if not _wait_gone(self, 10.0):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            _wait_gone(self, 10.0)

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text("utf-8", "replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return "(no log)"


def _wait_gone(engine: TransformersServe, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine._process is not None:
            try:
                engine._process.wait(0.2)
                return True
            except subprocess.TimeoutExpired:
                continue
        if not engine.alive():
            return True
        time.sleep(0.2)
    return False


def is_engine_process(pid: int) -> bool:
    """Whether pid runs `transformers serve` (a pid from a file may have been reused since)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"transformers" in cmdline and b"serve" in cmdline


def stop_leftovers(root: Path) -> list[int]:
    """Stop the engines whose work dirs under root hold a pid file of a live engine process: eval
    engines a hoster killed without its shutdown left behind. Returns the pids stopped."""
    stopped = []
    for pid_file in sorted(root.glob(f"*/{PID_FILE}")):
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if pid_alive(pid) and is_engine_process(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
                stopped.append(pid)
            except ProcessLookupError:
                pass
        pid_file.unlink(missing_ok=True)
    return stopped
