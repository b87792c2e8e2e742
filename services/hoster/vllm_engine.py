"""vLLM as an `Engine` on a GPU: `vllm serve` of a base with LoRA enabled, run from its own
environment or image (its torch is not ours; `TUNELOOP_HOSTER_VLLM_COMMAND`), its settings from
the per-GPU table (vllm_profiles.py), adapters added and removed at runtime over its API
(`POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter`, which vLLM serves only with
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). An adapter of a higher rank than the engine's
`max_lora_rank` is refused before the call, naming the field.

Same shape as `LoraEngine`: the spec's base (answering to `base_name`) with `models` loaded at
start, `load_model` / `unload_model` by name; a spec without a base serves the whole model
linked in `models_dir` under its pinned name, without LoRA. Blocking calls, as in engines.py.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from services.hoster.config import HosterSettings
from services.hoster.engines import Engine, EngineProcess, EngineSpec, make_engine
from services.hoster.errors import BadRequest, Conflict, EngineFailed, HosterError
from services.hoster.vllm_profiles import ModelDoesNotFit, VllmProfile, vllm_profile
from shared.catalogue import CATALOGUE, CatalogueEntry

ADAPTER_CONFIG = "adapter_config.json"
# vLLM's answer when the runtime LoRA routes are off: FastAPI's own 404, not vLLM's error JSON.
NO_ROUTE_HINT = (
    "vLLM serves no runtime LoRA routes: VLLM_ALLOW_RUNTIME_LORA_UPDATING did not reach it "
    "(a container needs `-e VLLM_ALLOW_RUNTIME_LORA_UPDATING`)"
)


class VllmEngine(EngineProcess):
    """One `vllm serve` process: a base and the LoRA adapters loaded onto it at runtime."""

    def __init__(self, spec: EngineSpec, settings: HosterSettings, pid: int | None = None) -> None:
        super().__init__(spec, settings, pid=pid)
        self._profile: VllmProfile | None = None

    @property
    def serves_adapters(self) -> bool:
        return self.spec.base_dir is not None

    @property
    def profile(self) -> VllmProfile:
        """The settings table's row for the served model on TUNELOOP_HOSTER_VLLM_GPU."""
        if self._profile is None:
            try:
                self._profile = vllm_profile(self._catalogue_entry(), self.settings.vllm_gpu)
            except ModelDoesNotFit as exc:
                raise EngineFailed(f"engine {self.engine_id}: {exc}") from None
            except KeyError:
                raise EngineFailed(
                    f"engine {self.engine_id}: TUNELOOP_HOSTER_VLLM_GPU "
                    f"{self.settings.vllm_gpu!r} is no GPU class of the vLLM settings table"
                ) from None
        return self._profile

    def argv(self) -> list[str]:
        model_dir, name = self._served()
        profile, settings = self.profile, self.settings
        argv = [*shlex.split(settings.vllm_command), "serve", str(model_dir)]
        argv += ["--served-model-name", name]
        argv += ["--host", settings.engine_bind_host, "--port", str(self.port)]
        if self.serves_adapters:
            argv += ["--enable-lora", "--max-loras", str(profile.max_loras)]
            argv += ["--max-lora-rank", str(profile.max_lora_rank)]
        argv += ["--max-model-len", str(profile.max_model_len)]
        argv += ["--gpu-memory-utilization", str(profile.gpu_memory_utilization)]
        argv += ["--max-num-seqs", str(profile.max_num_seqs)]
        return argv

    def env(self) -> dict[str, str]:
        return super().env() | {
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # the load/unload routes
            "VLLM_NO_USAGE_STATS": "1",  # nothing leaves the machine
        }

    @property
    def load_timeout_s(self) -> float:
        # vLLM listens only once the weights are loaded, the KV cache sized and CUDA graphs taken.
        return self.settings.engine_load_timeout_s

    def start(self) -> None:
        """Start vLLM and load the spec's adapters; every adapter's rank is checked before a
        process takes the GPU, and an adapter that fails to load stops the engine."""
        for name, path in self.spec.models.items():
            self.check_adapter(name, path)
        super().start()
        try:
            for name, path in self.spec.models.items():
                self.load_model(name, path)
        except HosterError:
            self.stop()
            raise

    def check_adapter(self, name: str, path: Path) -> None:
        """BadRequest naming the field when vLLM would refuse the adapter: its rank (`r`, or the
        highest of `rank_pattern`) above the engine's max_lora_rank, or no adapter at all."""
        if not self.serves_adapters:
            raise BadRequest(
                f"name: engine {self.engine_id} serves the whole model {self.spec.pinned!r} "
                f"without LoRA; it loads no adapter such as {name!r}"
            )
        rank, limit = adapter_rank(name, path), self.profile.max_lora_rank
        if rank > limit:
            raise BadRequest(
                f"{ADAPTER_CONFIG} r: {rank} for {name!r} exceeds the engine's max_lora_rank "
                f"{limit} ({self.profile.model} on {self.profile.device}); train at rank "
                f"<= {limit} or serve it on a larger GPU class",
                rank=rank,
                max_lora_rank=limit,
            )

    def load_model(self, name: str, path: Path) -> None:
        """Serve the LoRA adapter at path under name. Loading the same adapter again is a no-op;
        another adapter under a name already served is a Conflict."""
        self.check_adapter(name, path)
        response = self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        if response.status_code == 200:
            return
        kind, message = vllm_error(response)
        if response.status_code == 400 and "already been loaded" in message:
            if self.adapters().get(name) == str(path):
                return
            raise Conflict(
                f"name: {name!r} already serves another adapter on engine {self.engine_id}"
            )
        raise self._failed("load_lora_adapter", name, response.status_code, kind, message)

    def unload_model(self, name: str) -> None:
        """Stop serving the adapter; one that is not loaded is already what was asked for."""
        response = self._post("/v1/unload_lora_adapter", {"lora_name": name})
        kind, message = vllm_error(response) if response.status_code != 200 else ("", "")
        if response.status_code == 200 or (response.status_code == 404 and kind == "NotFoundError"):
            return
        raise self._failed("unload_lora_adapter", name, response.status_code, kind, message)

    def adapters(self) -> dict[str, str]:
        """The adapters vLLM lists in /v1/models (a `parent` set) and their paths (`root`)."""
        try:
            response = httpx.get(f"{self.base_url}/models", timeout=10.0)
            cards: list[dict[str, Any]] = response.json()["data"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise EngineFailed(f"engine {self.engine_id}: GET /v1/models: {exc!r}") from None
        return {card["id"]: card.get("root") or "" for card in cards if card.get("parent")}

    def _post(self, path: str, body: dict[str, str]) -> httpx.Response:
        url = f"{self.base_url.removesuffix('/v1')}{path}"
        try:
            return httpx.post(url, json=body, timeout=self.settings.engine_load_timeout_s)
        except httpx.HTTPError as exc:
            raise EngineFailed(
                f"engine {self.engine_id}: POST {path}: {exc!r}; {self.log_tail()}"
            ) from None

    def _failed(self, route: str, name: str, status: int, kind: str, message: str) -> EngineFailed:
        if status == 404 and not kind:
            message = NO_ROUTE_HINT
        answer = f"{status} {kind}" if kind else str(status)
        return EngineFailed(
            f"engine {self.engine_id}: {route} {name!r} answered {answer}: {message}"
        )

    def _served(self) -> tuple[Path, str]:
        """The model directory vLLM serves and the name it answers to."""
        spec = self.spec
        if spec.base_dir is not None and spec.base_name is not None:
            return spec.base_dir, spec.base_name
        if spec.base_dir is None and spec.pinned is not None:
            return (self.models_dir / spec.pinned).resolve(), spec.pinned
        raise ValueError(
            f"engine {self.engine_id}: a VllmEngine needs base_dir and base_name, or a pinned "
            "model in its models_dir"
        )

    def _catalogue_entry(self) -> CatalogueEntry:
        """The catalogue model the settings are sized for: the base by name, else the catalogue
        entry of the model's shape (a full fine-tune keeps its base's)."""
        model_dir, name = self._served()
        base = CATALOGUE.get(self.spec.base_name or name)
        if base is not None:
            return base
        try:
            config = json.loads((model_dir / "config.json").read_text("utf-8"))
        except (OSError, ValueError):
            config = {}
        shape = tuple(
            config.get(k) for k in ("num_hidden_layers", "hidden_size", "intermediate_size")
        )
        for entry in CATALOGUE.values():
            if (entry.layers, entry.hidden_size, entry.intermediate_size) == shape:
                return entry
        raise EngineFailed(
            f"engine {self.engine_id}: no catalogue model has the shape of {model_dir} (layers, "
            f"hidden, intermediate = {shape}), so the vLLM settings table cannot size it"
        )


def adapter_rank(name: str, path: Path) -> int:
    """The highest LoRA rank in the adapter's adapter_config.json (`r`, `rank_pattern`)."""
    config_path = path / ADAPTER_CONFIG
    try:
        config = json.loads(config_path.read_text("utf-8"))
    except FileNotFoundError:
        raise BadRequest(
            f"name: {name!r} at {path} has no {ADAPTER_CONFIG}; vLLM loads LoRA adapters onto "
            "its base, not whole models"
        ) from None
    except (OSError, ValueError) as exc:
        raise BadRequest(f"{ADAPTER_CONFIG}: {config_path} is unreadable: {exc}") from None
    pattern = config.get("rank_pattern") or {}
    ranks = [config.get("r"), *(pattern.values() if isinstance(pattern, dict) else [None])]
    if not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in ranks):
        raise BadRequest(f"{ADAPTER_CONFIG} r: {ranks} for {name!r} are not all positive integers")
    return max(int(r) for r in ranks)


def vllm_error(response: httpx.Response) -> tuple[str, str]:
    """vLLM's error type and message: `{"error": {"message", "type", "code"}}` (newer) or the
    same fields at the top level (older, `"object": "error"`); FastAPI's `{"detail"}` gives no
    type (a route vLLM does not serve)."""
    try:
        body = response.json()
    except ValueError:
        return "", response.text[:500]
    error = body.get("error", body) if isinstance(body, dict) else {}
    if isinstance(error, dict) and "message" in error:
        return str(error.get("type") or ""), str(error["message"])[:500]
    return "", str(body.get("detail", body) if isinstance(body, dict) else body)[:500]


def deployment_engines(settings: HosterSettings) -> Callable[[EngineSpec, int | None], Engine]:
    """What runs a deployment: vLLM with TUNELOOP_HOSTER_ENGINE=vllm, else the CPU engines
    (`make_engine`). pid: a running engine a previous hoster started, to adopt."""

    def serve(spec: EngineSpec, pid: int | None = None) -> Engine:
        if settings.engine == "vllm":
            return VllmEngine(spec, settings, pid=pid)
        return make_engine(spec, settings, pid=pid)

    return serve
