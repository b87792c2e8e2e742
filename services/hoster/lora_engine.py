"""The CPU engine for LoRA checkpoints: one base model in memory, adapters swapped onto it, OpenAI
chat completions generated in dynamic batches (services/hoster/batching.py).

Why a server of our own (docs/hoster.md has the measurements): `transformers serve` loads model
directories only, so a LoRA checkpoint has to be merged, saved and loaded as a new model, ~10 s a
swap on 2 cores; peft's `load_adapter` + `set_adapter` on one loaded base swaps in under 0.5 s.
The model code, the adapters and decoding are transformers' and peft's; what is ours is the thin
part: the HTTP shapes, the chat template (the checkpoint's own), batching, and a gate that lets
one model's requests run at a time (an adapter is active for a whole batch). A full fine-tune's
checkpoint is a model of its own here. On GPU, vLLM does all of this.

Decoding is greedy: a batch decodes as one, and the engine's callers (evals, the demo, CPU
deployments) ask at temperature 0. A request that asks to sample is refused with 400 naming the
field, never quietly answered greedily.

Run: `python -m services.hoster.lora_engine --base DIR --base-name ID [--model NAME=DIR ...]
[--hide-base]` (deployments' engine: it answers to the names loaded on it and not to the base).
Internal routes (the hoster's): `POST /models` {name, path}, `DELETE /models/{name}`, and
`GET /stats`: each served name's calls, those running and seconds since its last one ended
(the hoster unloads a deployment idle too long).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from services.hoster.batching import Batcher
from services.hoster.completions import Completion, complete, response_guide, stream
from services.hoster.engine_requests import EngineError, parse_request
from services.hoster.phase_gate import PhaseGate
from services.hoster.structured import Grammars
from shared.cpu_share import CoreShare

log = logging.getLogger("tuneloop.hoster.lora_engine")
ADAPTER_CONFIG = "adapter_config.json"


@dataclass
class Host:
    """A model in memory with its batcher. The base's host also carries the adapters loaded onto
    it (`peft` set on the first one)."""

    model: Any
    batcher: Batcher
    gate: PhaseGate
    peft: Any = None


@dataclass
class Served:
    name: str
    kind: Literal["base", "adapter", "full"]
    host: Host
    tokenizer: Any
    path: str
    created: int = field(default_factory=lambda: int(time.time()))
    # Calls made to it (warm-ups included), those running, and when the last one ended (or it
    # was loaded): what /stats tells the hoster, on this process's monotonic clock.
    requests: int = 0
    in_flight: int = 0
    last_used: float = field(default_factory=time.monotonic)
    grammars: Grammars | None = None  # its vocabulary's automata, once one is asked for

    def idle_s(self) -> float:
        return 0.0 if self.in_flight else time.monotonic() - self.last_used


class Engine:
    """The models this process serves, by the names clients send."""

    def __init__(
        self, *, base_dir: Path, base_name: str, max_batch: int, cores: CoreShare | None = None
    ) -> None:
        self.base_dir, self.base_name, self.max_batch = base_dir, base_name, max_batch
        self.cores = cores
        self.models: dict[str, Served] = {}
        # Deployments' engine: only the names loaded on it answer; the base (the ground the
        # adapters stand on, which no tenant deployed here) is not one of them.
        self.hide_base = False
        self._lock = asyncio.Lock()  # loads and unloads one at a time
        tokenizer = _tokenizer(base_dir)
        self.base = self._host(_load_model(base_dir), tokenizer, switch=self._switch_base)
        self.models[base_name] = Served(base_name, "base", self.base, tokenizer, str(base_dir))

    def _host(self, model: Any, tokenizer: Any, switch: Callable[[str], None]) -> Host:
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        batcher = Batcher(model, pad_id=pad, eos_id=eos, max_batch=self.max_batch, cores=self.cores)
        return Host(model, batcher, PhaseGate(switch))

    def _switch_base(self, name: str) -> None:
        """Activate name's adapter on the base (or none for the base itself); no request runs."""
        peft = self.base.peft
        if peft is None:
            return
        if name == self.base_name:
            peft.base_model.disable_adapter_layers()
        else:
            peft.base_model.enable_adapter_layers()
            peft.set_adapter(name)

    async def load(self, name: str, path: Path) -> Served:
        async with self._lock:
            known = self.models.get(name)
            if known is not None:
                if known.path != str(path):
                    raise EngineError(409, f"name: {name!r} already serves {known.path}", "name")
                return known
            # Adding LoRA layers changes the base's modules: not while a batch runs through them.
            async with self.base.gate.exclusive():
                served = await asyncio.to_thread(self._load, name, path)
            self.models[name] = served
            return served

    def _load(self, name: str, path: Path) -> Served:
        if not path.is_dir():
            raise EngineError(400, f"path: {path} is not a directory", "path")
        tokenizer = (
            _tokenizer(path) if _has_tokenizer(path) else self.models[self.base_name].tokenizer
        )
        if (path / ADAPTER_CONFIG).is_file():
            return Served(name, "adapter", self._add_adapter(name, path), tokenizer, str(path))
        if (path / "config.json").is_file():
            host = self._host(_load_model(path), tokenizer, switch=lambda _name: None)
            return Served(name, "full", host, tokenizer, str(path))
        raise EngineError(400, f"path: {path} holds neither an adapter nor a model", "path")

    def _add_adapter(self, name: str, path: Path) -> Host:
        """Load the adapter onto the base (the caller holds the base's gate exclusively); the
        adapter active before stays active."""
        from peft import PeftModel

        trained_on = json.loads((path / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
        if trained_on != self.base_name:
            raise EngineError(
                400, f"path: the adapter was trained on {trained_on!r}, this engine serves "
                f"{self.base_name!r}", "path",
            )  # fmt: skip
        base = self.base
        if base.peft is None:
            # The first adapter wraps the base: the LoRA layers go into the base's own modules,
            # so the batcher's `generate` on the base runs through them.
            base.peft = PeftModel.from_pretrained(base.model, path, adapter_name=name)
            base.peft.eval()
        else:
            base.peft.load_adapter(str(path), adapter_name=name)
        self._switch_base(base.gate.active or self.base_name)
        return base

    async def unload(self, name: str) -> None:
        async with self._lock:
            served = self.models.get(name)
            if served is None:
                raise EngineError(404, f"model {name!r} is not loaded", "name", "model_not_found")
            if served.kind == "base":
                raise EngineError(400, f"name: {name!r} is the engine's base model", "name")
            async with served.host.gate.exclusive():  # not while one of its requests runs
                del self.models[name]
                if served.kind == "adapter":
                    await asyncio.to_thread(self._delete_adapter, name)
                # a full model's host goes with its last reference

    def _delete_adapter(self, name: str) -> None:
        """Drop name's adapter (under the base's exclusive gate). If it was the active one, the
        base runs bare until a request names another adapter."""
        peft, gate = self.base.peft, self.base.gate
        peft.delete_adapter(name)
        if gate.active == name:
            gate.forget(name, self.base_name)
        self._switch_base(gate.active or self.base_name)

    def get(self, name: str) -> Served:
        served = self.models.get(name)
        if served is None or not self.answers(served):
            raise EngineError(
                404, f"The model `{name}` does not exist on this engine", "model", "model_not_found"
            )
        return served

    def answers(self, served: Served) -> bool:
        return not (self.hide_base and served.kind == "base")

    def served(self) -> list[Served]:
        """What clients may name, in load order."""
        return [served for served in self.models.values() if self.answers(served)]


def _tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer_config.json").is_file()


def _load_model(path: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


# --- HTTP ----------------------------------------------------------------------------------------


class ModelLoad(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=256)
    path: str = Field(min_length=1)


def build_app(engine: Engine) -> FastAPI:
    app = FastAPI(title="tuneloop LoRA engine", docs_url=None, redoc_url=None)

    @app.exception_handler(EngineError)
    async def _engine_error(_request: Request, exc: EngineError) -> JSONResponse:
        return exc.response()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [
            {
                "id": served.name,
                "object": "model",
                "created": served.created,
                "owned_by": "tuneloop",
                "parent": None if served.kind == "base" else engine.base_name,
            }
            for served in engine.served()
        ]
        return {"object": "list", "data": data}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        models = {
            served.name: {
                "requests": served.requests,
                "in_flight": served.in_flight,
                "idle_s": round(served.idle_s(), 3),
            }
            for served in engine.served()
        }
        return {"models": models}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            raise EngineError(400, "body: not JSON", "body") from None
        parsed = parse_request(body)
        served = engine.get(parsed.model)
        completion = Completion.of(served, parsed)
        completion.guide = await response_guide(served, parsed)
        if parsed.stream:
            include_usage = bool((parsed.stream_options or {}).get("include_usage"))
            events = stream(served, completion, include_usage=include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        return JSONResponse(await complete(served, completion))

    @app.post("/models")
    async def load(body: ModelLoad) -> dict[str, str]:
        served = await engine.load(body.name, Path(body.path))
        return {"name": served.name, "kind": served.kind}

    @app.delete("/models/{name:path}", status_code=204, response_class=Response)
    async def unload(name: str) -> Response:
        await engine.unload(name)
        return Response(status_code=204)

    return app


def main(argv: list[str] | None = None) -> None:
    import torch
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m services.hoster.lora_engine")
    parser.add_argument("--base", type=Path, required=True, help="the base model directory")
    parser.add_argument("--base-name", required=True, help="the name the base answers to")
    parser.add_argument("--model", action="append", default=[], help="NAME=DIR to load at start")
    parser.add_argument(
        "--hide-base", action="store_true", help="answer to the loaded models only, not the base"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--share-cores",
        action="store_true",
        help="before each batch, run on the cores other processes leave (from --threads up to "
        "all): one beside a training run, every core once it has ended",
    )
    parser.add_argument("--max-batch", type=int, default=32, help="requests a batch holds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    cores = psutil.cpu_count() or 1
    share = CoreShare(cores, cores, torch.set_num_threads, threads=args.threads)
    # Models load before the server listens: /health answering means every named model serves.
    engine = Engine(
        base_dir=args.base,
        base_name=args.base_name,
        max_batch=args.max_batch,
        cores=share if args.share_cores else None,
    )
    for spec in args.model:
        name, _, path = spec.partition("=")
        engine.models[name] = engine._load(name, Path(path))
    engine.hide_base = args.hide_base
    uvicorn.run(build_app(engine), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
