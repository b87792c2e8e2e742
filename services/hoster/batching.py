"""Dynamic batching over transformers' `generate`: the requests waiting when the model is free run
as one left-padded batch, greedily, each stopping at its own end-of-sequence or token limit, and
each one's tokens are handed out as they are decoded (so a batch member can stream).

Why not transformers' continuous-batching manager: on these CPUs it decoded at about half the
speed of a padded `generate` batch (measured on SmolLM2-135M, 32 ticket prompts of ~150 tokens,
64 new tokens: 37 vs 63-69 tokens/s on one thread, 58 vs 89 on two; docs/hoster.md). What it
adds, admitting a request into a batch already running, matters less here than that factor:
evaluations and comparisons send their requests together. A request that arrives while a batch
runs waits for the next one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import torch
from outlines_core import Guide
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from services.hoster.structured import Guided
from shared.cpu_share import CoreShare

DONE = object()  # the end of a request's tokens


@dataclass
class Request:
    """One member of a batch: its prompt, its limit, and where its tokens go."""

    ids: list[int]
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    # The automaton its answer must follow (`response_format`, services/hoster/structured.py).
    guide: Guide | None = None
    out: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    generated: int = 0
    done: bool = False  # set by the generating thread (or by a client that went away)

    def send(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class Batcher:
    """Runs one model's requests in batches of up to `max_batch`, one batch at a time."""

    def __init__(
        self,
        model: Any,
        *,
        pad_id: int,
        eos_id: int | None,
        max_batch: int,
        cores: CoreShare | None = None,
    ) -> None:
        self.model, self.pad_id, self.eos_id, self.max_batch = model, pad_id, eos_id, max_batch
        self.cores = cores  # threads by the cores a trainer beside it leaves (shared/cpu_share.py)
        self._pending: list[Request] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # generate calls never overlap, whatever the loop

    async def tokens(
        self, ids: list[int], max_new_tokens: int, guide: Guide | None = None
    ) -> AsyncIterator[list[int]]:
        """The request's new tokens as they are decoded (the end-of-sequence token included),
        constrained by `guide` when given."""
        request = Request(ids, max_new_tokens, asyncio.get_running_loop(), guide)
        self._pending.append(request)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        try:
            while (item := await request.out.get()) is not DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            request.done = True  # a client that went away stops costing decode steps

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = [r for r in self._pending[: self.max_batch] if not r.done]
                del self._pending[: self.max_batch]
                if batch:
                    await asyncio.to_thread(self._generate, batch)

    def _generate(self, batch: list[Request]) -> None:
        width = max(len(r.ids) for r in batch)
        ids = torch.tensor([[self.pad_id] * (width - len(r.ids)) + r.ids for r in batch])
        mask = torch.tensor([[0] * (width - len(r.ids)) + [1] * len(r.ids) for r in batch])
        fanout = _Fanout(batch, self.eos_id)
        guided = LogitsProcessorList([Guided(batch)]) if any(r.guide for r in batch) else None
        try:
            with self._lock, torch.inference_mode():
                if self.cores is not None:
                    self.cores.update()
                self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=max(r.max_new_tokens for r in batch),
                    do_sample=False,
                    pad_token_id=self.pad_id,
                    streamer=fanout,
                    logits_processor=guided,
                    stopping_criteria=StoppingCriteriaList([_AllDone(batch)]),
                )
        except Exception as exc:  # torch raises many kinds; every member hears of it
            for request in batch:
                request.send(RuntimeError(f"generation failed: {exc!r}"))
        for request in batch:
            request.done = True
            request.send(DONE)


class _Fanout(BaseStreamer):
    """A `generate` streamer for a whole batch: each step's tokens to their requests."""

    def __init__(self, batch: list[Request], eos_id: int | None) -> None:
        self.batch, self.eos_id, self.prompt_seen = batch, eos_id, False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:  # generate's first call hands over the prompt
            self.prompt_seen = True
            return
        for request, token in zip(self.batch, value.reshape(-1).tolist(), strict=True):
            if request.done:
                continue
            request.generated += 1
            request.send([int(token)])
            if token == self.eos_id or request.generated >= request.max_new_tokens:
                request.done = True

    def end(self) -> None:
        pass


class _AllDone(StoppingCriteria):
    """Per sequence, whether it may stop (its own end or limit): the batch ends when all have."""

    def __init__(self, batch: list[Request]) -> None:
        self.batch = batch

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        return torch.tensor([r.done for r in self.batch], dtype=torch.bool)
