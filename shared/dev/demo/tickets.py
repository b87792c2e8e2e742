"""The demo task: short customer-support tickets, each to a JSON object of seven fields.

A seeded generator writes the tickets from templates, so every field can be read off the text
(the teacher does so by rules) and a 135M model can learn the mapping from a few hundred
examples. The train and held-out splits are cut from one de-duplicated stream, so no held-out
ticket equals a training one. `field_accuracy` is the grader the evaluator reuses.

Write a split as OpenAI chat requests, one a line:
`python -m shared.dev.demo.tickets --split train|heldout --out FILE [--seed N] [--model NAME]`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

Split = Literal["train", "heldout"]
TRAIN_SIZE: Final = 400
HELDOUT_SIZE: Final = 120
DEFAULT_SEED: Final = 20
TEACHER_MODEL: Final = "teacher-tickets"

Category = Literal["billing", "shipping", "technical", "account", "returns"]
Priority = Literal["low", "medium", "high", "urgent"]
Sentiment = Literal["positive", "neutral", "negative"]


class TicketFields(BaseModel):
    """The answer: what a support agent's triage form holds."""

    model_config = ConfigDict(extra="forbid")

    category: Category
    priority: Priority
    product: str
    order_id: str | None
    customer_name: str
    sentiment: Sentiment
    refund_requested: bool


FIELDS: Final = tuple(TicketFields.model_fields)
ANSWER_SCHEMA: Final[dict[str, Any]] = TicketFields.model_json_schema()

# Short on purpose: every example carries it, and on 2 CPU cores training time is tokens. The
# fields' values are the teacher's to show; a fine-tuned model learns them from its answers.
SYSTEM_PROMPT: Final = (
    "Triage the support ticket as one JSON object with category, priority, product, order_id, "
    "customer_name, sentiment and refund_requested."
)

PRODUCTS: Final = (
    "Nimbus X2 headphones",
    "AeroBlend 300 blender",
    "Kestrel smartwatch",
    "Lumo desk lamp",
    "TerraPack backpack",
    "Volt S1 scooter",
    "Orbit mini speaker",
    "Cascade coffee maker",
    "Pixel Frame 10",
    "Summit hiking boots",
    "Glide robot vacuum",
    "Ember space heater",
)
FIRST_NAMES: Final = (
    "Maria", "James", "Aisha", "Tom", "Yuki", "Lena", "Omar", "Grace", "Pedro", "Nina",
    "Lucas", "Priya", "Jonas", "Chloe", "Ravi", "Sofia", "Ethan", "Mei", "Ahmed", "Clara",
)  # fmt: skip
LAST_NAMES: Final = (
    "Lopez", "Smith", "Khan", "Becker", "Tanaka", "Novak", "Haddad", "Kim", "Silva", "Rossi",
    "Dubois", "Patel", "Berg", "Martin", "Okafor", "Costa", "Walsh", "Chen", "Farouk", "Meyer",
)  # fmt: skip

# Per category: (subject, body) templates; {product} and {order} are filled in. A body without
# {order} gives a ticket without an order id.
CATEGORY_TEMPLATES: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "billing": (
        ("Charged twice", "I was charged twice for my {product}{order}."),
        ("Wrong amount on my invoice", "The invoice for the {product}{order} shows the wrong amount."),
        ("Payment problem", "My card was billed but the payment for the {product}{order} shows as failed."),
    ),
    "shipping": (
        ("Where is my package?", "My {product}{order} has not arrived yet and tracking has not moved."),
        ("Delivery went to the wrong address", "The courier delivered my {product}{order} to the wrong address."),
        ("Late delivery", "The delivery of my {product}{order} is two weeks late."),
    ),
    "technical": (
        ("Device stopped working", "My {product} stopped working after two days and will not turn on."),
        ("Keeps disconnecting", "The {product} keeps disconnecting from my phone every few minutes."),
        ("Strange noise", "My {product}{order} makes a loud grinding noise when I use it."),
    ),
    "account": (
        ("Cannot log in", "I cannot log in to my account to register my {product}."),
        ("Change my account email", "I need to change the email on my account, it is linked to my {product}."),
        ("Password reset not arriving", "The password reset link never arrives, so I cannot see the warranty of my {product}."),
    ),
    "returns": (
        ("Return request", "I would like to return the {product}{order}, it is not what I expected."),
        ("Item arrived damaged", "The {product}{order} arrived damaged and I want to send it back."),
        ("Wrong item sent", "You sent me the wrong colour of the {product}{order} and I want to return it."),
    ),
}  # fmt: skip
ORDER_PHRASES: Final = (
    " (order {order_id})",
    " from order {order_id}",
    " with order number {order_id}",
)
PRIORITY_PHRASES: Final[dict[str, tuple[str, ...]]] = {
    "low": ("No rush, whenever you have time.", "This is not urgent at all."),
    "medium": ("I would appreciate an answer this week.", "Please get back to me in the next few days."),
    "high": ("Please look at this soon, it is blocking me.", "I need this sorted out quickly."),
    "urgent": ("This is urgent, I need it fixed today!", "URGENT: please help right away!"),
}  # fmt: skip
SENTIMENT_PHRASES: Final[dict[str, tuple[str, ...]]] = {
    "positive": ("I love your products otherwise, thanks a lot!", "Your team has always been great, thank you!"),
    "neutral": ("Thanks.", "Let me know what you need from me."),
    "negative": ("I am really disappointed with your service.", "This is frustrating and unacceptable."),
}  # fmt: skip
REFUND_PHRASES: Final[dict[bool, tuple[str, ...]]] = {
    True: ("I want a full refund.", "Please give me my money back."),
    False: ("I do not want a refund, just a solution.", ""),
}
GREETINGS: Final = ("Hello,", "Hi there,", "Dear support team,", "Hi,")
SIGN_OFFS: Final = ("Best regards", "Thanks", "Kind regards", "Cheers")


