"""Settings for every tuneloop process: one pydantic-settings class per concern, env prefix TUNELOOP_.

Defaults point at the local stack `make up` starts. Ports avoid the standard ones (4222, 9000,
5432, ...) because development and CI machines often run their own NATS/PostgreSQL/Redis there.
With TUNELOOP_ENV unset a process runs as production, which refuses the development secrets and
credentials (docs/keys.md); the Makefile and the tests set TUNELOOP_ENV=development.
Hyperparameters are not settings: they live in recipe YAML and job configs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

Environment = Literal["development", "test", "production"]

# Values that are fine on a laptop and a security hole anywhere else.
_PLACEHOLDER_SECRETS = frozenset(
    {
        "",
        "changeme",
        "change-me",
        "secret",
        "password",
        "tuneloop-dev-secret",
        "tuneloop-dev-admin",
        "tuneloop-dev-service",
        "tuneloop-dev-webhook",
    }
)


# Production's floor for the secrets tuneloop checks itself: the admin and service tokens and the
# webhook signing secret (`secrets.token_urlsafe(32)` makes 43 characters).
MIN_SECRET_LENGTH = 32

# The local stack's S3 credentials: its SeaweedFS gateway is given these (localstack.prepare_s3).
DEV_S3_ACCESS_KEY = "tuneloop-dev"
DEV_S3_SECRET_KEY = "tuneloop-dev-secret"  # noqa: S105 - refused in production


# Bind addresses that listen on every interface: a client on this machine connects to its
# loopback instead.
ANY_ADDRESS = ("0.0.0.0", "::", "")  # noqa: S104 - compared against, never bound to

# A setting naming another service's base URL (TUNELOOP_INGEST_HOSTER_URL, ...): http(s), a host,
# and an optional path, so a typo fails the start naming the variable rather than every call.
# Empty, like unset, means the default (Settings.local_url).
ServiceUrl = Annotated[str, StringConstraints(pattern=r"^(https?://[^\s/]+(/[^\s]*)?)?$")]


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names the environment variable."""


def _config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(
        env_prefix=prefix, env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )


class AppSettings(BaseSettings):
    model_config = _config("TUNELOOP_")

    # Unset means production: a deployment that forgets it gets the strict checks, not the
    # development defaults.
    env: Environment = "production"
    # The local state: the SQLite database (unless a database URL is set), base models, jobs'
    # and engines' working directories, the local stack's logs and pidfiles.
    data_dir: Path = Path(".tuneloop")
    # The lowest level a process logs.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # One JSON object a line (for a log collector); false: plain lines for a terminal.
    log_json: bool = True
    # Where each service listens; 0.0.0.0 (or ::) takes calls from other machines.
    bind_host: str = "127.0.0.1"
    # The largest request body a route that does not stream its own takes (413 past it; checked
    # before the body is read, after the key): dataset specs, job creations and admin calls are
    # a few KiB, so a few MiB is generous and still bounds what one call can make a service
    # parse. Uploads, imports, OTLP exports and proxied calls have limits of their own.
    max_json_body_bytes: int = Field(default=4 * 1024**2, ge=1024)

    @property
    def is_development(self) -> bool:
        return self.env != "production"


class NatsSettings(BaseSettings):
    model_config = _config("TUNELOOP_NATS_")

    # The local stack's nats-server: its client address and its HTTP monitoring port.
    host: str = "127.0.0.1"
    port: int = Field(default=4322, ge=1, le=65535)
    monitor_port: int = Field(default=8322, ge=1, le=65535)
    # Clients connect here; defaults to the local server started from host/port.
    url: str = ""
    # How long a process waits at start-up for NATS (and its database) before it fails.
    connect_timeout_s: float = Field(default=30.0, gt=0)
    # A message whose handling failed for now comes back after 1 s doubling per delivery, at
    # most this long (and without limit on deliveries): the lag after an outage ends.
    max_retry_delay_s: float = Field(default=30.0, gt=0)
    # Limits applied to every JetStream stream we declare (streams.py may tighten them).
    stream_max_age_days: float = Field(default=30.0, gt=0)
    # JetStream reserves this much file storage per stream up front and refuses a stream it
    # cannot reserve, so the default stays modest; production sizes it to its traffic.
    stream_max_bytes: int = Field(default=1024**3, gt=0)

    @model_validator(mode="after")
    def _default_url(self) -> NatsSettings:
        if not self.url:
            self.url = f"nats://{self.host}:{self.port}"
        if not self.url.startswith(("nats://", "tls://", "ws://", "wss://")):
            raise ValueError(
                f"url must start with nats://, tls://, ws:// or wss:// (got {self.url!r})"
            )
        return self


