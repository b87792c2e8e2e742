"""The hoster's own settings (env prefix TUNELOOP_HOSTER_): how it runs inference engines."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.hoster.vllm_profiles import GPU_MEMORY_MIB
from shared.settings import ANY_ADDRESS


class HosterSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TUNELOOP_HOSTER_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # A deployment's engine that dies is started again (and announced at its new address),
    # checked every watch_interval_s; crash_limit deaths within crash_window_s fail it instead.
    watch_interval_s: float = Field(default=5.0, gt=0)
    crash_limit: int = Field(default=3, ge=1)
    crash_window_s: float = Field(default=600.0, gt=0)
    # A deployment no call reached for this long is unloaded (its adapter, and its engine once
    # nothing else is on it) and goes `cold` until it is woken; pinned ones stay. 0: never.
    idle_unload_s: float = Field(default=1800.0, ge=0)
    # Every live deployment and served name is published again this often, well inside the
    # deployments stream's retention, so a gateway started later still routes them (announce.py).
    announce_interval_s: float = Field(default=21_600.0, gt=0)
    # The share of a served name's calls a new auto-deployed version gets as its canary.
    canary_percent: float = Field(default=10.0, gt=0, le=100)
    # Torch threads per engine (OMP_NUM_THREADS): on 2 cores the eval engine and the trainer
    # each get one by plan instead of fighting over both.
    engine_threads: int = Field(default=1, ge=1)
    # A CPU engine runs each batch on the cores other processes leave, from engine_threads up
    # to all: one beside a training run, every core once it has ended (shared/cpu_share.py).
    engine_share_cores: bool = True
    # The engine's KV cache in 256-token blocks and its largest batch: left to itself on CPU,
    # continuous batching sizes its cache from the machine's RAM (~13 GB of 23 seen here).
    # 64 blocks hold 16k tokens (~0.75 GB for SmolLM2-135M in fp32): 8 requests of 2k tokens.
    engine_cache_blocks: int = Field(default=64, ge=1)
    engine_max_batch_tokens: int = Field(default=2048, ge=64)
    # Requests one LoRA-engine batch holds: an eval point's items and a demo comparison's
    # requests decode together (a padded batch of 16-32 on CPU; docs/hoster.md).
    engine_max_batch: int = Field(default=32, ge=1)
    # Engines listen on loopback; a multi-machine set-up binds them where the gateway and the
    # evaluator can reach them (0.0.0.0 or the host's address) and names that in engine_host.
    engine_bind_host: str = "127.0.0.1"
    # The host put in an engine's base URL; empty: the bind address (or 127.0.0.1 for 0.0.0.0).
    engine_host: str = ""
    # Until the engine's HTTP server answers (imports + server start; the model loads later).
    engine_start_timeout_s: float = Field(default=180.0, gt=0)
    # The first request to a model loads it and sets up continuous batching (~40-50 s on 2
    # busy cores for SmolLM2-135M); warm-ups and checkpoint loads wait this long.
    engine_load_timeout_s: float = Field(default=600.0, gt=0)
    # An eval engine unloads a checkpoint idle this long (`transformers serve --model-timeout`),
    # so a job's earlier checkpoints do not pile up in memory.
    eval_model_idle_s: int = Field(default=60, ge=1)
    # Engines' working directories, merged weights and logs; empty: <data dir>/hoster.
    work_dir: Path | None = None
    # What serves deployments: "cpu" (the LoRA engine; `transformers serve` for a full
    # fine-tune) or "vllm" on a GPU (vllm_engine.py; docs/hoster.md, "GPU: vLLM").
    engine: Literal["cpu", "vllm"] = "cpu"
    # vLLM's executable, split as a shell would: its own venv's `vllm` (its torch is not ours)
    # or a container's (`docker run ... --entrypoint vllm vllm/vllm-openai:<tag>`).
    vllm_command: str = "vllm"
    # The GPU class vLLM's settings are sized for (vllm_profiles.GPU_MEMORY_MIB); engine=vllm
    # needs it.
    vllm_gpu: str = ""

    @model_validator(mode="after")
    def _vllm_needs_a_gpu_class(self) -> HosterSettings:
        if self.engine == "vllm" and self.vllm_gpu not in GPU_MEMORY_MIB:
            raise ValueError(
                f"TUNELOOP_HOSTER_VLLM_GPU: {self.vllm_gpu!r} must be one of "
                f"{', '.join(GPU_MEMORY_MIB)} when TUNELOOP_HOSTER_ENGINE is vllm"
            )
        if self.engine == "vllm" and not shlex.split(self.vllm_command):
            raise ValueError("TUNELOOP_HOSTER_VLLM_COMMAND: empty; name vLLM's executable")
        return self

    def root(self, data_dir: Path) -> Path:
        return (self.work_dir or data_dir / "hoster").resolve()

    @property
    def advertised_host(self) -> str:
        if self.engine_host:
            return self.engine_host
        return "127.0.0.1" if self.engine_bind_host in ANY_ADDRESS else self.engine_bind_host
