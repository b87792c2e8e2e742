"""`response_format` on the CPU engine (services/hoster/structured.py), driven by the official
openai SDK as a caller would drive a frontier model: `chat.completions.parse` with a pydantic
class gets back an instance of it; `json_object` gets a JSON object; a constrained request
batched with free ones leaves their answers as they were alone; what cannot be honoured is a 400
naming the field. The tiny random Llama first (an automaton is what makes its answer parse at
all), then SmolLM2 itself on a demo-like ticket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from services.hoster.lora_engine import Engine, build_app
from services.hoster.structured import is_byte_level, token_bytes

BASE = "base"
TICKET = (
    "Classify this support ticket: 'The invoice total is wrong after the refund.' "
    "Reply in JSON with its category and whether it is urgent."
)


class Ticket(BaseModel):
    model_config = ConfigDict(extra="forbid")

    category: Literal["billing", "bug", "other"]
    urgent: bool


async def sdk(base_dir: Path) -> AsyncIterator[openai.AsyncOpenAI]:
    engine = Engine(base_dir=base_dir, base_name=BASE, max_batch=8)
    transport = httpx.ASGITransport(app=build_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine/v1") as http:
        yield openai.AsyncOpenAI(
            base_url="http://engine/v1", api_key="unused", http_client=http, max_retries=0
        )


@pytest.fixture
async def tiny(tiny_model_dir: Path) -> AsyncIterator[openai.AsyncOpenAI]:
    async for client in sdk(tiny_model_dir):
        yield client


def ask(content: str = TICKET, **extra: Any) -> dict[str, Any]:
    return {
        "model": BASE,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 80,
        "temperature": 0,
        **extra,
    }


async def test_a_pydantic_response_format_parses_and_free_neighbours_are_unchanged(
    tiny: openai.AsyncOpenAI,
) -> None:
    alone = await tiny.chat.completions.create(**ask(max_tokens=12))
    # Two constrained and two free requests at once: one batch, per-member automata.
    parsed, free, parsed_again, free_again = await asyncio.gather(
        tiny.chat.completions.parse(**ask(response_format=Ticket)),
        tiny.chat.completions.create(**ask(max_tokens=12)),
        tiny.chat.completions.parse(**ask(response_format=Ticket)),
        tiny.chat.completions.create(**ask(max_tokens=12)),
    )
    for reply in (parsed, parsed_again):
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Ticket)  # the SDK read it into the class
    assert parsed.choices[0].message.content == parsed_again.choices[0].message.content
    for reply in (free, free_again):
        assert reply.choices[0].message.content == alone.choices[0].message.content
    with pytest.raises(ValidationError):  # left free, a random model writes no such object
        Ticket.model_validate_json(alone.choices[0].message.content or "")

    schema = {"name": "Ticket", "schema": Ticket.model_json_schema()}
    streamed = await tiny.chat.completions.create(
        **ask(response_format={"type": "json_schema", "json_schema": schema}, stream=True)
    )
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in streamed])
    assert text == parsed.choices[0].message.content


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ("json", "response_format"),
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "x"}},
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}},
            "response_format.json_schema.schema",
        ),
    ],
)
async def test_a_response_format_it_cannot_honour_is_a_400_naming_the_field(
    tiny: openai.AsyncOpenAI, response_format: Any, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await tiny.chat.completions.create(**ask(response_format=response_format))
    assert refused.value.param == param
    assert param in refused.value.message


def test_tokens_are_read_as_the_bytes_they_stand_for() -> None:
    # Byte-level BPE (GPT-2, SmolLM2): Ġ is the space byte, Ċ a newline, Ã© the two bytes of é.
    assert is_byte_level({"Ġthe": 0, "Ċ": 1, "<0x": 2})
    assert token_bytes("Ġthe", byte_level=True) == b" the"
    assert token_bytes("Ċ", byte_level=True) == b"\n"
    assert token_bytes("Ã©", byte_level=True) == "é".encode()
    # SentencePiece with byte fallback (Llama 2, Mistral): ▁ a space, <0x0A> one byte.
    assert not is_byte_level({"▁the": 0, "<0x0A>": 1, "é": 2})
    assert token_bytes("▁the", byte_level=False) == b" the"
    assert token_bytes("<0x0A>", byte_level=False) == b"\n"
    assert token_bytes("é", byte_level=False) == "é".encode()


async def test_smollm2_answers_a_ticket_as_the_schema_and_json_object_asks(
    smollm2_dir: Path,
) -> None:
    async for client in sdk(smollm2_dir):
        free = await client.chat.completions.create(**ask())
        # Left free it writes prose or a fenced block around its own keys.
        with pytest.raises(ValidationError):
            Ticket.model_validate_json(free.choices[0].message.content or "")
        parsed = await client.chat.completions.parse(**ask(response_format=Ticket))
        assert isinstance(parsed.choices[0].message.parsed, Ticket)
        anything = await client.chat.completions.create(
            **ask(response_format={"type": "json_object"}, max_tokens=120)
        )
        choice = anything.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(json.loads(choice.message.content or ""), dict)
