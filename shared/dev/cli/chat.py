"""`tuneloop chat MODEL`: a conversation with any model the gateway routes (a deployed `ft:` name,
a served name, a base, an upstream model), streamed, the turns kept as history. A refused turn
prints its one error line and the conversation goes on without it."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import openai
import typer
from rich.markup import escape

from shared.dev.cli.client import gateway
from shared.dev.cli.errors import describe, err
from shared.dev.cli.output import out

HELP = "/reset forgets the conversation, /exit (or Ctrl-D) ends it"


def _answer(
    client: openai.OpenAI, model: str, messages: list[Any], stream: bool, max_tokens: int | None
) -> str:
    """The model's reply, written out as it arrives."""
    limit = openai.omit if max_tokens is None else max_tokens
    if not stream:
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=limit)
        content = reply.choices[0].message.content or ""
        sys.stdout.write(content)
        return content
    parts: list[str] = []
    answer = client.chat.completions.create(
        model=model, messages=messages, stream=True, max_tokens=limit
    )
    for chunk in answer:
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            parts.append(delta)
            sys.stdout.write(delta)
            sys.stdout.flush()
    return "".join(parts)


def _read(prompt: str) -> str | None:
    """A line from the user; None at the end of input."""
    try:
        return input(prompt)
    except EOFError:
        return None


def chat(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="any model the gateway routes")],
    system: Annotated[str | None, typer.Option(help="a system prompt")] = None,
    stream: Annotated[bool, typer.Option(help="show the answer as it is written")] = True,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, help="at most this many tokens an answer")
    ] = None,
) -> None:
    """Chat with a model through the gateway (/reset, /exit)."""
    client = gateway(ctx)
    start: list[Any] = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    out.print(f"chatting with {escape(model)}; {HELP}", highlight=False)
    while (line := _read("you> ")) is not None:
        said = line.strip()
        if said in ("/exit", "/quit"):
            break
        if said == "/reset":
            messages = list(start)
            out.print("(conversation forgotten)")
            continue
        if not said:
            continue
        messages.append({"role": "user", "content": said})
        sys.stdout.write(f"{model}> ")
        try:
            reply = _answer(client, model, messages, stream, max_tokens)
        except openai.APIError as exc:
            messages.pop()  # the refused turn is not part of the conversation
            sys.stdout.write("\n")
            err.print(f"[red]error:[/] {escape(describe(exc)[0])}", soft_wrap=True, highlight=False)
            continue
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})
