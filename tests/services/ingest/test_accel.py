"""services.ingest.accel: a compiled module is used only while its source is the one it was built from."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from services.ingest import accel
from services.ingest.accel.build import build, current

ROOT = Path(__file__).resolve().parents[3]
PROBE = """
def greet(name: str) -> str:
    return f"hello {name}"


class Box:
    def __init__(self, value):
        self.value = value
"""


def _load(spec: importlib.machinery.ModuleSpec) -> object:
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def probe_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A one-module project compiled the way `make install` compiles ours: (root, build dir)."""
    root = tmp_path_factory.mktemp("project")
    (root / "accel_probe.py").write_text(PROBE)
    out = root / "build"
    libraries = build(out, modules=["accel_probe"], root=root)
    assert (out / libraries["accel_probe"]).is_file()
    return root, out


def test_a_current_build_is_loaded_compiled(probe_build: tuple[Path, Path]) -> None:
    root, out = probe_build
    finder = accel.finder_for(out, root=root)
    assert isinstance(finder, accel.CompiledFinder)
    spec = finder.find_spec("accel_probe", None)
    assert spec is not None
    assert spec.origin is not None
    assert spec.origin.endswith(".so")
    module = _load(spec)
    assert accel.is_compiled(module)  # type: ignore[arg-type]
    assert module.greet("ada") == "hello ada"  # type: ignore[attr-defined]
    assert module.Box(3).value == 3  # type: ignore[attr-defined]
    assert finder.loaded == ["accel_probe"]
    assert finder.stale == []
    assert finder.find_spec("json", None) is None  # not ours: the normal import system's


def test_an_edited_source_is_imported_from_source(
    probe_build: tuple[Path, Path], tmp_path: Path
) -> None:
    _root, out = probe_build
    edited = tmp_path / "accel_probe.py"
    edited.write_text(PROBE.replace("hello", "hi"))
    finder = accel.finder_for(out, root=tmp_path)  # the same build, the edited source
    assert isinstance(finder, accel.CompiledFinder)
    assert finder.find_spec("accel_probe", None) is None
    assert finder.stale == ["accel_probe"]


def test_no_build_or_a_build_for_another_interpreter_is_not_used(
    probe_build: tuple[Path, Path], tmp_path: Path
) -> None:
    root, out = probe_build
    assert "no build" in str(accel.finder_for(tmp_path / "nothing", root=root))
    other = tmp_path / "other"
    other.mkdir()
    manifest = orjson.loads((out / accel.MANIFEST).read_bytes())
    manifest["abi"]["cache_tag"] = "cpython-399"
    (other / accel.MANIFEST).write_bytes(orjson.dumps(manifest))
    assert "is for" in str(accel.finder_for(other, root=root))


def test_make_install_rebuilds_only_when_a_listed_source_or_the_list_changed(
    probe_build: tuple[Path, Path], tmp_path: Path
) -> None:
    """`python -m services.ingest.accel.build --if-stale` (make install) skips a current build."""
    root, out = probe_build
    assert current(out, modules=["accel_probe"], root=root)
    edited = tmp_path / "accel_probe.py"
    edited.write_text(PROBE.replace("hello", "hi"))
    assert not current(out, modules=["accel_probe"], root=tmp_path)  # a source changed
    (tmp_path / "other_probe.py").write_text(PROBE)
    assert not current(out, modules=["accel_probe", "other_probe"], root=root)  # the list grew
    assert not current(tmp_path / "nothing", modules=["accel_probe"], root=root)  # no build
    missing = tmp_path / "copy"
    shutil.copytree(out, missing)
    library = orjson.loads((missing / accel.MANIFEST).read_bytes())["modules"]["accel_probe"]
    (missing / library["library"]).unlink()
    assert not current(missing, modules=["accel_probe"], root=root)  # its library is gone


def _finder_in(code: str, opt_in: str) -> str:
    """What a fresh process running `code` says of the finder, with TUNELOOP_INGEST_ACCEL=opt_in."""
    code += "; import sys; from services.ingest import accel; "
    code += "print(any(isinstance(f, accel.CompiledFinder) for f in sys.meta_path), accel.status().describe())"
    env = {**os.environ, accel.OPT_IN: opt_in}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


def test_the_finder_is_opt_in() -> None:
    """Off unless the ingest setting opts in; on, it is in place before any listed module."""
    assert _finder_in("import services.ingest", "0").startswith(
        "False compiled modules off: not opted in"
    )
    opted = _finder_in("import services.ingest.otlp.workers", "1")
    if "no build" in opted or "is for" in opted:
        pytest.skip(opted)
    every = len(accel.MODULES)
    assert opted.startswith(f"True compiled modules on ({every} of {every} imported)"), opted


def test_the_kernel_never_installs_it() -> None:
    """`shared` (which the trainer and every service import) installs nothing, opted in or not."""
    code = "import shared, shared.settings, shared.redact; import sys; "
    code += "print([type(f).__name__ for f in sys.meta_path if 'Compiled' in type(f).__name__])"
    env = {**os.environ, accel.OPT_IN: "1"}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"
