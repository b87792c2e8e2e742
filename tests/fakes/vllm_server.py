"""A fake `vllm` executable: `python tests/fakes/vllm_server.py serve <model> [flags]` answers over
HTTP with vLLM's routes, status codes and error bodies, without a GPU or vLLM installed.

As vLLM (read from vllm-project/vllm: entrypoints/openai models serving, the serve/lora router,
`create_error_response`, LoRAConfig, envs):
- the `serve` flags the hoster uses, with vLLM's defaults (--max-loras 1, --max-lora-rank 16);
  an unknown flag exits 2 (argparse), a --max-lora-rank outside vLLM's list or a model directory
  without config.json exits 1 before listening;
- nothing listens until the "model" is loaded; `GET /health` is then 200 with an empty body;
- `GET /v1/models`: the base (`root` its path, `parent` null) and each adapter (`root` its
  path, `parent` the base);
- `POST /v1/load_lora_adapter {lora_name, lora_path}` / `POST /v1/unload_lora_adapter
  {lora_name}` exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING 1/true (else FastAPI's 404
  `{"detail": "Not Found"}`); success is 200 with vLLM's plain-text sentence; errors are
  `{"error": {"message", "type", "param", "code"}}`: 400 InvalidUserInput for a missing field or
  a name already loaded, 404 NotFoundError for an adapter directory without adapter_config.json
  or weights ("No adapter found for ...") and for unloading an unknown name, 500 for a rank above
  --max-lora-rank (vLLM's ValueError from add_lora);
- `POST /v1/chat/completions`: 404 NotFoundError (`param: model`) for a model it does not serve;
  else a chat.completion whose text names the model asked for, so tests tell adapters apart.

For tests: FAKE_VLLM_RECORD names a file that gets `{"argv", "env"}` (the VLLM_*, HF_* and
CUDA_* variables) at start, and `<that file>.calls.jsonl` a line per adapter call;
FAKE_VLLM_HANG=1 never listens (a load that never ends).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

POSSIBLE_MAX_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve")
    serve.add_argument("model_tag")
    serve.add_argument("--served-model-name", nargs="+")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--enable-lora", action="store_true")
    serve.add_argument("--max-loras", type=int, default=1)
    serve.add_argument("--max-lora-rank", type=int, default=16)
    serve.add_argument("--max-model-len", type=int)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--max-num-seqs", type=int)
    return parser.parse_args(argv)


def error(status: int, kind: str, message: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


class FakeVllm:
    def __init__(self, args: argparse.Namespace, record: Path | None) -> None:
        self.args = args
        self.base = (args.served_model_name or [args.model_tag])[0]
        self.loras: dict[str, str] = {}
        self.calls = record.with_name(record.name + ".calls.jsonl") if record else None

    def routes(self) -> list[Route]:
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
        ]
        flag = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower()
        if flag in ("1", "true"):
            routes += [
                Route("/v1/load_lora_adapter", self.load, methods=["POST"]),
                Route("/v1/unload_lora_adapter", self.unload, methods=["POST"]),
            ]
        return routes

    async def health(self, _request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, _request: Request) -> JSONResponse:
        created = int(time.time())
        card = {"object": "model", "created": created, "owned_by": "vllm", "permission": []}
        base = card | {"id": self.base, "root": self.args.model_tag, "parent": None}
        data = [base | {"max_model_len": self.args.max_model_len}]
        data += [card | {"id": n, "root": p, "parent": self.base} for n, p in self.loras.items()]
        return JSONResponse({"object": "list", "data": data})

    async def load(self, request: Request) -> Response:
        body = await request.json()
        self._record("load", body)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            message = "Both 'lora_name' and 'lora_path' must be provided."
            return error(400, "InvalidUserInput", message)
        if name in self.loras and not body.get("load_inplace"):
            message = (
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True."
            )
            return error(400, "InvalidUserInput", message)
        adapter = Path(path)
        config = adapter / "adapter_config.json"
        if not config.is_file() or not any((adapter / f).is_file() for f in WEIGHT_FILES):
            message = f"Loading lora {name} failed: No adapter found for {path}"
            return error(404, "NotFoundError", message)
        if not self.args.enable_lora:
            return error(500, "InternalServerError", "LoRA is not enabled. Use --enable-lora.")
        rank = json.loads(config.read_text())["r"]
        if rank > self.args.max_lora_rank:
            message = f"LoRA rank {rank} is greater than max_lora_rank {self.args.max_lora_rank}."
            return error(500, "InternalServerError", message)
        self.loras[name] = path
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: Request) -> Response:
        body = await request.json()
        self._record("unload", body)
        name = body.get("lora_name")
        if not name:
            message = "'lora_name' needs to be provided to unload a LoRA adapter."
            return error(400, "InvalidUserInput", message)
        if name not in self.loras:
            return error(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
        del self.loras[name]
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    async def chat(self, request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        model = body.get("model") or self.base
        if model != self.base and model not in self.loras:
            return error(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
        text = f"This is {model} answering."
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "tool_calls": []},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
            }
        )

    def _record(self, call: str, body: Any) -> None:
        if self.calls is not None:
            with self.calls.open("a") as handle:
                handle.write(json.dumps({"call": call, "body": body}) + "\n")


def check(args: argparse.Namespace) -> str | None:
    """What vLLM would fail on before it listens, as it says it."""
    if args.max_lora_rank not in POSSIBLE_MAX_RANKS:
        return (
            f"ValueError: max_lora_rank ({args.max_lora_rank}) must be one of {POSSIBLE_MAX_RANKS}."
        )
    if not 0 < args.gpu_memory_utilization <= 1:
        return f"ValueError: GPU memory utilization must be within (0, 1]. Got {args.gpu_memory_utilization}."
    if not (Path(args.model_tag) / "config.json").is_file():
        return f"OSError: {args.model_tag} does not appear to have a file named config.json."
    return None


def main(argv: list[str]) -> int:
    args = parse(argv)
    record = Path(os.environ["FAKE_VLLM_RECORD"]) if os.environ.get("FAKE_VLLM_RECORD") else None
    if record is not None:
        prefixes = ("VLLM_", "HF_", "CUDA_")
        env = {k: v for k, v in os.environ.items() if k.startswith(prefixes)}
        record.write_text(json.dumps({"argv": argv, "env": env}))
    print(f"INFO vLLM API server version 0.0.0-fake; args: {argv}", flush=True)
    problem = check(args)
    if problem is not None:
        print("Traceback (most recent call last):\n  ...", file=sys.stderr)
        print(problem, file=sys.stderr, flush=True)
        return 1
    if os.environ.get("FAKE_VLLM_HANG") == "1":
        print("INFO Loading weights took ... (never done)", flush=True)
        while True:
            time.sleep(60)
    fake = FakeVllm(args, record)
    print(f"INFO Starting vLLM API server on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(
        Starlette(routes=fake.routes()),
        host=args.host or "0.0.0.0",  # noqa: S104 (vLLM's default)
        port=args.port,
        log_level="warning",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