class S3Settings(BaseSettings):
    model_config = _config("TUNELOOP_S3_")

    # The local stack's SeaweedFS S3 gateway.
    host: str = "127.0.0.1"
    port: int = Field(default=8433, ge=1, le=65535)
    # host:port of the S3 API; defaults to the local SeaweedFS gateway from host/port.
    endpoint: str = ""
    # The S3 credentials; production refuses the local stack's.
    access_key: str = DEV_S3_ACCESS_KEY
    secret_key: SecretStr = SecretStr(DEV_S3_SECRET_KEY)
    # One bucket holds everything, each tenant's objects under tenants/<tenant>/.
    bucket: str = Field(default="tuneloop", min_length=3, max_length=63)
    # The S3 region (where the bucket is made when it is missing).
    region: str = "us-east-1"
    # TLS to the endpoint (https).
    secure: bool = False
    # Above this size uploads go multipart (S3's minimum part is 5 MiB).
    multipart_threshold_bytes: int = Field(default=64 * 1024**2, ge=5 * 1024**2)
    # The size of each part of a multipart upload.
    part_size_bytes: int = Field(default=16 * 1024**2, ge=5 * 1024**2)
    # Local SeaweedFS only: the servers `weed server` runs beside the S3 gateway, each with a
    # gRPC port of its own.
    grpc_port: int = Field(default=9443, ge=1, le=65535)
    weed_master_port: int = Field(default=9433, ge=1, le=65535)
    weed_master_grpc_port: int = Field(default=9444, ge=1, le=65535)
    weed_volume_port: int = Field(default=9434, ge=1, le=65535)
    weed_volume_grpc_port: int = Field(default=9445, ge=1, le=65535)
    weed_filer_port: int = Field(default=9435, ge=1, le=65535)
    weed_filer_grpc_port: int = Field(default=9446, ge=1, le=65535)

    @model_validator(mode="after")
    def _default_endpoint(self) -> S3Settings:
        if not self.endpoint:
            self.endpoint = f"{self.host}:{self.port}"
        if "://" in self.endpoint:
            raise ValueError(
                f"endpoint is host:port without a scheme (got {self.endpoint!r}); use secure=true for TLS"
            )
        return self


class DatabaseSettings(BaseSettings):
    model_config = _config("TUNELOOP_DATABASE_")

    # SQLite file under the data dir unless DATABASE_URL (or TUNELOOP_DATABASE_URL) says otherwise.
    url: str = Field(
        default="", validation_alias=AliasChoices("TUNELOOP_DATABASE_URL", "DATABASE_URL")
    )
    # Log every SQL statement (SQLAlchemy's echo), for debugging.
    echo: bool = False


class ServicePorts(BaseSettings):
    model_config = _config("TUNELOOP_")

    # Each service's HTTP port; ingest's is the gateway that SDKs and the CLI call.
    ingest_port: int = Field(default=8400, ge=1, le=65535)
    scheduler_port: int = Field(default=8401, ge=1, le=65535)
    evaluator_port: int = Field(default=8402, ge=1, le=65535)
    hoster_port: int = Field(default=8403, ge=1, le=65535)
    # `tuneloop teacher`, the demo's stand-in frontier model; deploy/local/upstreams.yaml names it.
    teacher_port: int = Field(default=8480, ge=1, le=65535)

    def port_of(self, service: str) -> int:
        return int(getattr(self, f"{service}_port"))


class AuthSettings(BaseSettings):
    model_config = _config("TUNELOOP_AUTH_")

    # Lets an operator create tenants and API keys; every other request uses a tenant key.
    admin_token: SecretStr = SecretStr("tuneloop-dev-admin")
    # The services' own calls to each other's internal routes (the evaluator asking the hoster
    # for an eval engine): never a tenant's key, never routed by the gateway.
    service_token: SecretStr = SecretStr("tuneloop-dev-service")
    # Trainer webhooks: how old a signed report may be, in seconds, before it is refused.
    signature_tolerance_s: int = Field(default=300, gt=0)


class TelemetrySettings(BaseSettings):
    model_config = _config("TUNELOOP_TELEMETRY_")

    # OTLP/HTTP endpoint for our own traces (e.g. http://collector:4318); empty keeps them local.
    otlp_endpoint: str = ""
    # Seconds between presence heartbeats each service publishes on the bus.
    heartbeat_interval_s: float = Field(default=2.0, gt=0)


