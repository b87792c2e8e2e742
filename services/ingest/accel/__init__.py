"""Compiled copies of ingest's hottest pure-Python modules, used only while they match their
source, and only when the ingest setting `accel` (TUNELOOP_INGEST_ACCEL=1) opts in.

OTLP decoding, trace assembly and secret scrubbing are CPU-bound Python that runs for every
span (otlp/workers.py). Compiled by Cython from the unchanged `.py` files they cost 10-16 %
fewer instructions a span (measured on one 2-core VM, docs/ingest.md). The source stays the one
truth: a compiled module is imported only when the sha256 of its source equals the one recorded
when it was built, so an edited module is never shadowed by a stale build, and without a build
(no C compiler) everything runs as before.

    python -m services.ingest.accel.build --if-stale   # what `make install` runs; .tuneloop/accel/

`install_if_opted_in()` runs when the `services.ingest` package is imported, so the service's
process, its uvicorn workers and its OTLP pool's processes (which import the function they run
from this package) all put the finder first on `sys.meta_path` before any listed module is
imported. It is off by default: the trainer, the other services and the tests never get it, and
py-spy and cProfile cannot see inside compiled functions.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import orjson

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_DIR = ROOT / ".tuneloop" / "accel"
MANIFEST = "manifest.json"
ENV_DIR = "TUNELOOP_ACCEL_DIR"
OPT_IN = "TUNELOOP_INGEST_ACCEL"  # the ingest setting `accel`

# The one list of what is compiled: modules that run per span or per sample and are plain Python
# (no pydantic models defined in them: a model's class body is best left to the interpreter
# pydantic was written for). `make install` builds exactly these (build.py).
MODULES: tuple[str, ...] = (
    "services.ingest.otlp.decode_json",
    "services.ingest.otlp.json_values",
    "services.ingest.otlp.decode_proto",
    "services.ingest.otlp.genai_spans",
    "services.ingest.otlp.genai_assembly",
    "services.ingest.otlp.genai_calls",
    "services.ingest.otlp.genai_conventions",
    "services.ingest.otlp.genai_messages",
    "services.ingest.otlp.genai_parts",
    "services.ingest.otlp.genai_meta",
    "services.ingest.otlp.genai_sample",
    "services.ingest.capture.scrub",
    "shared.redact",
)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_path(module: str, root: Path) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def abi() -> dict[str, str]:
    """What a compiled module is only good for: this interpreter's ABI on this platform."""
    return {"cache_tag": sys.implementation.cache_tag or "", "platform": sysconfig.get_platform()}


# --- loading ------------------------------------------------------------------------------------


@dataclass
class CompiledFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled build of a listed module whose source is unchanged since the build."""

    # module -> (compiled library, source file, the source's sha256 at build time)
    entries: dict[str, tuple[Path, Path, str]]
    loaded: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        entry = self.entries.get(fullname)
        if entry is None:
            return None
        library, source, expected = entry
        if not library.is_file() or not source.is_file() or digest(source) != expected:
            self.stale.append(fullname)  # imported from source, as if there were no build
            return None
        self.loaded.append(fullname)
        return importlib.util.spec_from_file_location(fullname, library)


@dataclass(frozen=True)
class Status:
    """Whether compiled modules are in use, for service start-up logs and benchmark reports."""

    active: bool
    reason: str
    finder: CompiledFinder | None = None

    def describe(self) -> str:
        if self.finder is None:
            return f"compiled modules off: {self.reason}"
        loaded, stale = self.finder.loaded, self.finder.stale
        text = f"compiled modules on ({len(loaded)} of {len(self.finder.entries)} imported)"
        return text + (
            f"; from source, edited since the build: {', '.join(stale)}" if stale else ""
        )


_status = Status(False, "not installed")


def finder_for(directory: Path, *, root: Path = ROOT) -> CompiledFinder | str:
    """A finder for the build in `directory` of the sources under `root`, or why there is none."""
    try:
        manifest = orjson.loads((directory / MANIFEST).read_bytes())
    except FileNotFoundError:
        return f"no build in {directory} (python -m services.ingest.accel.build)"
    if manifest.get("abi") != abi():
        return f"the build in {directory} is for {manifest.get('abi')}, not {abi()}"
    return CompiledFinder(
        {
            name: (directory / item["library"], source_path(name, root), item["sha256"])
            for name, item in manifest["modules"].items()
        }
    )


def install(directory: Path | None = None) -> Status:
    """Put the finder for the build in `directory` (default .tuneloop/accel, or
    $TUNELOOP_ACCEL_DIR) first on sys.meta_path; once per process."""
    global _status
    if _status.finder is not None:
        return _status
    directory = directory or Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)
    finder = finder_for(directory)
    if isinstance(finder, str):
        _status = Status(False, finder)
        return _status
    sys.meta_path.insert(0, finder)
    _status = Status(True, f"built in {directory}", finder)
    return _status


def install_if_opted_in() -> Status:
    """install() when the ingest setting `accel` is on (TUNELOOP_INGEST_ACCEL, or .env)."""
    from pydantic import ValidationError

    from services.ingest.config import IngestSettings

    global _status
    try:
        opted_in = IngestSettings().accel
    except ValidationError:
        # Not this module's to report: the service names its invalid settings when it reads them.
        _status = Status(False, "the ingest settings do not validate")
        return _status
    if not opted_in:
        _status = Status(False, f"not opted in ({OPT_IN}=1)")
        return _status
    return install()


def status() -> Status:
    return _status


def is_compiled(module: ModuleType) -> bool:
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)
