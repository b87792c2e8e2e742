"""The base-model catalogue: valid ids, lookups that list the known ids, the rule for what a
`base_model` may name, `prepare` for every entry, and entries that match the real converted model."""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer

from shared.catalogue import (
    CATALOGUE,
    SMOLLM2_135M_INSTRUCT,
    CatalogueEntry,
    CatalogueError,
    check_base_model,
    get_entry,
    locate,
)
from shared.dev import base_models
from shared.dev.base_models import REQUIRED_FILES, BaseModelError, is_complete_conversion
from shared.settings import get_settings

SMOL = SMOLLM2_135M_INSTRUCT.id
BUCKET = "tuneloop"


def test_every_id_is_slash_free_and_a_bad_one_is_refused() -> None:
    assert SMOL in CATALOGUE
    assert all("/" not in model_id and model_id == e.id for model_id, e in CATALOGUE.items())
    for bad in ("HuggingFaceTB/SmolLM2-135M-Instruct", "../x", "", "-x", "a b"):
        with pytest.raises(CatalogueError, match="must match"):
            CatalogueEntry(bad, "x", "x", 1, "chatml", 1, "MIT", 1, 8, 16)


def test_an_unknown_id_names_the_known_ones() -> None:
    assert get_entry(SMOL) is SMOLLM2_135M_INSTRUCT
    with pytest.raises(CatalogueError, match=rf"model: 'gpt2' is not in .*\({SMOL}\)"):
        get_entry("gpt2", field="model")


@pytest.mark.parametrize(
    "value",
    [SMOL, f"s3://{BUCKET}/tenants/acme/models/mine/", f"s3://{BUCKET}/tenants/acme/m"],
)
def test_a_catalogue_id_or_the_tenants_own_prefix_is_accepted(value: str) -> None:
    assert check_base_model(value, tenant="acme", bucket=BUCKET) == value


@pytest.mark.parametrize(
    "value",
    [
        "/work/main/.tuneloop/models/SmolLM2-135M-Instruct",  # the service's disk
        "HuggingFaceTB/SmolLM2-135M-Instruct",  # a hub name: no hub here
        "smollm2",
        f"s3://{BUCKET}/tenants/globex/models/theirs/",  # another tenant
        f"s3://{BUCKET}/tenants/acme-2/models/x/",  # a tenant whose id extends ours
        f"s3://{BUCKET}/tenants/acme/",  # the whole tenant, not a model
        f"s3://{BUCKET}/tenants/acme/../globex/models/x/",
        "s3://other-bucket/tenants/acme/models/x/",
        f"s3://{BUCKET}/models/{SMOL}/",
    ],
)
def test_anything_else_is_refused_naming_base_model(value: str) -> None:
    with pytest.raises(CatalogueError, match=r"^base_model: "):
        check_base_model(value, tenant="acme", bucket=BUCKET)


def test_locate_finds_a_prepared_model_and_names_the_fix_otherwise(tmp_path: Path) -> None:
    with pytest.raises(CatalogueError, match=r"not prepared .* run `make model`"):
        locate(SMOL, data_dir=tmp_path)
    model_dir = tmp_path / "models" / SMOL
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    assert locate(SMOL, data_dir=tmp_path) == str(model_dir)
    prefix = "s3://b/tenants/acme/m/"
    assert locate(prefix, data_dir=tmp_path) == prefix


# --- preparing entries (`make model`), with a stand-in for the (30 s) dequantisation ------------


@pytest.fixture
def fake_conversion(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[Path]]:
    gguf = tmp_path / "src" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(range(64)))
    calls: list[Path] = []

    def write(gguf_path: Path, work_dir: Path) -> None:
        calls.append(work_dir)
        for name in REQUIRED_FILES:
            (work_dir / name).write_text(name)

    monkeypatch.setattr(base_models, "_write_conversion", write)
    monkeypatch.setattr(base_models, "smollm2_gguf_path", lambda: gguf)
    monkeypatch.setenv("TUNELOOP_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    yield calls
    get_settings.cache_clear()


def test_every_entry_has_a_preparer() -> None:
    assert set(base_models._PREPARERS) == set(CATALOGUE)


def test_prepare_puts_each_entry_in_the_data_dir_once(
    fake_conversion: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert base_models.main(["prepare"]) == 0
    target = tmp_path / "data" / "models" / SMOL
    assert is_complete_conversion(target)
    assert locate(SMOL, data_dir=tmp_path / "data") == str(target)
    assert base_models.main(["prepare", SMOL]) == 0
    assert len(fake_conversion) == 1
    out = capsys.readouterr().out
    assert f"{SMOL}: wrote" in out
    assert f"{SMOL}: already prepared" in out


def test_prepare_of_an_unknown_id_lists_the_known_ones(
    fake_conversion: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BaseModelError, match=SMOL):
        base_models.prepare("gpt2")
    with pytest.raises(SystemExit) as exited:
        base_models.main(["prepare", "gpt2"])
    assert exited.value.code == 1
    assert SMOL in capsys.readouterr().err
    assert not fake_conversion


# --- the entry against the real converted model -----------------------------------------------


@pytest.mark.slow
def test_smollm2_entry_matches_the_converted_model(smollm2_dir: Path) -> None:
    config = AutoConfig.from_pretrained(smollm2_dir)
    assert config.max_position_embeddings == SMOLLM2_135M_INSTRUCT.context_length
    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as weights:
        parameters = sum(math.prod(weights.get_slice(k).get_shape()) for k in weights.keys())  # noqa: SIM118
    assert parameters == SMOLLM2_135M_INSTRUCT.parameters
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert SMOLLM2_135M_INSTRUCT.chat_template == "chatml"
    assert "<|im_start|>user\nhi<|im_end|>" in rendered


def test_make_up_prepares_the_model_first_and_only_once(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]

    def dry_run() -> list[str]:
        env = {**os.environ, "TUNELOOP_DATA_DIR": str(tmp_path)}
        done = subprocess.run(
            ["make", "-n", "up"], cwd=root, env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.splitlines()

    lines = dry_run()
    prepare = [i for i, line in enumerate(lines) if f"base_models prepare {SMOL}" in line]
    start = [i for i, line in enumerate(lines) if line.endswith("tuneloop up")]
    assert prepare, lines
    assert start, lines
    assert prepare[0] < start[0], lines
    # Once prepared (its conversion stamp), `make up` goes straight to starting the stack.
    stamped = tmp_path / "models" / SMOL / base_models.STAMP_NAME
    stamped.parent.mkdir(parents=True)
    stamped.write_text("{}")
    assert not any("base_models prepare" in line for line in dry_run())
