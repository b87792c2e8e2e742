"""How much memory a training run needs, by method and precision, and whether a rung has it.

KNOWLEDGE.md's rule: weights + gradients + optimizer states + activations, plus headroom.
- weights: parameters x bytes (fp32 4, bf16 2; QLoRA's 4-bit base 0.5);
- a full fine-tune with AdamW in mixed precision: ~16 bytes a parameter before activations
  (weights, gradients, fp32 master copy, two moments), sharded across devices (FSDP);
- LoRA: the frozen base costs its weights only, on every device (each holds a replica); the
  adapters (rank r on every linear layer of every block) and their training state are small;
- activations: per token and layer about 17 values of the hidden size (attention and MLP inputs,
  their outputs and norms; Korthikanti et al.'s 34·h bytes at 2 bytes a value), per device for
  its rows; gradient checkpointing keeps only each layer's input (1 value).

It is an estimate for choosing and refusing rungs, not an allocator's count: it leaves out the
attention score matrices (flash/SDPA kernels do not keep them) and allocator fragmentation, which
the 15 % headroom stands for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.catalogue import CatalogueEntry

Method = Literal["lora", "qlora", "full"]
GIB = 1024**3
HEADROOM = 1.15
_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}
# Bytes a trainable parameter costs in mixed-precision AdamW: bf16 weight and gradient, fp32
# master weight, two fp32 moments (2 + 2 + 4 + 8 = 16, KNOWLEDGE.md).
_TRAINABLE_BYTES = 16.0
_ACTIVATION_VALUES = 17.0  # per token, layer and hidden unit, without checkpointing
# Linear layers of a block: q, k, v, o (hidden x hidden) and gate, up, down (hidden x mlp).


@dataclass(frozen=True)
class MemoryEstimate:
    weights_gib: float
    training_state_gib: float  # trainable parameters' gradients and optimizer states
    activations_gib: float
    devices: int

    @property
    def total_gib(self) -> float:
        """What one device needs, headroom included."""
        return (self.weights_gib + self.training_state_gib + self.activations_gib) * HEADROOM

    def describe(self) -> str:
        return (
            f"{self.total_gib:.1f} GiB a device (weights {self.weights_gib:.2f}, gradients and "
            f"optimizer {self.training_state_gib:.2f}, activations {self.activations_gib:.2f}, "
            f"+{HEADROOM - 1:.0%} headroom, over {self.devices} device(s))"
        )


def lora_parameters(model: CatalogueEntry, rank: int) -> int:
    """Adapter parameters with rank `rank` on every linear layer of every block."""
    attention = 4 * rank * (model.hidden_size + model.hidden_size)
    mlp = 3 * rank * (model.hidden_size + model.intermediate_size)
    return model.layers * (attention + mlp)


def training_memory(
    model: CatalogueEntry,
    *,
    method: Method,
    precision: str,
    rows: int,
    row_len: int,
    devices: int = 1,
    lora_rank: int = 16,
    gradient_checkpointing: bool = False,
) -> MemoryEstimate:
    """One device's share of a run of `rows` rows of `row_len` tokens a micro-batch on it."""
    width = _BYTES.get(precision, 4.0)
    if method == "full":
        weights = model.parameters * width / devices
        state = model.parameters * (_TRAINABLE_BYTES - width) / devices
    else:
        base = 0.5 if method == "qlora" else width
        weights = model.parameters * base
        state = lora_parameters(model, lora_rank) * _TRAINABLE_BYTES
    values = 1.0 if gradient_checkpointing else _ACTIVATION_VALUES
    activations = rows * row_len * model.layers * model.hidden_size * values * width
    return MemoryEstimate(weights / GIB, state / GIB, activations / GIB, devices)


def device_precision(device: str) -> str:
    """What the trainer computes in on a device class: bf16 on a GPU, fp32 on a CPU (the
    estimate's upper bound there: bf16 autocast is used only where the CPU has it)."""
    return "fp32" if device == "cpu" else "bf16"


def fits(estimate: MemoryEstimate, device_memory_gib: float) -> bool:
    return estimate.total_gib <= device_memory_gib


# The smallest run the recipe plans: one row of this many tokens (or the context, if shorter).
SMALLEST_ROW = 512


def smallest_run(model: CatalogueEntry, device: str, devices: int) -> MemoryEstimate:
    """What the smallest LoRA run of `model` needs on one device of a rung."""
    return training_memory(
        model,
        method="lora",
        precision=device_precision(device),
        rows=1,
        row_len=min(SMALLEST_ROW, model.context_length),
        devices=devices,
    )
