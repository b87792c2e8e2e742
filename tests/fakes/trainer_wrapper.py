"""`python -m tests.fakes.trainer_wrapper run ...`: the trainer, made to fail or slow down.

Test-side wrappers only (no production setting does either), both through the loss:
- TUNELOOP_TEST_NAN_MARKER: while the file it names does not exist yet, the loss of the
  NAN_AFTER-th micro-batch is NaN and the file is created, so the first attempt diverges and
  every later one trains normally;
- TUNELOOP_TEST_STEP_DELAY_S: every micro-batch takes this much longer, so a run lasts long
  enough for a time limit to bite however fast the machine is.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional

from services.trainer.__main__ import main

NAN_AFTER = 5


def _wrap_loss(nan_marker: Path | None, delay_s: float) -> None:
    original = torch.nn.functional.cross_entropy
    calls = 0

    def cross_entropy(*args: Any, **kwargs: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if delay_s:
            time.sleep(delay_s)
        loss = original(*args, **kwargs)
        if nan_marker is not None and calls == NAN_AFTER and not nan_marker.exists():
            nan_marker.touch()
            return loss * float("nan")
        return loss

    torch.nn.functional.cross_entropy = cross_entropy


if __name__ == "__main__":
    marker = os.environ.get("TUNELOOP_TEST_NAN_MARKER")
    _wrap_loss(
        Path(marker) if marker else None, float(os.environ.get("TUNELOOP_TEST_STEP_DELAY_S", "0"))
    )
    sys.exit(main())
