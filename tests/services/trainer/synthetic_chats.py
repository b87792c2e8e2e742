"""Deterministic, realistic-looking chat samples for trainer tests and bench-train.

Support tickets, short factual QA, multi-turn follow-ups and tool-call exchanges (call, result,
answer), built from templates with a seeded RNG. `length="lognormal"` stretches the turns so
token lengths follow the long-tailed mix real traffic has (many short, a few long).
"""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime
from pathlib import Path

from shared.chat import Sample

_CREATED = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
_PRODUCTS = ("the invoice page", "the mobile app", "SSO login", "the CSV export", "the billing API")
_PROBLEMS = (
    "shows a blank screen",
    "returns error 502",
    "charges twice",
    "times out after a minute",
    "logs me out",
)
_FIXES = (
    "clear the browser cache and sign in again",
    "update the app to the latest version",
    "regenerate the API key in the settings page",
    "ask your admin to re-enable the SSO connection",
    "retry the export with a smaller date range",
)
_FACTS = (
    ("What is the capital of France?", "The capital of France is Paris."),
    ("How many days are in a leap year?", "A leap year has 366 days."),
    ("What does HTTP 404 mean?", "HTTP 404 means the server could not find the resource."),
    ("Who wrote Hamlet?", "Hamlet was written by William Shakespeare."),
    ("What is the boiling point of water?", "Water boils at 100 degrees Celsius at sea level."),
    ("What is 12 times 12?", "12 times 12 is 144."),
)
_CITIES = ("Berlin", "Paris", "Tokyo", "Lisbon", "Toronto", "Nairobi")
_FILLER = (
    "I have tried this twice already today.",
    "Our team depends on this for the monthly report.",
    "Please let me know if you need the account id.",
    "This started after the last update.",
    "It works fine for my colleague though.",
    "We are on the business plan.",
)
_WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
}
_ORDER_TOOL = {
    "name": "lookup_order",
    "description": "Status of an order by id.",
    "parameters": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    },
}


def _padding(rng: random.Random, sentences: int) -> str:
    return " ".join(rng.choice(_FILLER) for _ in range(sentences))


def _support(rng: random.Random, extra: int) -> list[dict[str, object]]:
    product, problem, fix = rng.choice(_PRODUCTS), rng.choice(_PROBLEMS), rng.choice(_FIXES)
    return [
        {"role": "system", "content": "You are a friendly support agent for Acme Cloud."},
        {
            "role": "user",
            "content": f"Hi, {product} {problem}. {_padding(rng, extra // 3)}".strip(),
        },
        {
            "role": "assistant",
            "content": f"Sorry about that! Please {fix}. If {product} still {problem}, "
            f"reply here and I will escalate it. {_padding(rng, extra - extra // 3)}".strip(),
        },
    ]


def _qa(rng: random.Random, extra: int) -> list[dict[str, object]]:
    turns: list[dict[str, object]] = []
    for _ in range(1 + extra // 3):  # a QA turn is about three filler sentences long
        question, answer = rng.choice(_FACTS)
        turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return turns


def _tool_call(rng: random.Random, extra: int) -> tuple[list[dict[str, object]], list[object]]:
    if rng.random() < 0.5:
        city = rng.choice(_CITIES)
        degrees = rng.randint(-5, 35)
        args, tool = {"city": city, "unit": "celsius"}, _WEATHER_TOOL
        ask = f"What's the weather in {city} right now?"
        result = json.dumps({"city": city, "temperature": degrees, "sky": "clear"})
        answer = f"It is {degrees} degrees Celsius and clear in {city}."
    else:
        order = f"A-{rng.randint(1000, 9999)}"
        args, tool = {"order_id": order}, _ORDER_TOOL
        ask = f"Where is my order {order}? {_padding(rng, extra // 3)}".strip()
        result = json.dumps({"order_id": order, "status": "shipped", "eta_days": 2})
        answer = f"Order {order} has shipped and should arrive in about 2 days."
    messages: list[dict[str, object]] = [
        {"role": "user", "content": ask},
        {
            "role": "assistant",
            "tool_calls": [{"id": "call_1", "name": tool["name"], "arguments": args}],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": tool["name"], "content": result},
        {"role": "assistant", "content": f"{answer} {_padding(rng, extra - extra // 3)}".strip()},
    ]
    return messages, [tool]


def make_sample(index: int, rng: random.Random, extra: int, tenant: str) -> Sample:
    kind = index % 3
    tools: list[object] = []
    if kind == 0:
        messages = _support(rng, extra)
    elif kind == 1:
        messages = _qa(rng, extra)
    else:
        messages, tools = _tool_call(rng, extra)
    return Sample.model_validate(
        {
            "tenant": tenant,
            "source": "upload",
            "source_ref": f"synthetic:{index}",
            "created_at": _CREATED,
            "messages": messages,
            "tools": tools,
        }
    )


def make_samples(
    count: int, *, seed: int = 0, tenant: str = "acme", length: str = "short"
) -> list[Sample]:
    """`count` samples; `length="lognormal"` gives a long-tailed length mix (a few long ones)."""
    rng = random.Random(seed)
    samples = []
    for index in range(count):
        if length == "lognormal":
            # Total length ~ lognormal(median ~120 tokens, sigma 1): a filler sentence is ~9
            # SmolLM2 tokens on top of a ~60-token conversation; the tail is cut at ~1,400.
            tokens = rng.lognormvariate(math.log(120), 1.0)
            extra = min(150, max(0, int((tokens - 60) / 9)))
        else:
            extra = rng.randint(0, 2)
        samples.append(make_sample(index, rng, extra, tenant))
    return samples


def write_snapshot(
    directory: Path, samples: list[Sample], eval_samples: list[Sample] | None = None
) -> Path:
    """A dataset snapshot dir: train.jsonl (+ eval.jsonl) of canonical samples."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.jsonl").write_bytes(b"\n".join(s.to_json_bytes() for s in samples) + b"\n")
    if eval_samples:
        (directory / "eval.jsonl").write_bytes(
            b"\n".join(s.to_json_bytes() for s in eval_samples) + b"\n"
        )
    return directory