@dataclass(frozen=True)
class Settings:
    """Every concern's settings, loaded and checked together."""

    app: AppSettings
    nats: NatsSettings
    s3: S3Settings
    db: DatabaseSettings
    services: ServicePorts
    auth: AuthSettings
    telemetry: TelemetrySettings

    @property
    def database_url(self) -> str:
        if self.db.url:
            return self.db.url
        return f"sqlite:///{(self.app.data_dir / 'tuneloop.db').resolve()}"

    def local_url(self, service: str) -> str:
        """`service`'s base URL as the local stack runs it: this machine's bind host (its loopback
        when bound to every address) and the service's port. The default of each setting that
        names another service (TUNELOOP_INGEST_HOSTER_URL, TUNELOOP_EVALUATOR_INGEST_URL, ...),
        which a deployment whose services do not share a host sets."""
        host = self.app.bind_host
        host = "127.0.0.1" if host in ANY_ADDRESS else host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.services.port_of(service)}"


def _env_name(cls: type[BaseSettings], loc: tuple[Any, ...]) -> str:
    field = str(loc[0]) if loc else "?"
    if field == "url" and cls is DatabaseSettings:
        return "DATABASE_URL"
    prefix = str(cls.model_config.get("env_prefix", ""))
    return f"{prefix}{field}".upper()


def _load(cls: type[BaseSettings], **overrides: Any) -> Any:
    try:
        return cls(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{_env_name(cls, tuple(err['loc']))}: {err['msg']}"
            + (
                f" (got {err['input']!r})"
                if isinstance(err.get("input"), str | int | float)
                else ""
            )
            for err in exc.errors()
        )
        raise SettingsError(f"invalid settings: {problems}") from None


def secret_problem(variable: str, value: SecretStr) -> str | None:
    """Why `value` cannot be `variable`'s production secret, or None; never quotes the value."""
    plain = value.get_secret_value()
    if plain.strip().lower() in _PLACEHOLDER_SECRETS:
        return f"{variable} is a development placeholder"
    if len(plain) < MIN_SECRET_LENGTH:
        return f"{variable} must be at least {MIN_SECRET_LENGTH} characters in production"
    return None


def refuse_weak_secrets(app: AppSettings, secrets: Mapping[str, SecretStr]) -> None:
    """In production, raise SettingsError naming every variable of `secrets` (variable: value)
    that holds a placeholder or fewer than MIN_SECRET_LENGTH characters. For a service's own
    secrets (the scheduler's webhook secret); load_settings checks the shared ones."""
    if not app.is_development:
        _refuse(app, [p for name, value in secrets.items() if (p := secret_problem(name, value))])


def _refuse(app: AppSettings, problems: list[str]) -> None:
    if problems:
        raise SettingsError(
            f"invalid settings: {'; '.join(problems)} (TUNELOOP_ENV={app.env}, the default when "
            "unset; the local stack and the tests run with TUNELOOP_ENV=development)"
        )


def _refuse_development_values(settings: Settings) -> None:
    if settings.app.is_development:
        return
    secrets = {
        "TUNELOOP_AUTH_ADMIN_TOKEN": settings.auth.admin_token,
        "TUNELOOP_AUTH_SERVICE_TOKEN": settings.auth.service_token,
    }
    problems = [p for name, value in secrets.items() if (p := secret_problem(name, value))]
    # S3 keys are the provider's to shape (AWS access keys have 20 characters): production only
    # refuses the local stack's, and placeholders for the secret.
    if settings.s3.access_key == DEV_S3_ACCESS_KEY:
        problems.append("TUNELOOP_S3_ACCESS_KEY is the local stack's development default")
    if settings.s3.secret_key.get_secret_value().strip().lower() in _PLACEHOLDER_SECRETS:
        problems.append("TUNELOOP_S3_SECRET_KEY is a development placeholder")
    # NATS has no credential settings, so no development default to refuse: the local server is
    # anonymous, and a deployment's credentials ride in TUNELOOP_NATS_URL (docs/keys.md).
    _refuse(settings.app, problems)


def load_settings(**overrides: dict[str, Any]) -> Settings:
    """Read and check every concern; raise SettingsError naming the variable on a bad value.

    `overrides` maps a concern (`nats`, `s3`, ...) to field values, for tests and tools.
    """
    settings = Settings(
        app=_load(AppSettings, **overrides.get("app", {})),
        nats=_load(NatsSettings, **overrides.get("nats", {})),
        s3=_load(S3Settings, **overrides.get("s3", {})),
        db=_load(DatabaseSettings, **overrides.get("db", {})),
        services=_load(ServicePorts, **overrides.get("services", {})),
        auth=_load(AuthSettings, **overrides.get("auth", {})),
        telemetry=_load(TelemetrySettings, **overrides.get("telemetry", {})),
    )
    _refuse_development_values(settings)
    return settings


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, loaded once."""
    return load_settings()
