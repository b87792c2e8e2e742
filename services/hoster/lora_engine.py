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
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from outlines_core import Guide
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.hoster.batching import Batcher
from services.hoster.structured import FormatRefused, Grammars, grammars_for, schema_of
from shared.tool_calls import read_tool_calls

log = logging.getLogger("tuneloop.hoster.lora_engine")
ADAPTER_CONFIG = "adapter_config.json"
DEFAULT_MAX_TOKENS = 512


class EngineError(Exception):
    """An OpenAI-shaped error: status, message, the field it is about."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


# --- requests ------------------------------------------------------------------------------------


class ChatRequest(BaseModel):
    """The chat-completions fields this engine honours; any other field is refused by name."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: Any = None  # read by structured.schema_of, which names what is wrong
    seed: int | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None


# Accepted and harmless: they change nothing a greedy decoder would produce.
_NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "parallel_tool_calls": None}


def parse_request(body: Any) -> ChatRequest:
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise EngineError(400, f"{param}: {first['msg']}", param) from None
    for name, value in (request.model_extra or {}).items():
        if name in _NEUTRAL and value in (_NEUTRAL[name], None):
            continue
        raise EngineError(400, f"{name}: not supported by this CPU engine", name)
    if request.temperature not in (None, 0):
        raise EngineError(
            400,
            "temperature: this CPU engine decodes greedily; send 0 or leave it out "
            "(vLLM on GPU samples)",
            "temperature",
        )
    if request.top_p not in (None, 1):
        raise EngineError(400, "top_p: this CPU engine decodes greedily; send 1", "top_p")
    if request.n not in (None, 1):
        raise EngineError(400, "n: this engine answers one choice a request", "n")
    return request


def plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with text-part lists joined into strings (what a chat template renders)."""
    out = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise EngineError(
                        400, f"messages.{index}.content: {kind!r} parts are not supported",
                        f"messages.{index}.content",
                    )  # fmt: skip
                texts.append(str(part.get("text", "")))
            message = {**message, "content": "".join(texts)}
        out.append(message)
    return out


# --- one model (or one base with its adapters) and its batching -----------------------------------


class PhaseGate:
    """Requests for one model name run together; a request for another name waits until they
    drain, then `switch` activates its adapter. First come first served between names, so a
    steady stream for one model cannot starve another."""

    def __init__(self, switch: Callable[[str], None]) -> None:
        self._switch = switch
        self._cond = asyncio.Condition()
        self._active: str | None = None
        self._inflight = 0
        self._queue: deque[tuple[object, str]] = deque()

    @asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[None]:
        async with self._enter(name, switch=True):
            yield

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Nothing generates meanwhile (a name no request uses waits for every phase to end)."""
        async with self._enter(f"\0exclusive-{uuid.uuid4().hex}", switch=False):
            yield

    @asynccontextmanager
    async def _enter(self, name: str, *, switch: bool) -> AsyncIterator[None]:
        ticket = (object(), name)
        async with self._cond:
            self._queue.append(ticket)
            try:
                await self._cond.wait_for(lambda: self._may_enter(ticket))
            finally:
                self._queue.remove(ticket)
            if switch and self._active != name:
                self._switch(name)
                self._active = name
            self._inflight += 1
            self._cond.notify_all()  # requests for the same name behind this one may follow
        try:
            yield
        finally:
            async with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    @property
    def active(self) -> str | None:
        return self._active

    def forget(self, name: str, now_active: str) -> None:
        """name is gone (its adapter deleted under `exclusive`): now_active is what runs."""
        if self._active == name:
            self._active = now_active

    def _may_enter(self, ticket: tuple[object, str]) -> bool:
        if self._inflight == 0:
            return self._queue[0] is ticket
        if self._active != ticket[1]:
            return False
        for queued in self._queue:  # join the running phase unless another name waits ahead
            if queued is ticket:
                return True
            if queued[1] != ticket[1]:
                return False
        return True


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

    def __init__(self, *, base_dir: Path, base_name: str, max_batch: int) -> None:
        self.base_dir, self.base_name, self.max_batch = base_dir, base_name, max_batch
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
        batcher = Batcher(model, pad_id=pad, eos_id=eos, max_batch=self.max_batch)
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


# --- generation ----------------------------------------------------------------------------------


def prompt_ids(served: Served, request: ChatRequest) -> list[int]:
    messages = plain_messages(request.messages)
    try:
        text = served.tokenizer.apply_chat_template(
            messages, tools=request.tools, add_generation_prompt=True, tokenize=False
        )
    except Exception as exc:  # jinja raises many kinds for a malformed conversation
        message = f"messages: the chat template refused them: {exc}"
        raise EngineError(400, message, "messages") from None
    ids: list[int] = served.tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


async def response_guide(served: Served, request: ChatRequest) -> Guide | None:
    """The automaton `response_format` asks for (None for free text), compiled off the loop."""
    try:
        schema = schema_of(request.response_format)
    except FormatRefused as exc:
        raise EngineError(400, str(exc), exc.param) from None
    if schema is None:
        return None

    def build() -> Guide:
        if served.grammars is None:
            served.grammars = grammars_for(served.tokenizer)
        return served.grammars.guide(schema)

    try:
        return await asyncio.to_thread(build)
    except FormatRefused as exc:
        raise EngineError(400, str(exc), exc.param) from None


