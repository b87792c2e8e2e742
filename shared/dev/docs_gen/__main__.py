"""`python -m shared.dev.docs_gen [--out DIR] [--check]`: write docs/reference/ (`make docs`), or
say which of its files the code no longer matches (exit 1)."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import tempfile
from pathlib import Path

from shared.dev.docs_gen import apps, asyncapi, configuration, event_catalogue, wiring

REFERENCE = wiring.ROOT / "docs" / "reference"
OPENAPI = "openapi"


def generate() -> dict[str, str]:
    """Every generated file: its path under docs/reference/ -> its text."""
    built = apps.build_apps()
    brokers = {service: apps.broker_of(app) for service, app in built.items()}
    files = {
        "configuration.md": configuration.render(),
        # Consumers first: asyncapi adds declared publishers and batch subscribers to the brokers.
        "events.md": event_catalogue.render(wiring.consumers(brokers)),
        "asyncapi.json": asyncapi.render(brokers),
    }
    for service, app in built.items():
        files[f"{OPENAPI}/{service}.json"] = apps.openapi(app)
    return files


def stale(files: dict[str, str], directory: Path) -> list[str]:
    """What differs in `directory` from `files`, a line each, with the start of each diff;
    a generated file no longer made (an OpenAPI document of a service gone) counts too."""
    problems = []
    for name, text in sorted(files.items()):
        path = directory / name
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old != text:
            diff = difflib.unified_diff(
                old.splitlines(),
                text.splitlines(),
                f"{name} (committed)",
                f"{name} (code)",
                lineterm="",
            )
            problems.append(f"{name} differs from the code:\n" + "\n".join(list(diff)[:40]))
    for path in sorted((directory / OPENAPI).glob("*.json")):
        if f"{OPENAPI}/{path.name}" not in files:
            problems.append(f"{OPENAPI}/{path.name} is not generated any more")
    return problems


def write(files: dict[str, str], directory: Path) -> None:
    for path in (directory / OPENAPI).glob("*.json"):
        if f"{OPENAPI}/{path.name}" not in files:
            path.unlink()
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.dev.docs_gen", description=__doc__)
    parser.add_argument("--out", type=Path, default=REFERENCE, help="default: docs/reference")
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    with tempfile.TemporaryDirectory(prefix="tuneloop-docs-") as scratch:
        # Defaults only: no variable of this shell and no .env of the working directory.
        apps.clean_environment(Path(scratch) / "data")
        os.chdir(scratch)
        files = generate()
    if args.check:
        problems = stale(files, out)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("docs/reference/ is out of date: run `make docs`", file=sys.stderr)
        return 1 if problems else 0
    write(files, out)
    print(f"wrote {len(files)} files under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
