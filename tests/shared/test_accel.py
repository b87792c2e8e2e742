"""shared.accel: a compiled module is used only while its source is the one it was built from."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import orjson
import pytest

from shared import accel
from shared.accel_build import build, current

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
    """`python -m shared.accel_build --if-stale` (make install) skips a current build."""
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


def test_this_process_uses_the_build_when_it_is_current() -> None:
    """What `make install` built is what the tests (and services) run, unless switched off."""
    status = accel.status()
    if not status.active:
        pytest.skip(f"no compiled modules here: {status.reason}")
    assert status.finder is not None
    assert status.finder in sys.meta_path
    for name in status.finder.loaded:
        assert accel.is_compiled(sys.modules[name]), name
