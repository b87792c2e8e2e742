"""Which upstream serves a model: the upstreams file, plus models the hoster deployed.

The gateway never translates between API families: an OpenAI-shaped request goes to an upstream
that speaks OpenAI's API (a provider, or one of our deployments, which serve the OpenAI API);
an Anthropic-shaped request to an Anthropic upstream; and so on.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from services.ingest.gateway.served import Served
from shared.events import CanaryFailed, ServedNameChanged, ServedTarget

Api = Literal["openai", "anthropic", "gemini"]
APIS: tuple[str, ...] = get_args(Api)


_RESOLVED_MAX = 4096
# The tag the gateway puts on a sample answered by one of our deployments: the registry version
# that produced it (`GET /v1/samples?tag=model_version:<id>`). Reserved: a caller cannot set it.
VERSION_TAG_PREFIX = "model_version:"


class RoutingConfigError(ValueError):
    """The upstreams file is wrong; the message names the entry and field."""


@dataclass(frozen=True)
class Route:
    """Where one call goes, the key the gateway adds for it, and the tags its sample gets."""

    upstream: str
    api: Api
    base_url: str
    api_key: str | None
    tags: tuple[str, ...] = ()
    # A served name's call (served.py): the name, whether its canary answers it, and the model
    # name its engine answers to (sent in the body's `model` instead of the served name).
    served_name: str | None = None
    canary: bool = False
    model: str | None = None
    # The deployment it goes to (None: an upstream of the file), for waking a cold one.
    deployment_id: str | None = None


@dataclass(frozen=True)
class Deployed:
    """A tenant's deployed model: the deployment, its OpenAI base URL, the version it serves."""

    deployment_id: str
    endpoint_url: str
    version_id: str | None = None
    model: str | None = None  # the name its engine answers to, when a served name routes here

    def route(self, served_name: str | None = None, canary: bool = False) -> Route:
        tags = (VERSION_TAG_PREFIX + self.version_id,) if self.version_id else ()
        name = f"deployment:{self.deployment_id}"
        base = self.endpoint_url.rstrip("/")
        return Route(
            name, "openai", base, None, tags, served_name, canary, self.model, self.deployment_id
        )

    @classmethod
    def of(cls, target: ServedTarget) -> Deployed:
        # An engine's OpenAI base URL ends in /v1, as an SDK's does; the gateway sends the
        # caller's own path (/v1/chat/completions) to the server's root, as for upstreams.
        root = target.endpoint_url.rstrip("/").removesuffix("/v1")
        return cls(target.deployment_id, root, target.version_id, target.model)


@dataclass(frozen=True)
class Upstream:
    name: str
    api: Api
    base_url: str
    models: tuple[str, ...]
    api_key_env: str | None = None

    def matches(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)

    def route(self) -> Route:
        # A key read from a file often ends in a newline; no key has surrounding whitespace.
        key = os.environ.get(self.api_key_env, "").strip() if self.api_key_env else ""
        return Route(self.name, self.api, self.base_url.rstrip("/"), key or None)


def _upstream(index: int, entry: Any) -> Upstream:
    where = f"upstreams[{index}]"
    if not isinstance(entry, dict):
        raise RoutingConfigError(f"{where}: expected a mapping, got {type(entry).__name__}")
    for required in ("name", "api", "base_url", "models"):
        if required not in entry:
            raise RoutingConfigError(f"{where}.{required}: missing")
    if entry["api"] not in APIS:
        raise RoutingConfigError(f"{where}.api: {entry['api']!r} is not one of {', '.join(APIS)}")
    if not str(entry["base_url"]).startswith(("http://", "https://")):
        raise RoutingConfigError(f"{where}.base_url: {entry['base_url']!r} is not an http(s) URL")
    models = entry["models"]
    if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
        raise RoutingConfigError(f"{where}.models: expected a list of model names or patterns")
    return Upstream(
        name=str(entry["name"]),
        api=entry["api"],
        base_url=str(entry["base_url"]),
        models=tuple(models),
        api_key_env=entry.get("api_key_env"),
    )


def load_upstreams(path: Path) -> list[Upstream]:
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise RoutingConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise RoutingConfigError(f"{path}: not valid YAML ({exc})") from None
    entries = document.get("upstreams") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise RoutingConfigError(f"{path}: expected a top-level 'upstreams' list")
    return [_upstream(index, entry) for index, entry in enumerate(entries)]