@dataclass
class Completion:
    """One request's answer in the making: its prompt rendered once, its limit, its tokens."""

    id: str
    model: str
    prompt: list[int]
    limit: int
    tokens: list[int] = field(default_factory=list)
    # The request offered tools: `<tool_call>` blocks in the answer become `tool_calls`.
    tools: bool = False
    guide: Guide | None = None  # `response_format`: the automaton the answer follows

    @classmethod
    def of(cls, served: Served, request: ChatRequest) -> Completion:
        limit = request.max_completion_tokens or request.max_tokens or DEFAULT_MAX_TOKENS
        prompt = prompt_ids(served, request)  # a bad conversation is a 400 before any output
        tools = bool(request.tools)
        return cls(f"chatcmpl-{uuid.uuid4().hex}", request.model, prompt, limit, tools=tools)

    def message(self, text: str, stopped: bool) -> tuple[dict[str, Any], str]:
        """The answer's message and finish reason: with tools offered, the calls it wrote are
        `tool_calls` (finish `tool_calls`), as a provider answers (shared/tool_calls.py)."""
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if self.tools:
            content, calls = read_tool_calls(text)
            if calls:
                message.update(content=content, tool_calls=calls)
                return message, "tool_calls"
        return message, self.finish_reason(stopped)

    def finish_reason(self, stopped: bool) -> str:
        return "stop" if stopped or len(self.tokens) < self.limit else "length"

    def usage(self) -> dict[str, int]:
        prompt, generated = len(self.prompt), len(self.tokens)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": generated,
            "total_tokens": prompt + generated,
        }


async def generate(served: Served, completion: Completion) -> AsyncIterator[list[int]]:
    """The new tokens as they come (the end-of-sequence token included), batched with the
    requests for the same model that wait beside it; each is added to `completion.tokens`."""
    served.requests += 1
    served.in_flight += 1
    try:
        async with served.host.gate.use(served.name):
            batcher = served.host.batcher
            async for tokens in batcher.tokens(
                completion.prompt, completion.limit, completion.guide
            ):
                completion.tokens += tokens
                yield tokens
    except RuntimeError as exc:  # the batch failed: every member answers 500 saying why
        raise EngineError(500, str(exc), code="engine_error") from None
    finally:
        served.in_flight -= 1
        served.last_used = time.monotonic()


def _chunk(completion: Completion, delta: dict[str, Any], finish: str | None) -> str:
    body = {
        "id": completion.id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": completion.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    return f"data: {json.dumps(body)}\n\n"


async def complete(served: Served, completion: Completion) -> dict[str, Any]:
    async for _tokens in generate(served, completion):
        pass
    eos = served.tokenizer.eos_token_id
    stopped = bool(completion.tokens) and completion.tokens[-1] == eos
    body = completion.tokens[:-1] if stopped else completion.tokens
    text = served.tokenizer.decode(body, skip_special_tokens=True)
    message, finish = completion.message(text, stopped)
    return {
        "id": completion.id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": completion.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": completion.usage(),
    }


async def stream(
    served: Served, completion: Completion, *, include_usage: bool
) -> AsyncIterator[str]:
    from tokenizers.decoders import DecodeStream

    decoder = DecodeStream(skip_special_tokens=True)
    rust, eos = served.tokenizer._tokenizer, served.tokenizer.eos_token_id
    yield _chunk(completion, {"role": "assistant", "content": ""}, None)
    if completion.tools:  # calls are read from the whole answer: it comes in one chunk
        async for chunk in _stream_whole(served, completion):
            yield chunk
        if include_usage:
            yield _usage_chunk(completion)
        yield "data: [DONE]\n\n"
        return
    stopped = False
    said, kept = "", []  # the text sent so far, and its tokens
    try:
        async for tokens in generate(served, completion):
            stopped = stopped or eos in tokens
            kept += [t for t in tokens if t != eos]
            text = "".join(decoder.step(rust, t) or "" for t in tokens if t != eos)
            if text:
                said += text
                yield _chunk(completion, {"content": text}, None)
    except EngineError as exc:  # the stream has begun: the error travels in it
        yield f"data: {json.dumps({'error': {'message': exc.message, 'code': exc.code}})}\n\n"
        return
    # The decoder holds back the bytes of a character not yet whole; at the end they are what
    # the plain answer shows for them (U+FFFD), so the streamed text equals the plain one.
    whole = served.tokenizer.decode(kept, skip_special_tokens=True)
    if len(whole) > len(said) and whole.startswith(said):
        yield _chunk(completion, {"content": whole[len(said) :]}, None)
    yield _chunk(completion, {}, completion.finish_reason(stopped))
    if include_usage:
        yield _usage_chunk(completion)
    yield "data: [DONE]\n\n"


async def _stream_whole(served: Served, completion: Completion) -> AsyncIterator[str]:
    """A streamed answer to a request that offered tools: its text and calls in one chunk
    once it is whole (a call cannot be told from text until its block closes)."""
    try:
        answer = await complete(served, completion)
    except EngineError as exc:
        yield f"data: {json.dumps({'error': {'message': exc.message, 'code': exc.code}})}\n\n"
        return
    choice = answer["choices"][0]
    message, finish = choice["message"], choice["finish_reason"]
    delta: dict[str, Any] = {"content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    yield _chunk(completion, delta, None)
    yield _chunk(completion, {}, finish)


def _usage_chunk(completion: Completion) -> str:
    usage = {
        "id": completion.id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": completion.model,
        "choices": [],
        "usage": completion.usage(),
    }
    return f"data: {json.dumps(usage)}\n\n"


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
    parser.add_argument("--max-batch", type=int, default=32, help="requests a batch holds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    # Models load before the server listens: /health answering means every named model serves.
    engine = Engine(
        base_dir=args.base,
        base_name=args.base_name,
        max_batch=args.max_batch,
    )
    for spec in args.model:
        name, _, path = spec.partition("=")
        engine.models[name] = engine._load(name, Path(path))
    engine.hide_base = args.hide_base
    uvicorn.run(build_app(engine), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
