"""Training speed per device class: what the recipe plans steps and wall-clock time from.

Each row says where its numbers come from. The CPU row was measured on the project's 2-core
machines with SmolLM2-135M-Instruct and LoRA rank 16 on every linear layer (KNOWLEDGE.md,
"Measured here"); the GPU rows are estimates scaled from published H100 LoRA throughput and are
labelled as such until a run on that class replaces them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

DeviceClass = Literal["cpu", "gpu-24g", "gpu-80g"]


@dataclass(frozen=True)
class Throughput:
    """Row tokens (pads included) a second for a ~135M-parameter model, by row length."""

    device: DeviceClass
    # (row length in tokens, tokens a second): a packed row pays attention over its whole
    # length, so long rows train slower on CPU; interpolated between the points.
    points: tuple[tuple[int, float], ...]
    # Tokens an optimizer step should carry on this class (rows x row length x accumulation).
    tokens_per_step: int
    # Rows one micro-batch may hold before memory, not speed, is the limit.
    max_rows: int
    # Seconds to score one eval point of `eval_items` items on a warm engine beside training.
    eval_point_s: float
    eval_items: int
    # Seconds a step takes longer while an eval shares the machine (2 cores: ~4-6 s vs 2.4 s).
    eval_slowdown: float
    source: str

    def tokens_per_s(self, row_len: int, params: int) -> float:
        """Interpolated speed at `row_len`, scaled inversely with model size from ~135M."""
        points = sorted(self.points)
        if row_len <= points[0][0]:
            speed = points[0][1]
        elif row_len >= points[-1][0]:
            speed = points[-1][1]
        else:
            speed = points[-1][1]
            for (x0, y0), (x1, y1) in itertools.pairwise(points):
                if x0 <= row_len <= x1:
                    speed = y0 + (y1 - y0) * (row_len - x0) / (x1 - x0)
                    break
        return speed * min(1.0, 135e6 / max(params, 1))


THROUGHPUT: dict[DeviceClass, Throughput] = {
    "cpu": Throughput(
        device="cpu",
        # Row tokens a second, pads included, as the trainer ran inside `make demo` (2 threads,
        # bf16 autocast on AVX512-BF16 cores, checkpoints and reports included), 2026-12-05: 46
        # steps of one 224-token row every 68 s, 18 s of which an eval point; 1024-token rows
        # scaled by KNOWLEDGE.md's 205/245 (attention over the whole row).
        points=((256, 205.0), (1024, 172.0)),
        tokens_per_step=1024,
        max_rows=8,
        eval_point_s=18.0,
        eval_items=16,
        # The trainer all but stops while the eval engine generates (3 threads on 2 cores).
        eval_slowdown=2.0,
        source="measured in make demo: 2 CPU cores, SmolLM2-135M, LoRA r16, bf16 autocast",
    ),
    "gpu-24g": Throughput(
        device="gpu-24g",
        points=((512, 20_000.0), (4096, 30_000.0)),
        tokens_per_step=16_384,
        max_rows=16,
        eval_point_s=5.0,
        eval_items=64,
        eval_slowdown=1.1,
        source="estimate for a 24 GB GPU (no run on this class yet)",
    ),
    "gpu-80g": Throughput(
        device="gpu-80g",
        points=((512, 40_000.0), (4096, 60_000.0)),
        tokens_per_step=32_768,
        max_rows=64,
        eval_point_s=3.0,
        eval_items=64,
        eval_slowdown=1.05,
        source="estimate for an 80 GB GPU (no run on this class yet)",
    ),
}
