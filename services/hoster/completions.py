"""A chat completion on the CPU engine: the prompt rendered with the served model's own chat
template, `response_format`'s automaton, the tokens from the batcher, and OpenAI's response
bodies, whole or streamed (tool calls read out of the text when tools were offered)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from outlines_core import Guide

from services.hoster.engine_requests import ChatRequest, EngineError, plain_messages
from services.hoster.structured import FormatRefused, grammars_for, schema_of
from shared.tool_calls import read_tool_calls

if TYPE_CHECKING:
    from services.hoster.lora_engine import Served

DEFAULT_MAX_TOKENS = 512


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