@dataclass(frozen=True)
class Ticket:
    """One generated ticket: its text and the answer the teacher must give."""

    id: str
    text: str
    answer: TicketFields

    def messages(self) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.text},
        ]

    def request(self, model: str = TEACHER_MODEL) -> dict[str, Any]:
        """The OpenAI chat request that asks `model` to triage this ticket."""
        return {"model": model, "messages": self.messages(), "temperature": 0}


def answer_json(fields: TicketFields) -> str:
    """The canonical answer text: the fields in schema order, compact JSON."""
    return json.dumps(fields.model_dump(mode="json"), separators=(", ", ": "))


def _ticket(rng: random.Random, number: int) -> Ticket:
    category = rng.choice(list(CATEGORY_TEMPLATES))
    subject, body = rng.choice(CATEGORY_TEMPLATES[category])
    product = rng.choice(PRODUCTS)
    order_id = f"ORD-{rng.randrange(100000, 1000000)}" if "{order}" in body else None
    order = rng.choice(ORDER_PHRASES).format(order_id=order_id) if order_id else ""
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    priority = rng.choice(list(PRIORITY_PHRASES))
    sentiment = rng.choice(list(SENTIMENT_PHRASES))
    refund = category in ("billing", "shipping", "returns") and rng.random() < 0.6
    sentences = [
        body.format(product=product, order=order),
        rng.choice(REFUND_PHRASES[refund]),
        rng.choice(PRIORITY_PHRASES[priority]),
        rng.choice(SENTIMENT_PHRASES[sentiment]),
    ]
    text = (
        f"Subject: {subject}\nFrom: {first} {last}\n\n{rng.choice(GREETINGS)}\n"
        + " ".join(s for s in sentences if s)
        + f"\n\n{rng.choice(SIGN_OFFS)},\n{first}"
    )
    answer = TicketFields(
        category=category,
        priority=priority,
        product=product,
        order_id=order_id,
        customer_name=f"{first} {last}",
        sentiment=sentiment,
        refund_requested=refund,
    )
    return Ticket(f"ticket-{number:04d}", text, answer)


def generate_all(seed: int = DEFAULT_SEED) -> tuple[list[Ticket], list[Ticket]]:
    """(train, heldout): one stream of distinct tickets, the first TRAIN_SIZE for training and
    the next HELDOUT_SIZE held out, so the two never share a ticket text."""
    rng = random.Random(seed)  # noqa: S311 - reproducible data, not secrets
    seen: set[str] = set()
    tickets: list[Ticket] = []
    while len(tickets) < TRAIN_SIZE + HELDOUT_SIZE:
        ticket = _ticket(rng, len(tickets))
        if ticket.text not in seen:
            seen.add(ticket.text)
            tickets.append(ticket)
    return tickets[:TRAIN_SIZE], tickets[TRAIN_SIZE:]


def generate(split: Split, seed: int = DEFAULT_SEED) -> list[Ticket]:
    train, heldout = generate_all(seed)
    return train if split == "train" else heldout


def field_scores(expected: TicketFields, got: str | dict[str, Any]) -> dict[str, bool]:
    """Per field, whether `got` (a model's answer text or parsed object) gets it right. Strings
    compare trimmed and case-insensitively; an answer that is not a JSON object gets none."""
    if isinstance(got, str):
        try:
            got = json.loads(got)
        except ValueError:
            return dict.fromkeys(FIELDS, False)
    if not isinstance(got, dict):
        return dict.fromkeys(FIELDS, False)
    want = expected.model_dump(mode="json")
    return {name: _same(want[name], got.get(name, _MISSING)) for name in FIELDS}


_MISSING = object()


def _same(want: object, got: object) -> bool:
    if isinstance(want, str) and isinstance(got, str):
        return want.strip().casefold() == got.strip().casefold()
    # bool is an int in Python: `1` must not pass for `true`, nor `0` for `false`.
    return type(want) is type(got) and want == got


def field_accuracy(expected: TicketFields, got: str | dict[str, Any]) -> float:
    """The share of the fields `got` gets right, in [0, 1]."""
    scores = field_scores(expected, got)
    return sum(scores.values()) / len(scores)


def parse_answer(text: str) -> TicketFields | None:
    """A model's answer as fields, or None when it does not follow the schema."""
    try:
        return TicketFields.model_validate_json(text)
    except ValidationError:
        return None


def write_requests(tickets: list[Ticket], out: Path, model: str = TEACHER_MODEL) -> None:
    with out.open("w", encoding="utf-8") as handle:
        for ticket in tickets:
            handle.write(json.dumps(ticket.request(model)) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.dev.demo.tickets", description=__doc__)
    parser.add_argument("--split", choices=["train", "heldout"], required=True)
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--model", default=TEACHER_MODEL, help="the requests' model")
    args = parser.parse_args(argv)
    tickets = generate(args.split, args.seed)
    write_requests(tickets, args.out, args.model)
    print(f"wrote {len(tickets)} {args.split} requests to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