@dataclass
class RoutingTable:
    upstreams: list[Upstream]
    # (tenant, served model name) -> its deployment. A deployment serves only the tenant that
    # made it: another tenant naming the same model goes on to the upstreams file, as if the
    # deployment did not exist.
    deployments: dict[tuple[str, str], Deployed] = field(default_factory=dict)
    # Deployment ids that stopped. Ready and stopped events arrive on separate consumers, so at
    # start-up a deployment's "stopped" may be replayed before its "ready"; ids are never reused.
    stopped: set[str] = field(default_factory=set)
    # (tenant, served name) -> where its calls go (served.py); before deployments' own names.
    served: dict[tuple[str, str], Served] = field(default_factory=dict)
    # Deployments unloaded for idling (deployment.cold): a call to one wakes it (wake.py).
    cold: set[str] = field(default_factory=set)
    _resolved: dict[tuple[str, str], Route | None] = field(default_factory=dict, repr=False)

    def resolve(
        self, api: Api, model: str, tenant: str, split_key: Callable[[], bytes] | None = None
    ) -> Route | None:
        """The route for `tenant`'s call to `model` in the `api` family, or None (the caller
        answers 404). The tenant's served names come first (`split_key`: what a canary split
        hashes, asked only when there is one), then its deployments, then the upstreams file."""
        if api == "openai" and self.served:
            served = self.served.get((tenant, model))
            picked = served.pick(split_key or (lambda: b"")) if served is not None else None
            if picked is not None:
                target, canary = picked
                return Deployed.of(target).route(model, canary)
        if api == "openai" and self.deployments:
            deployed = self.deployments.get((tenant, model))
            if deployed is not None:
                return deployed.route()
        key = (api, model)
        if key in self._resolved:
            return self._resolved[key]
        route = next((u.route() for u in self.upstreams if u.api == api and u.matches(model)), None)
        # Matching patterns costs more than the rest of routing; the upstreams file does not
        # change while the process runs. Model names come from callers, so the memory is bounded.
        if len(self._resolved) >= _RESOLVED_MAX:
            self._resolved.clear()
        self._resolved[key] = route
        return route

    def first(self, api: Api) -> Route | None:
        """The first upstream of the `api` family in the upstreams file, for a call that names
        no model (a `model_optional` route in routes.py); None when the file has none."""
        return next((u.route() for u in self.upstreams if u.api == api), None)

    def add_deployment(
        self,
        *,
        tenant: str,
        served_model_name: str,
        deployment_id: str,
        endpoint_url: str,
        version_id: str | None = None,
        cold: bool = False,
    ) -> None:
        if deployment_id in self.stopped:
            return
        # A re-announcement says whether it is cold now; a first announcement is a warm engine.
        if cold:
            self.cold.add(deployment_id)
        else:
            self.cold.discard(deployment_id)
        # An engine's OpenAI base URL ends in /v1, as an SDK's does; the gateway sends the
        # caller's own path (/v1/chat/completions) to the server's root, as for upstreams.
        root = endpoint_url.rstrip("/").removesuffix("/v1")
        self.deployments[(tenant, served_model_name)] = Deployed(deployment_id, root, version_id)

    def mark_cold(self, deployment_id: str) -> None:
        if deployment_id not in self.stopped:
            self.cold.add(deployment_id)

    def is_cold(self, route: Route) -> bool:
        return route.deployment_id is not None and route.deployment_id in self.cold

    def woke(self, route: Route, endpoint_url: str) -> Route:
        """The route to a deployment woken at `endpoint_url` (it may have moved)."""
        if route.deployment_id is not None:
            self.cold.discard(route.deployment_id)
        root = endpoint_url.rstrip("/").removesuffix("/v1")
        return replace(route, base_url=root)

    def set_served(self, event: ServedNameChanged) -> None:
        """The newest state of a served name wins, whatever order the events come in."""
        key = (event.tenant, event.name)
        current = self.served.get(key)
        if current is None or current.revision < event.revision:
            self.served[key] = Served(event.tenant, event)

    def shadow(self, tenant: str, route: Route, split_key: Callable[[], bytes]) -> Route | None:
        """Where a served name's call its primary answers is mirrored, if anywhere."""
        if route.canary or route.served_name is None:
            return None
        served = self.served.get((tenant, route.served_name))
        target = served.shadow(split_key) if served is not None else None
        return Deployed.of(target).route(route.served_name) if target is not None else None

    def observe(
        self, tenant: str, route: Route, ok: bool, latency_ms: float
    ) -> CanaryFailed | None:
        """A served name's canary answered (or failed) a call: its verdict when it crosses."""
        if not route.canary or route.served_name is None:
            return None
        served = self.served.get((tenant, route.served_name))
        return served.observe(ok, latency_ms) if served is not None else None

    def remove_deployment(self, *, tenant: str, served_model_name: str, deployment_id: str) -> None:
        self.stopped.add(deployment_id)
        # Only the deployment that owns the name may take it away (a newer one may have replaced it).
        key = (tenant, served_model_name)
        current = self.deployments.get(key)
        if current is not None and current.deployment_id == deployment_id:
            del self.deployments[key]
