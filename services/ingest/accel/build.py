"""`python -m services.ingest.accel.build`: compile the modules `services.ingest.accel` lists
(Cython) into .tuneloop/accel/, with the manifest of source digests its finder checks. `make
install` runs it with `--if-stale` (the list lives only in services.ingest.accel.MODULES, so make
cannot know which files a build depends on: the manifest's digests say whether it is current);
it needs a C compiler and the Python headers."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import orjson

from services.ingest.accel import DEFAULT_DIR, MANIFEST, MODULES, ROOT, abi, digest, source_path

# Python semantics exactly: type annotations are not turned into C-level checks (a `str`
# annotation would otherwise refuse str subclasses), and functions stay introspectable.
_DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True}


def build(
    out: Path = DEFAULT_DIR, *, modules: Sequence[str] = MODULES, root: Path = ROOT
) -> dict[str, str]:
    """Compile `modules` (sources under `root`) into `out`, replacing what was there, and write
    the manifest the finder reads. Returns module -> compiled library path (relative to out)."""
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    # Hashed before compiling: a source edited during the build is then seen as stale.
    digests = {name: digest(source_path(name, root)) for name in modules}
    workers = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="tuneloop-accel-") as tmp:
        # gcc 12 warns (array-bounds) on code every Cython module has; it is not ours to fix.
        flags = ["-Wno-array-bounds"]
        extensions = [
            Extension(name, [str(source_path(name, root))], extra_compile_args=flags)
            for name in modules
        ]
        compiled = cythonize(  # type: ignore[no-untyped-call]
            extensions,
            build_dir=str(Path(tmp) / "c"),
            compiler_directives=_DIRECTIVES,
            nthreads=workers,
            quiet=True,
        )
        command = build_ext(Distribution({"ext_modules": compiled}))
        command.build_lib = str(Path(tmp) / "lib")
        command.build_temp = str(Path(tmp) / "tmp")
        command.parallel = workers
        command.ensure_finalized()
        command.run()
        shutil.rmtree(out, ignore_errors=True)
        libraries: dict[str, str] = {}
        for name in modules:
            built = Path(command.get_ext_fullpath(name))
            target = out / built.relative_to(command.build_lib)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, target)
            libraries[name] = str(target.relative_to(out))
    manifest = {
        "abi": abi(),
        "modules": {n: {"library": libraries[n], "sha256": digests[n]} for n in modules},
    }
    (out / MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return libraries


def current(
    out: Path = DEFAULT_DIR, *, modules: Sequence[str] = MODULES, root: Path = ROOT
) -> bool:
    """Whether `out` holds a build of exactly `modules`, for this interpreter, from their
    sources as they are now (each library present): then there is nothing to rebuild."""
    try:
        manifest = orjson.loads((out / MANIFEST).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    built = manifest.get("modules", {})
    if manifest.get("abi") != abi() or set(built) != set(modules):
        return False
    return all(
        (out / built[name]["library"]).is_file()
        and built[name]["sha256"] == digest(source_path(name, root))
        for name in modules
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m services.ingest.accel.build", description=__doc__
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR)
    parser.add_argument(
        "--if-stale",
        action="store_true",
        help="build only when the build is missing or any listed module changed (make install)",
    )
    args = parser.parse_args(argv)
    if args.if_stale and current(args.out):
        print(f"{args.out}: up to date ({len(MODULES)} modules)")
        return
    libraries = build(args.out)
    print(f"compiled {len(libraries)} modules into {args.out}")


if __name__ == "__main__":
    main()
