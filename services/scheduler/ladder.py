"""The GPU priority ladder: which providers a job may run on, in which order, at what price.

`deploy/providers.yaml` (or `TUNELOOP_SCHEDULER_PROVIDERS_FILE`) lists them; without a file the
ladder is the local provider alone. Each rung names its kind (local, kubernetes, skypilot), its
priority (lower first), how many attempts it runs at once, its devices, their price and the
longest one attempt may run there. Unknown fields are refused by name, so a misspelt option
fails the start instead of being ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

if TYPE_CHECKING:
    from services.scheduler.providers import Provider

Kind = Literal["local", "kubernetes", "skypilot"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KubernetesOptions(_Strict):
    """How a batch/v1 Job is made for an attempt (kubernetes_provider.py)."""

    namespace: str = "default"
    # The trainer's image: this repository's, with the trainer's dependencies (deploy/).
    image: str
    # kubeconfig context; None: in-cluster config when run in a pod, else the current context.
    context: str | None = None
    service_account: str | None = None
    # Kueue: the LocalQueue (label kueue.x-k8s.io/queue-name) and a WorkloadPriorityClass.
    kueue_queue: str | None = None
    priority_class: str | None = None
    # The node label selecting the device class, and the resource name its devices are counted in.
    node_selector: dict[str, str] = Field(default_factory=dict)
    device_resource: str = "nvidia.com/gpu"
    # A Secret in the namespace holding the object storage credentials the trainer needs.
    storage_secret: str | None = None
    # The trainer pod's user and group: never root (Pod Security `restricted`). The defaults are
    # deploy/Dockerfile's uid/gid 10001; the group is also the pod's fsGroup, which makes the
    # job.json volume (0400, root's) readable to it.
    run_as_user: int = Field(default=10001, ge=1)
    run_as_group: int = Field(default=10001, ge=1)


class SkyPilotOptions(_Strict):
    """How a SkyPilot managed job is launched for an attempt (skypilot_provider.py)."""

    # SkyPilot's resources: e.g. "H100:1"; infra such as "aws", "k8s/my-context"; spot or not.
    accelerators: str | None = None
    infra: str | None = None
    use_spot: bool = True
    # The image (docker:...) or the setup commands that give the trainer its dependencies.
    image_id: str | None = None
    setup: str | None = None
    workdir: str | None = None


class ProviderSpec(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,31}$")]
    kind: Kind
    priority: int = 0
    # Attempts it runs at once; the ladder skips a full rung.
    capacity: int = Field(default=1, ge=1)
    # The device class (a throughput row: cpu, nvidia-a10g, nvidia-l4, nvidia-a100-80gb,
    # nvidia-h100, ...), how many a job may use, and the memory of one.
    device: str = "cpu"
    device_count: int = Field(default=1, ge=1)
    device_memory_gib: float = Field(default=24.0, gt=0)
    cost_per_hour: float = Field(default=0.0, ge=0)
    # The longest one attempt may run there (a serverless limit, a queue's time limit); None:
    # unlimited. The scheduler rolls the job over to a new attempt before it.
    max_runtime_s: float | None = Field(default=None, gt=0)
    # The scheduler's base URL as this rung's trainers reach it, for their reports; None:
    # TUNELOOP_SCHEDULER_PUBLIC_URL, and for a local rung the scheduler's own address.
    report_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    kubernetes: KubernetesOptions | None = None
    skypilot: SkyPilotOptions | None = None

    def reports_base(self, public_url: str | None, own_address: str) -> str:
        """Where this rung's trainers send their reports (`.../internal/trainer/<job>/...`): a
        local trainer reaches the scheduler's own address, a remote one its public URL."""
        remote = public_url if self.kind != "local" else None
        return (self.report_url or remote or own_address).rstrip("/")

    @model_validator(mode="after")
    def _options_of_its_kind(self) -> ProviderSpec:
        if self.kind == "kubernetes" and self.kubernetes is None:
            raise ValueError("kind kubernetes needs a `kubernetes:` section (image at least)")
        for kind in ("kubernetes", "skypilot"):
            if kind != self.kind and getattr(self, kind) is not None:
                raise ValueError(f"a `{kind}:` section belongs to a provider of kind {kind}")
        return self


class Ladder(_Strict):
    providers: list[ProviderSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> Ladder:
        names = [p.name for p in self.providers]
        if len(names) != len(set(names)):
            raise ValueError(f"provider names must be unique: {names}")
        return self

    def ordered(self) -> list[ProviderSpec]:
        """By priority, then as listed."""
        return sorted(self.providers, key=lambda p: p.priority)


class LadderError(ValueError):
    """The providers file cannot be read; the message names the file and the field."""


def check_reachable(ladder: Ladder, public_url: str | None) -> None:
    """A trainer on another machine cannot report to the scheduler's own (loopback) address:
    refuse a remote rung that has no URL to report to, naming the field."""
    for i, rung in enumerate(ladder.providers):
        if rung.kind != "local" and rung.report_url is None and public_url is None:
            raise LadderError(
                f"providers[{i}].report_url: the {rung.kind} rung {rung.name!r} runs trainers on "
                "other machines, which cannot reach the scheduler's own address; set its "
                "report_url or TUNELOOP_SCHEDULER_PUBLIC_URL (the scheduler's URL as they reach it)"
            )


LOCAL_ONLY = Ladder(providers=[ProviderSpec(name="local", kind="local")])


def load_ladder(path: Path | None) -> Ladder:
    if path is None:
        return LOCAL_ONLY
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise LadderError(f"{path}: {exc}") from None
    try:
        return Ladder.model_validate(document)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors()
        )
        raise LadderError(f"{path}: {problems}") from None


def make_provider(spec: ProviderSpec) -> Provider:
    """The adapter of the rung's kind (imported only when a ladder names it: the Kubernetes
    client and SkyPilot are not needed to run locally)."""
    if spec.kind == "kubernetes":
        from services.scheduler.kubernetes_provider import KubernetesProvider

        return KubernetesProvider(spec)
    if spec.kind == "skypilot":
        from services.scheduler.skypilot_provider import SkyPilotProvider

        return SkyPilotProvider(spec)
    from services.scheduler.providers import LocalProvider

    return LocalProvider(spec.name)


class ProviderPool:
    """The ladder's rungs and their providers, each made once."""

    def __init__(self, ladder: Ladder, providers: Mapping[str, Provider] | None = None) -> None:
        self.ladder = ladder
        given = dict(providers or {})
        self._providers = {
            spec.name: given.get(spec.name) or make_provider(spec) for spec in ladder.providers
        }
        self._specs = {spec.name: spec for spec in ladder.providers}

    def ordered(self) -> list[ProviderSpec]:
        return self.ladder.ordered()

    def spec(self, name: str) -> ProviderSpec:
        return self._specs[name]

    def get(self, name: str) -> Provider:
        return self._providers[name]

    def __contains__(self, name: object) -> bool:
        return name in self._providers
