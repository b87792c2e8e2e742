"""A `completions` run's answers: each item's prompt (the input_messages template filled in, or
the messages an item_reference names) sent to the model through the gateway's own Chat
Completions endpoint with the caller's key, so a run reaches what the caller's key reaches (an
upstream model, a deployed `ft:` model, a served name) and the calls count as the caller's.

The calls carry `x-tuneloop-tags: eval_run:<run id>`. They are not tagged with
`x-tuneloop-purpose: eval`: only an internal key may send that header, and the run holds the
caller's write key (docs/evaluator.md, "Evals API").
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import openai

from services.evaluator import templating
from services.evaluator.evals import protocol

TAGS_HEADER = "x-tuneloop-tags"
TEXT_PARTS = ("input_text", "output_text")
PART_TYPES = (*TEXT_PARTS, "input_image")


class RunFailed(Exception):
    """What stops a whole run (the key refused, the model unknown, the gateway away): its
    OpenAI error code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Answer:
    sample: dict[str, Any]
    usage: dict[str, int] | None
    called: bool = True  # False: the prompt could not be made, no call went out


def _content(content: str | list[dict[str, Any]], item: Mapping[str, Any]) -> Any:
    context = {"item": item}
    if isinstance(content, str):
        return templating.render(content, context)
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") in TEXT_PARTS:
            parts.append({"type": "text", "text": templating.render(str(part["text"]), context)})
        else:
            url = templating.render(str(part["image_url"]), context)
            image = {"url": url} | ({"detail": part["detail"]} if part.get("detail") else {})
            parts.append({"type": "image_url", "image_url": image})
    if all(part["type"] == "text" for part in parts):
        # Plain text as a string: every chat engine reads it, not all read lists of parts.
        return "\n".join(part["text"] for part in parts)
    return parts


def prompt(
    messages: protocol.Template | protocol.ItemReference, item: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The messages sent for one item; TemplateError names what the item lacks."""
    if isinstance(messages, protocol.ItemReference):
        value = templating.lookup(messages.item_reference, {"item": item})
        if not isinstance(value, list) or not all(
            isinstance(m, dict) and "role" in m for m in value
        ):
            raise templating.TemplateError(
                f"{messages.item_reference}: not a list of chat messages ({{role, content}})"
            )
        return list(value)
    return [
        # Chat engines other than OpenAI's know no `developer` role; it means `system`.
        {
            "role": "system" if m.role == "developer" else m.role,
            "content": _content(m.content, item),
        }
        for m in messages.template
    ]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))


def _sample(
    model: str, messages: list[dict[str, Any]], params: protocol.SamplingParams
) -> dict[str, Any]:
    return {
        "model": model,
        "input": [{"role": m["role"], "content": _text(m.get("content") or "")} for m in messages],
        "output": [],
        "finish_reason": "",
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                  "cached_tokens": 0},
        "error": None,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "seed": params.seed,
        "max_completion_tokens": params.max_completion_tokens,
        # Not OpenAI's (its SDK keeps extra fields): the call's wall time, what "Versions side
        # by side" compares; None when no call went out.
        "latency_ms": None,
    }  # fmt: skip


def _usage(completion: Any) -> dict[str, int]:
    usage = completion.usage
    if usage is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "cached_tokens": 0}
    details = getattr(usage, "prompt_tokens_details", None)
    return {
        "prompt_tokens": usage.prompt_tokens or 0,
        "completion_tokens": usage.completion_tokens or 0,
        "total_tokens": usage.total_tokens or 0,
        "cached_tokens": (getattr(details, "cached_tokens", 0) or 0) if details else 0,
    }


def _message(exc: openai.APIStatusError) -> str:
    """The upstream's own message (the SDK's `message` prefixes the status to it)."""
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return exc.message


def _since(started: float) -> float:
    """Milliseconds since `started` (the SDK's retries of a 5xx included: what the caller waited)."""
    return round((time.perf_counter() - started) * 1000, 3)


def request_params(params: protocol.SamplingParams) -> dict[str, Any]:
    return params.model_dump(exclude_none=True)


async def answer(
    client: openai.AsyncOpenAI,
    *,
    model: str,
    messages: protocol.Template | protocol.ItemReference,
    params: protocol.SamplingParams,
    item: Mapping[str, Any],
) -> Answer:
    """One item's answer as OpenAI's output item `sample`; an item the model cannot answer
    (its prompt refused, the upstream failing after retries) has the reason in `error`."""
    try:
        sent = prompt(messages, item)
    except templating.TemplateError as exc:
        sample = _sample(model, [], params)
        sample["error"] = {"code": "template_error", "message": str(exc)}
        return Answer(sample, None, called=False)
    sample = _sample(model, sent, params)
    started = time.perf_counter()
    try:
        completion = await client.chat.completions.create(
            model=model,
            messages=sent,  # type: ignore[arg-type]  # role/content dicts, as OpenAI's
            **request_params(params),
        )
    except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
        raise RunFailed(
            "unauthorized", f"the gateway refused the run's key: {_message(exc)}"
        ) from None
    except openai.NotFoundError as exc:
        raise RunFailed("model_not_found", f"model {model!r}: {_message(exc)}") from None
    except openai.APIConnectionError as exc:
        raise RunFailed("gateway_unreachable", f"the gateway is not reachable: {exc}") from None
    except openai.APIStatusError as exc:
        sample["error"] = {"code": str(exc.status_code), "message": _message(exc)}
        sample["latency_ms"] = _since(started)
        return Answer(sample, None)
    sample["latency_ms"] = _since(started)
    usage = _usage(completion)
    sample["usage"] = usage
    if completion.choices:
        choice = completion.choices[0]
        output: dict[str, Any] = {"role": "assistant", "content": choice.message.content or ""}
        if choice.message.tool_calls:
            output["tool_calls"] = [call.model_dump() for call in choice.message.tool_calls]
        sample["output"] = [output]
        sample["finish_reason"] = choice.finish_reason or ""
    else:
        sample["error"] = {"code": "no_choice", "message": "the model answered no choice"}
    return Answer(sample, usage)
