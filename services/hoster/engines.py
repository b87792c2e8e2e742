"""Inference engines as subprocesses behind an `Engine` Protocol (vllm_engine.py implements it
on GPU). Two on CPU:

- `LoraEngine` (services/hoster/lora_engine.py): one base in memory, LoRA checkpoints loaded onto
  it by name (`load_model`), swapped in well under a second. Eval engines, catalogue bases and the
  engine a tenant's LoRA versions of one base share run it.
- `TransformersServe`: `transformers serve --continuous-batching`, for a full fine-tune's model
  directory. It serves the model directories in its working directory, each under the name a
  client sends (it resolves a request's `model` as a local path first, so a directory named
  `ft:SmolLM2-135M-Instruct:sfx:ftjob-x` answers to that name; colons are valid in POSIX names).

No proxy rewrites model names. Blocking calls; the service runs them in threads.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from services.hoster.config import HosterSettings
from services.hoster.errors import BadRequest, EngineFailed
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

    def load_model(self, name: str, path: Path) -> None:
        """Serve the checkpoint at path under name on the running engine (no base reload)."""
        ...

    def unload_model(self, name: str) -> None: ...

    def idle_seconds(self) -> dict[str, float] | None:
        """Seconds since each served name's last call ended (0 while one runs); None when the
        engine cannot say (it is then never unloaded for being idle)."""
        ...

    def stop(self) -> None: ...

    def log_tail(self) -> str:
        """The end of its log, to say why it failed."""
        ...


@dataclass
class EngineSpec:
    """What an engine serves. With `base_dir`: a `LoraEngine` of that base (answering to
    `base_name` unless `serve_base` is off) that loads `models` (name -> directory) at start.
    Without: `transformers serve` of any model in its directory, answering to `pinned` alone
    when it is set."""

    engine_id: str
    work_dir: Path
    pinned: str | None = None
    port: int | None = None
    base_name: str | None = None
    base_dir: Path | None = None
    models: dict[str, Path] = field(default_factory=dict)
    # Off for deployments' shared engines: they answer the names loaded on them only.
    serve_base: bool = True


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EngineProcess:
    """An engine subprocess speaking the OpenAI API: start, health, warm-up, stop."""

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
        raise NotImplementedError

    @property
    def load_timeout_s(self) -> float:
        """How long start waits beyond the server's start for models loaded before it listens."""
        return 0.0

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
                cwd=self.models_dir,  # where transformers serve resolves model names
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # stopped as a group, never by the hoster's signals
            )
        self._adopted_pid = None
        # Who to stop if this hoster dies without stopping it (see `stop_leftovers`).
        (self.spec.work_dir / PID_FILE).write_text(str(self._process.pid))
        self._wait_ready(self.settings.engine_start_timeout_s + self.load_timeout_s)

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

    def load_model(self, name: str, path: Path) -> None:
        raise BadRequest(f"engine {self.engine_id} loads no models at runtime ({name!r})")

    def unload_model(self, name: str) -> None:
        raise BadRequest(f"engine {self.engine_id} unloads no models at runtime ({name!r})")

    def idle_seconds(self) -> dict[str, float] | None:
        return None

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


class TransformersServe(EngineProcess):
    """One `transformers serve --continuous-batching` process (CPU; streams; OpenAI API)."""

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

    @property
    def load_timeout_s(self) -> float:
        # A pinned engine loads its model before it serves, so it waits as long as a load.
        return self.settings.engine_load_timeout_s if self.spec.pinned is not None else 0.0


class LoraEngine(EngineProcess):
    """One `services.hoster.lora_engine` process: a base and the checkpoints loaded onto it."""

    def argv(self) -> list[str]:
        settings, spec = self.settings, self.spec
        if spec.base_dir is None or spec.base_name is None:
            raise ValueError(f"engine {self.engine_id}: a LoraEngine needs base_dir and base_name")
        argv = [sys.executable, "-m", "services.hoster.lora_engine"]
        argv += ["--base", str(spec.base_dir), "--base-name", spec.base_name]
        argv += ["--host", settings.engine_bind_host, "--port", str(self.port)]
        argv += ["--threads", str(settings.engine_threads)]
        if settings.engine_share_cores:
            argv.append("--share-cores")
        argv += ["--max-batch", str(settings.engine_max_batch)]
        for name, path in spec.models.items():
            argv += ["--model", f"{name}={path}"]
        if not spec.serve_base:
            argv.append("--hide-base")
        return argv

    @property
    def load_timeout_s(self) -> float:
        return self.settings.engine_load_timeout_s  # the base loads before the server listens

    def load_model(self, name: str, path: Path) -> None:
        """Serve the checkpoint at path (a LoRA adapter or a whole model) under name."""
        self._internal("POST", "/models", {"name": name, "path": str(path)})

    def unload_model(self, name: str) -> None:
        self._internal("DELETE", f"/models/{name}", None)

    def idle_seconds(self) -> dict[str, float] | None:
        """From the engine's `/stats` (its own clock, so no skew between processes)."""
        response = self._internal("GET", "/stats", None, timeout_s=10.0)
        try:
            models: dict[str, Any] = response.json()["models"]
            return {name: float(stats["idle_s"]) for name, stats in models.items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineFailed(f"engine {self.engine_id}: GET /stats: {exc!r}") from None

    def _internal(
        self, method: str, path: str, body: dict[str, str] | None, timeout_s: float | None = None
    ) -> httpx.Response:
        url = f"{self.base_url.removesuffix('/v1')}{path}"
        timeout = timeout_s or self.settings.engine_load_timeout_s
        try:
            response = httpx.request(method, url, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            raise EngineFailed(f"engine {self.engine_id}: {method} {path}: {exc!r}") from None
        gone = method == "DELETE" and response.status_code == 404  # what was asked for
        if response.status_code >= 300 and not gone:
            raise EngineFailed(
                f"engine {self.engine_id}: {method} {path} answered {response.status_code}: "
                f"{response.text[:500]}"
            )
        return response


def make_engine(spec: EngineSpec, settings: HosterSettings, pid: int | None = None) -> Engine:
    """The engine a spec asks for: a LoraEngine for a base and its checkpoints, else
    `transformers serve`. pid: a running engine a previous hoster started, to adopt."""
    if spec.base_dir is not None:
        return LoraEngine(spec, settings, pid=pid)
    return TransformersServe(spec, settings, pid=pid)


def _wait_gone(engine: EngineProcess, timeout_s: float) -> bool:
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
    """Whether pid runs one of our engines (a pid from a file may have been reused since)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    lora = b"services.hoster.lora_engine" in cmdline
    return lora or (b"transformers" in cmdline and b"serve" in cmdline)


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
