"""Sampling profile of a running process with py-spy (installed in .venv-bench), summarised as
the functions that hold the CPU: by own time and by time including what they call."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

# py-spy's raw (folded) format: "frame;frame;...;frame count", a frame "function (file:line)".
_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


@dataclass
class Profile:
    samples: int
    own: Counter[str]
    total: Counter[str]
    folded: Path


def record(py_spy: Path, pid: int, duration_s: float, out: Path) -> subprocess.Popen[bytes]:
    """Start sampling `pid` for duration_s; wait on the returned process, then `summarise`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(py_spy), "record", "--pid", str(pid), "--duration", f"{duration_s:.0f}"]
    # --subprocesses: the journal shipper and the OTLP pool are child processes of the service.
    argv += ["--rate", "200", "--format", "raw", "--nonblocking", "--subprocesses"]
    argv += ["--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _name(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{match['function']} ({path})"


def summarise(folded: Path) -> Profile:
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in folded.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_name(f) for f in stack.split(";") if f]
        # Drop the thread / process header py-spy may put first.
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    return Profile(samples, own, total, folded)


def table(profile: Profile, *, top: int = 20) -> Table:
    result = Table(title=f"where the ingest process spends its CPU ({profile.samples} samples)")
    result.add_column("own %", justify="right")
    result.add_column("function (own time)")
    result.add_column("incl. %", justify="right")
    result.add_column("function (including callees)")
    owned = profile.own.most_common(top)
    # Inclusive view: skip the frames every sample has (the event loop, uvicorn's run).
    inclusive = [
        (name, n) for name, n in profile.total.most_common() if n < profile.samples * 0.97
    ][:top]
    for row in range(max(len(owned), len(inclusive))):
        left = owned[row] if row < len(owned) else ("", 0)
        right = inclusive[row] if row < len(inclusive) else ("", 0)
        result.add_row(
            f"{100 * left[1] / profile.samples:.1f}" if left[0] else "",
            left[0],
            f"{100 * right[1] / profile.samples:.1f}" if right[0] else "",
            right[0],
        )
    return result
