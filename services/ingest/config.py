"""Settings of the ingest service (env prefix TUNELOOP_INGEST_)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

_DEFAULT_UPSTREAMS = Path(__file__).resolve().parents[2] / "deploy" / "local" / "upstreams.yaml"


class IngestSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TUNELOOP_INGEST_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    upstreams_file: Path = _DEFAULT_UPSTREAMS
    # Upstream calls: connect fast, but let long generations stream for as long as they take.
    upstream_connect_timeout_s: float = Field(default=10.0, gt=0)
    upstream_read_timeout_s: float = Field(default=600.0, gt=0)
    upstream_max_connections: int = Field(default=512, ge=1)
    # Request bodies larger than this get 413 (images inline make 20 MB plausible).
    max_body_bytes: int = Field(default=32 * 1024**2, ge=1024)
    # Captured calls waiting to be normalised and published; beyond this they go to the spill file.
    capture_queue_size: int = Field(default=10_000, ge=1)
    # How long a verified API key is trusted without asking the database again.
    auth_cache_ttl_s: float = Field(default=30.0, ge=0)
