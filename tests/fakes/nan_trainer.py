"""`python -m tests.fakes.nan_trainer run ...`: the trainer, whose loss turns NaN once.

A test-side wrapper (no production setting makes a NaN): when the file named by
TUNELOOP_TEST_NAN_MARKER does not exist yet, the loss of the NAN_AFTER-th micro-batch is NaN and
the file is created, so the first attempt diverges and every later one trains normally.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional

from services.trainer.__main__ import main

NAN_AFTER = 5


def _poison_once(marker: Path) -> None:
    original = torch.nn.functional.cross_entropy
    calls = 0

    def cross_entropy(*args: Any, **kwargs: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        loss = original(*args, **kwargs)
        if calls == NAN_AFTER and not marker.exists():
            marker.touch()
            return loss * float("nan")
        return loss

    torch.nn.functional.cross_entropy = cross_entropy


if __name__ == "__main__":
    if marker := os.environ.get("TUNELOOP_TEST_NAN_MARKER"):
        _poison_once(Path(marker))
    sys.exit(main())
