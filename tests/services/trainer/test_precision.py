"""`precision: auto` on CPU: bf16 autocast where the CPU has bf16 instructions, fp32 elsewhere
(bf16 is emulated there and slower); an explicit choice always wins."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.trainer.config import Hyperparameters
from services.trainer.model_setup import autocast_dtype, cpu_has_native_bf16

FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f {extra}\nbogomips\t: 4000\n"


@pytest.mark.parametrize(
    ("extra", "native"), [("avx512_bf16", True), ("amx_bf16 amx_tile", True), ("avx512vl", False)]
)
def test_bf16_instructions_are_read_from_cpuinfo(tmp_path: Path, extra: str, native: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(FLAGS.format(extra=extra))
    assert cpu_has_native_bf16(cpuinfo) is native


def test_no_cpuinfo_means_no_bf16(tmp_path: Path) -> None:
    assert cpu_has_native_bf16(tmp_path / "missing") is False


def test_auto_follows_the_cpu_and_an_explicit_choice_wins() -> None:
    cpu = torch.device("cpu")
    expected = torch.bfloat16 if cpu_has_native_bf16() else None
    assert autocast_dtype(Hyperparameters(), cpu) == expected
    assert autocast_dtype(Hyperparameters(precision="fp32"), cpu) is None
    assert autocast_dtype(Hyperparameters(precision="bf16"), cpu) == torch.bfloat16
