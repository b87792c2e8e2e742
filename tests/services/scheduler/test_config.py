"""The scheduler's own settings: production refuses a placeholder or short webhook secret (the
master every job's signing secret is derived from), naming its variable; development takes the
default."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from services.scheduler.app import create_app
from services.scheduler.config import SchedulerSettings
from shared.settings import AppSettings, Settings, SettingsError
from tests.plugins.infra import make_settings

VARIABLE = "TUNELOOP_SCHEDULER_WEBHOOK_SECRET"


def _production(tmp_path: Path) -> Settings:
    """Production settings whose shared secrets pass, so only the scheduler's own can fail."""
    return make_settings(
        tmp_path,
        app={"env": "production"},
        auth={
            "admin_token": SecretStr("adm-" + "a1B2c3D4" * 4),
            "service_token": SecretStr("svc-" + "e5F6g7H8" * 4),
        },
        s3={"access_key": "AKIAIOSFODNN7EXAMPLE", "secret_key": SecretStr("s3-" + "x9Y" * 12)},
    )


def test_production_refuses_the_default_webhook_secret_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)

    with pytest.raises(SettingsError, match=f"{VARIABLE} is a development placeholder") as refused:
        create_app(_production(tmp_path))
    assert "tuneloop-dev-webhook" not in str(refused.value)


def test_production_refuses_a_short_webhook_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, "w" * 31)

    with pytest.raises(SettingsError, match=f"{VARIABLE} must be at least 32 characters"):
        SchedulerSettings.load(AppSettings(env="production"))


def test_production_takes_a_real_webhook_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, "w" * 32)

    own = SchedulerSettings.load(AppSettings(env="production"))

    assert own.webhook_secret.get_secret_value() == "w" * 32


def test_development_takes_the_default_webhook_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)

    own = SchedulerSettings.load(AppSettings(env="development"))

    assert own.webhook_secret.get_secret_value() == "tuneloop-dev-webhook"


def test_the_batch_window_may_wrap_past_midnight() -> None:
    overnight = SchedulerSettings(batch_window="22-6")
    assert [h for h in range(24) if overnight.in_batch_window(h)] == [0, 1, 2, 3, 4, 5, 22, 23]
    assert SchedulerSettings(batch_window="9-17").in_batch_window(16)
    assert not SchedulerSettings(batch_window="9-17").in_batch_window(17)
    assert SchedulerSettings().in_batch_window(3)  # no window: any time
