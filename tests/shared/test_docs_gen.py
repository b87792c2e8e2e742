"""The generated references (shared/dev/docs_gen): docs/reference/ is what the code makes now, every
settings class and every TUNELOOP_* variable of the code is in the configuration reference with
a description and no secret, every event is in the catalogue, and the description rule reads
comments as documented."""

from __future__ import annotations

import ast
import difflib
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings

from shared.dev.docs_gen import __main__ as docs_main
from shared.dev.docs_gen import fields
from shared.events import CATALOGUE, STREAMS

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
VARIABLE = re.compile(r"TUNELOOP_[A-Z0-9_]*[A-Z0-9]")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The references as the code makes them now, by `make docs`'s own command (a process of
    its own: the generator clears this environment's TUNELOOP_* variables)."""
    out = tmp_path_factory.mktemp("reference")
    done = subprocess.run(
        [sys.executable, "-m", "shared.dev.docs_gen", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _assert_current(generated: Path, name: str) -> None:
    committed = REFERENCE / name
    assert committed.exists(), f"docs/reference/{name} is missing: run `make docs`"
    old, new = committed.read_text(encoding="utf-8"), (generated / name).read_text(encoding="utf-8")
    if old != new:
        diff = difflib.unified_diff(
            old.splitlines(), new.splitlines(), "committed", "from the code", lineterm=""
        )
        head = "\n".join(list(diff)[:30])
        pytest.fail(f"docs/reference/{name} differs from the code: run `make docs`\n{head}")


def test_configuration_reference_is_current(generated: Path) -> None:
    _assert_current(generated, "configuration.md")


def test_event_catalogue_and_asyncapi_are_current(generated: Path) -> None:
    _assert_current(generated, "events.md")
    _assert_current(generated, "asyncapi.json")


def test_openapi_documents_are_current(generated: Path) -> None:
    made = sorted(path.name for path in (generated / "openapi").glob("*.json"))
    committed = sorted(path.name for path in (REFERENCE / "openapi").glob("*.json"))
    assert made == ["evaluator.json", "hoster.json", "ingest.json", "scheduler.json"]
    assert committed == made, "docs/reference/openapi/ has other files: run `make docs`"
    for name in made:
        _assert_current(generated, f"openapi/{name}")


def test_generated_documents_describe_the_code(generated: Path) -> None:
    events = (generated / "events.md").read_text(encoding="utf-8")
    for cls in CATALOGUE.values():
        assert f"### `{cls.event_name}` v{cls.event_version}: `{cls.__name__}`" in events
    # Who builds and who reads events comes from the code: the scheduler builds job.failed,
    # the evaluator reads it on a durable consumer of its own.
    failed = events.split("### `job.failed`")[1].split("###")[0]
    assert "produced by: scheduler (`services/scheduler/lifecycle.py`)" in failed
    assert "evaluator (durable `evaluator__job_failed_v1`)" in failed
    asyncapi = json.loads((generated / "asyncapi.json").read_text(encoding="utf-8"))
    assert asyncapi["asyncapi"] == "3.0.0"
    subjects = {cls.subject_pattern() for cls in CATALOGUE.values()}
    addresses = {channel["address"] for channel in asyncapi["channels"].values()}
    assert addresses <= subjects
    assert "scheduler:publish:JobFailed" in asyncapi["channels"]
    assert "ingest:SampleCaptured" in asyncapi["channels"]  # the batch consumer
    ingest = json.loads((generated / "openapi" / "ingest.json").read_text(encoding="utf-8"))
    assert ingest["info"]["title"] == "tuneloop ingest"
    assert "/v1/datasets" in ingest["paths"]


@functools.cache
def _scan() -> tuple[frozenset[str], tuple[tuple[str, Path], ...]]:
    """One pass over shared/ and services/: the settings classes (module.Class) and every
    string that is a whole TUNELOOP_* name, with its module."""
    classes, names = set(), []
    for top in ("shared", "services"):
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and any(
                    isinstance(base, ast.Name) and base.id == "BaseSettings" for base in node.bases
                ):
                    classes.add(f"{relative.with_suffix('')}.{node.name}".replace("/", "."))
                elif (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and VARIABLE.fullmatch(node.value)
                ):
                    names.append((node.value, relative))
    return frozenset(classes), tuple(names)


def test_every_settings_class_is_in_the_reference() -> None:
    documented = {f"{module}.{cls.__name__}" for module, cls in fields.settings_classes()}
    assert _scan()[0] == documented


def test_every_setting_has_a_description_and_no_secret_shows() -> None:
    for concern in fields.concerns():
        for index, variable in enumerate(concern.variables):
            assert variable.description, f"{variable.names[0]} has no description or comment"
            if index == 0:
                assert variable.description != fields.AS_ABOVE, variable.names[0]
        for name, field in concern.cls.model_fields.items():
            if isinstance(field.default, SecretStr) and field.default.get_secret_value():
                page = (REFERENCE / "configuration.md").read_text(encoding="utf-8")
                assert field.default.get_secret_value() not in page, name


def test_every_tuneloop_variable_of_the_code_is_documented() -> None:
    """A name in a string of the code (an envvar=, os.environ.get, a constant) is in the
    reference, unless it is a stream's name."""
    page = (REFERENCE / "configuration.md").read_text(encoding="utf-8")
    streams = {stream.name for stream in STREAMS}
    missing = {
        f"{name} ({path})"
        for name, path in _scan()[1]
        if name not in streams and f"`{name}`" not in page
    }
    assert not missing, f"not in docs/reference/configuration.md: {sorted(missing)}"


class _Example(BaseSettings):
    # Alpha's own comment,
    # on two lines.
    alpha: int = 1
    beta: int = 2
    gamma: int = Field(default=3, description="gamma's own")
    delta: int = 4

    epsilon: int = 5
    # Zeta's.
    zeta: str = ""
    eta: SecretStr = SecretStr("tuneloop-dev-secret")


def test_descriptions_follow_the_documented_rule() -> None:
    comments = fields.field_comments(_Example)
    assert comments["alpha"] == "Alpha's own comment, on two lines."
    assert comments["beta"] == fields.AS_ABOVE  # right below a commented field
    assert "gamma" in comments  # the group goes on, but its description wins...
    assert "delta" not in comments  # ...and a described field heads no group
    assert "epsilon" not in comments  # a blank line ends a group
    assert comments["eta"] == fields.AS_ABOVE
    assert fields.field_comments(_Example, groups=False).keys() == {"alpha", "zeta"}
    eta = _Example.model_fields["eta"]
    assert "tuneloop-dev-secret" not in fields.default_of(eta)
    assert "production" in fields.default_of(eta)


def test_a_stale_reference_is_named(tmp_path: Path) -> None:
    (tmp_path / "openapi").mkdir()
    (tmp_path / "events.md").write_text("old\n")
    (tmp_path / "openapi" / "gone.json").write_text("{}\n")
    files = {"events.md": "new\n", "configuration.md": "same\n"}
    (tmp_path / "configuration.md").write_text("same\n")
    problems = docs_main.stale(files, tmp_path)
    assert len(problems) == 2
    assert problems[0].startswith("events.md differs from the code")
    assert "+new" in problems[0]
    assert "-old" in problems[0]
    assert problems[1] == "openapi/gone.json is not generated any more"
