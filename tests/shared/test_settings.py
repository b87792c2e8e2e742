"""Production secrets: with TUNELOOP_ENV unset a process is production, which refuses
placeholders and short values for tuneloop's own secrets and the local stack's S3 credentials,
naming each variable and never its value; development takes the defaults."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.settings import (
    DEV_S3_ACCESS_KEY,
    DEV_S3_SECRET_KEY,
    AppSettings,
    SettingsError,
    get_settings,
    load_settings,
)

ROOT = Path(__file__).resolve().parents[2]
TOKENS = ("TUNELOOP_AUTH_ADMIN_TOKEN", "TUNELOOP_AUTH_SERVICE_TOKEN")
# A production configuration: real-looking values for everything production checks.
PRODUCTION = {
    "TUNELOOP_AUTH_ADMIN_TOKEN": "adm-Xq4v9TzL2pRk7wN3bYc8sD1fGh6jKm0e",
    "TUNELOOP_AUTH_SERVICE_TOKEN": "svc-7hR2kW9qZx4mT1vB8nC3pL6dF0gJs5ya",
    "TUNELOOP_S3_ACCESS_KEY": "AKIAIOSFODNN7EXAMPLE",
    "TUNELOOP_S3_SECRET_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
}


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Nothing of tuneloop's in the environment (tests/conftest.py sets TUNELOOP_ENV) and no
    `.env` in the working directory: each test says what it sets."""
    for name in list(os.environ):
        if name.startswith("TUNELOOP_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _set(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def _refusal(monkeypatch: pytest.MonkeyPatch, **changed: str) -> str:
    _set(monkeypatch, PRODUCTION | changed)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    return str(refused.value)


def test_unset_env_is_production() -> None:
    assert AppSettings().env == "production"


def test_production_with_the_defaults_is_refused_naming_every_variable_and_no_value() -> None:
    with pytest.raises(SettingsError) as refused:
        get_settings()  # what every service process calls

    message = str(refused.value)
    assert "TUNELOOP_AUTH_ADMIN_TOKEN is a development placeholder" in message
    assert "TUNELOOP_AUTH_SERVICE_TOKEN is a development placeholder" in message
    assert "TUNELOOP_S3_ACCESS_KEY is the local stack's development default" in message
    assert "TUNELOOP_S3_SECRET_KEY is a development placeholder" in message
    assert "TUNELOOP_ENV=production" in message
    for value in ("tuneloop-dev-admin", "tuneloop-dev-service", DEV_S3_SECRET_KEY):
        assert value not in message


@pytest.mark.parametrize("variable", TOKENS)
def test_a_token_shorter_than_32_characters_is_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    short = "k7#Qz" * 6 + "x"  # 31 characters, no placeholder
    message = _refusal(monkeypatch, **{variable: short})

    assert f"{variable} must be at least 32 characters in production" in message
    assert short not in message
    assert all(other not in message for other in TOKENS if other != variable)


@pytest.mark.parametrize("variable", TOKENS)
@pytest.mark.parametrize("placeholder", ["changeme", "CHANGEME", " secret ", ""])
def test_a_placeholder_token_is_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str, placeholder: str
) -> None:
    message = _refusal(monkeypatch, **{variable: placeholder})

    assert f"{variable} is a development placeholder" in message


@pytest.mark.parametrize("variable", TOKENS)
def test_a_token_of_exactly_32_characters_is_accepted(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    _set(monkeypatch, PRODUCTION | {variable: "r" * 31 + "!"})

    assert load_settings().app.env == "production"


def test_the_local_stacks_s3_credentials_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _refusal(
        monkeypatch,
        TUNELOOP_S3_ACCESS_KEY=DEV_S3_ACCESS_KEY,
        TUNELOOP_S3_SECRET_KEY=DEV_S3_SECRET_KEY,
    )

    assert "TUNELOOP_S3_ACCESS_KEY is the local stack's development default" in message
    assert "TUNELOOP_S3_SECRET_KEY is a development placeholder" in message
    assert DEV_S3_SECRET_KEY not in message
    assert not any(token in message for token in TOKENS)


def test_a_valid_production_configuration_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(monkeypatch, PRODUCTION)

    settings = get_settings()

    assert settings.app.env == "production"
    assert settings.auth.admin_token.get_secret_value() == PRODUCTION["TUNELOOP_AUTH_ADMIN_TOKEN"]
    # NATS has no credential settings, so none to refuse: the local server is anonymous and a
    # deployment's credentials, if any, are in TUNELOOP_NATS_URL (docs/keys.md).
    assert settings.nats.url == "nats://127.0.0.1:4322"


@pytest.mark.parametrize("env", ["development", "test"])
def test_development_takes_the_defaults(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    monkeypatch.setenv("TUNELOOP_ENV", env)

    settings = load_settings()

    assert settings.app.env == env
    assert settings.s3.access_key == DEV_S3_ACCESS_KEY
    assert settings.auth.admin_token.get_secret_value() == "tuneloop-dev-admin"


def test_production_set_explicitly_is_checked_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNELOOP_ENV", "production")

    with pytest.raises(SettingsError, match="TUNELOOP_AUTH_ADMIN_TOKEN"):
        load_settings()


def test_the_makefile_runs_its_targets_as_development() -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("TUNELOOP_")}
    done = subprocess.run(
        ["make", "-s", "--eval", "print-env: ; @echo $$TUNELOOP_ENV", "print-env"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "development"
