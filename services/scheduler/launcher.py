"""`python -m services.scheduler.launcher WORK_DIR -- ARGV...`: run one trainer and record how it
ended in WORK_DIR/exit.json, for the local provider.

It passes SIGTERM and SIGINT on to the trainer (which then checkpoints and exits) and writes the
record atomically once the trainer is gone, so a scheduler that restarted meanwhile still learns
the exit code and, for a signal, its name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

EXIT_FILE = "exit.json"


def _reason(returncode: int) -> str:
    if returncode == 0:
        return "exited normally"
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def run(work_dir: Path, argv: list[str]) -> int:
    child = subprocess.Popen(argv)

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    returncode = child.wait()
    record = {"returncode": returncode, "reason": _reason(returncode)}
    partial = work_dir / (EXIT_FILE + ".partial")
    partial.write_text(json.dumps(record))
    os.replace(partial, work_dir / EXIT_FILE)
    return 0


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: python -m services.scheduler.launcher WORK_DIR -- ARGV...")
    sys.exit(run(Path(args[0]), args[2:]))


if __name__ == "__main__":
    main()
