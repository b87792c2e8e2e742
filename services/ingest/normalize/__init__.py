"""Provider wire formats -> canonical samples (shared.chat.Sample).

One function per provider turns an `Exchange` (one call as the gateway saw it, or as a log line
recorded it) into samples, plus a list of what could not be carried over and why (the fidelity
report). Nothing here knows HTTP servers, the bus or storage: images stay inline (`data`) and a
later step moves them to object storage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.chat import MetadataValue, Provider, Sample, Source

RESPONSES_PATH = "/v1/responses"


class NormalizeError(ValueError):
    """The input cannot become a sample; `path` names the field (e.g. `messages[2].content[0].type`)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class Dropped:
    """A part of the input that the sample does not carry, and why (e.g. an unsupported part type)."""

    path: str
    reason: str


@dataclass
class Exchange:
    """One request/response pair of a provider's API."""

    provider: Provider
    request: dict[str, Any]
    status: int = 200
    # Exactly one of these for a response: the parsed JSON body, or the raw SSE text of a stream.
    response: dict[str, Any] | None = None
    stream: str | None = None
    # Gemini names the model in the URL path (`models/{model}:generateContent`), not the body.
    model_from_path: str | None = None
    # The API path, where a provider has more than one format: OpenAI's `/v1/responses`
    # (None: the provider's chat format).
    api_path: str | None = None
    tenant: str = "default"
    source: Source = "gateway"
    source_ref: str | None = None
    created_at: datetime | None = None
    latency_ms: float | None = None
    time_to_first_token_ms: float | None = None
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, MetadataValue] = field(default_factory=dict)


@dataclass
class Normalized:
    samples: list[Sample]
    dropped: list[Dropped] = field(default_factory=list)


Normalizer = Callable[[Exchange], Normalized]


def normalize(exchange: Exchange) -> Normalized:
    """Dispatch on the exchange's provider."""
    # Imported here so each provider module stays importable on its own.
    from services.ingest.normalize import anthropic, gemini, openai, openai_responses

    if exchange.provider == "openai" and exchange.api_path == RESPONSES_PATH:
        return openai_responses.normalize(exchange)
    normalizers: dict[str, Normalizer] = {
        "openai": openai.normalize,
        "anthropic": anthropic.normalize,
        "gemini": gemini.normalize,
    }
    normalizer = normalizers.get(exchange.provider)
    if normalizer is None:
        raise NormalizeError("provider", f"unsupported provider {exchange.provider!r}")
    return normalizer(exchange)
