"""Settings of the ingest service (env prefix TUNELOOP_INGEST_)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.processes import CpuClass
from shared.settings import ServiceUrl, Settings

# The services ingest calls (their URLs are settings below).
OtherService = Literal["scheduler", "evaluator", "hoster"]
_DEFAULT_UPSTREAMS = Path(__file__).resolve().parents[2] / "deploy" / "local" / "upstreams.yaml"


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity, e.g. a container's cpuset), not the host's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class IngestSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TUNELOOP_INGEST_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # Where the gateway sends each model (gateway/routing.py): the upstream providers, their model
    # patterns and the variables holding their keys.
    upstreams_file: Path = _DEFAULT_UPSTREAMS
    # The services the gateway relays the control plane to (gateway/forwarding.py: /v1/fine_tuning
    # to the scheduler, /v1/evals and /v1/shadow_scores to the evaluator, /v1/models,
    # /v1/deployments and /v1/served_names to the hoster), and the hoster it wakes cold deployments
    # through (gateway/wake.py); default: the local stack's (bind host, the service's port).
    scheduler_url: ServiceUrl | None = None
    evaluator_url: ServiceUrl | None = None
    hoster_url: ServiceUrl | None = None
    # Upstream calls: connect fast, but let long generations stream for as long as they take.
    upstream_connect_timeout_s: float = Field(default=10.0, gt=0)
    upstream_read_timeout_s: float = Field(default=600.0, gt=0)
    # How long a call to a cold deployment waits for the hoster to load it again (gateway/wake.py):
    # its engine's start and model load, as the hoster waits for them (180 + 600 s by default).
    wake_timeout_s: float = Field(default=900.0, gt=0)
    # Upstream calls holding a connection at once, over every provider; more wait for one.
    upstream_max_connections: int = Field(default=512, ge=1)
    # A pooled upstream connection idle this long is not reused. Below the 5 s after which
    # uvicorn (vLLM's server, so our own deployments) and Node close an idle connection: one
    # the server is closing as the next request goes out loses that request (a 502).
    upstream_idle_s: float = Field(default=4.0, gt=0)
    # Request bodies larger than this get 413 (images inline make 20 MB plausible).
    max_body_bytes: int = Field(default=32 * 1024**2, ge=1024)
    # Uploads to /v1/files larger than this get 413 (OpenAI's files API takes up to 512 MB).
    max_upload_bytes: int = Field(default=512 * 1024**2, ge=1024)
    # The spill file (capture.SpillFile: samples waiting for NATS or S3 to return) holds at most
    # this much; past it a sample is refused and counted (the call itself was answered). 1 GiB
    # is ~100,000 typical samples: minutes of a busy gateway's traffic, hours of most.
    spill_max_bytes: int = Field(default=1024**3, ge=1024)
    # inline: the ingest service also stores captured samples; process: it leaves that to
    # `python -m services.ingest.capture.persister` copies, which scale apart from the gateway (they
    # share one durable consumer): for a machine with cores to spare or a database far away.
    persister: Literal["inline", "process"] = "inline"
    # OTLP exports of otlp_process_min_bytes or more are decoded and mapped in a pool of this
    # many processes (otlp/workers.py), so they use every core and never hold the
    # gateway's event loop. Default: the CPUs this process may use, at most 4.
    otlp_processes: int = Field(default_factory=lambda: min(_usable_cpus(), 4), ge=1, le=64)
    otlp_process_min_bytes: int = Field(default=64 * 1024, ge=0)
    # Import the Cython-compiled copies of the hot OTLP and scrubbing modules that `make install`
    # builds (services/ingest/accel; each used only while its source is unchanged since the
    # build): 10-16 % fewer instructions a span, measured on one 2-core VM. Off by default: the
    # gain is small and machine-bound, and py-spy and cProfile cannot see into compiled code.
    # Read when the services.ingest package is imported, so its worker processes follow it too.
    accel: bool = False
    # The OTLP pool's CPU class (shared.processes). batch: a full share of the cores, but a pool
    # process that wakes does not preempt the one running, so the busy processes of a loaded
    # 2-core machine (the pool's, the service's, NATS) switch less: in bench-ingest ~3-4 % more
    # spans/s than normal, better in 16 of 20 paired comparisons (docs/ingest.md).
    otlp_cpu: CpuClass = "batch"
    # The shipper and persister processes run in this CPU class (shared.processes), so on a
    # machine they share with the gateway a call never waits for their batches: they catch up
    # when the cores are free, and until then the journal and the stream hold their work.
    background_cpu: CpuClass = "idle"
    # Uploaded files (uploads/files.py): the process working a file holds a lease on it this long
    # and renews it every third of it; a file whose lease ran out (its process died) is taken over
    # by the next sweep, which every process runs every half of it.
    upload_lease_s: float = Field(default=60.0, gt=0)
    # A file whose workers all stopped before finishing it (killed, out of memory) this many
    # times is marked `error` instead of being taken over again.
    upload_max_attempts: int = Field(default=3, ge=1)
    # How long a verified API key is trusted without asking the database again.
    auth_cache_ttl_s: float = Field(default=30.0, ge=0)
    # Dataset builds (datasets/workers.py). JetStream redelivers a build's event when its worker has
    # not said "still working" for this long (it says so every quarter of it), e.g. after a kill.
    dataset_ack_wait_s: float = Field(default=60.0, ge=2.0)
    # Deliveries of a build's event; a passing failure on the last fails the build.
    dataset_max_deliver: int = Field(default=10, ge=1)
    # A build interrupted by a passing failure (storage away) is retried after this long.
    dataset_retry_delay_s: float = Field(default=10.0, ge=0)
    # How long a build from files waits for their samples to reach the store before retrying.
    dataset_file_wait_s: float = Field(default=60.0, ge=0)

    def service_url(self, service: OtherService, settings: Settings) -> str:
        own = {
            "scheduler": self.scheduler_url,
            "evaluator": self.evaluator_url,
            "hoster": self.hoster_url,
        }[service]
        return own.rstrip("/") if own else settings.local_url(service)
