"""Helpers for the trainer runtime's tests: tiny job configs, a real signed-webhook receiver, and
the trainer CLI as a child process."""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from shared.reports import TrainerReport, parse_report
from shared.signing import MemoryNonceStore, SignatureError, verify
from tests.services.trainer.synthetic_chats import make_samples, write_snapshot

REPO_ROOT = Path(__file__).resolve().parents[3]
WEBHOOK_SECRET = "whsec-test-3f9a2c"


@pytest.fixture
def isolated_logging() -> Iterator[None]:
    """The CLI's `main` installs a root log handler on the test's captured stderr: put the
    previous handlers back, so later tests never log into a closed capture stream."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def tiny_snapshot(directory: Path, count: int = 24, seed: int = 0) -> Path:
    return write_snapshot(directory, make_samples(count, seed=seed))


def tiny_job(
    model_dir: Path | str,
    dataset: Path | str,
    output_prefix: Path | str,
    **sections: Any,
) -> dict[str, Any]:
    """A job document for the tiny model: small rows, a few steps, LoRA with dropout."""
    document: dict[str, Any] = {
        "job_id": "job-1",
        "tenant": "acme",
        "base_model": str(model_dir),
        "dataset": str(dataset),
        "method": "lora",
        "lora": {"rank": 4, "alpha": 8, "dropout": 0.1},
        "hyperparameters": {
            "epochs": 1,
            "micro_batch_size": 2,
            "gradient_accumulation_steps": 2,
            "max_seq_len": 384,
            "learning_rate": 3e-3,
            "warmup_steps": 1,
            "seed": 7,
        },
        "checkpoints": {"every_n_steps": 2, "keep_last": 2},
        "output": {"prefix": str(output_prefix)},
    }
    for name, values in sections.items():
        if isinstance(values, dict) and isinstance(document.get(name), dict):
            document[name] = {**document[name], **values}
        else:
            document[name] = values
    return copy.deepcopy(document)


def write_job(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document))
    return path


@dataclass
class WebhookReceiver:
    """A real HTTP endpoint that verifies each signature (timestamp, nonce, HMAC) like the
    scheduler does, answers 401 to a bad or replayed one, and keeps the reports it accepted."""

    secret: str = WEBHOOK_SECRET
    reports: list[TrainerReport] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    url: str = ""

    def kinds(self) -> list[str]:
        return [report.kind for report in self.reports]

    def of_kind(self, kind: str) -> list[Any]:
        return [report for report in self.reports if report.kind == kind]


@contextmanager
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    nonces = MemoryNonceStore()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                verify(dict(self.headers.items()), body, receiver.secret, nonce_store=nonces)
                report = parse_report(body)
            except (SignatureError, ValueError) as exc:
                with lock:
                    receiver.refused.append(f"{type(exc).__name__}: {exc}")
                self.send_response(401)
                self.end_headers()
                return
            with lock:
                receiver.reports.append(report)
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/webhooks/trainer"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


def webhook_section(receiver: WebhookReceiver) -> dict[str, Any]:
    return {"url": receiver.url, "secret": receiver.secret, "timeout_s": 2.0}


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a trainer child process: offline, one thread per process."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO_ROOT),
    }
    return {**env, **(extra or {})}


def start_trainer(
    args: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`python -m services.trainer ...` in its own process group, output into log_path."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "services.trainer", *args],
            cwd=REPO_ROOT,
            env=child_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def flip_bytes(path: Path) -> None:
    """Damage a file as a bad disk or a torn upload does: the same size, other bytes."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    path.write_bytes(bytes(data))


def final_history(artifact_dir: Path) -> list[float]:
    """The per-step losses the final artifact's trainer_state.json records."""
    state = json.loads((artifact_dir / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["history"]]
