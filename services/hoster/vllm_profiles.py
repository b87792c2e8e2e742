"""vLLM's settings per GPU class for a catalogue model, sized by KNOWLEDGE.md's serving rule
(no hand-typed numbers): what `vllm serve` gets as --gpu-memory-utilization, --max-num-seqs,
--max-loras, --max-lora-rank and --max-model-len.

    total ≈ weights + KV cache + activations + headroom (never under 10 %)

- weights: parameters x 2 bytes (vLLM's `--dtype auto` serves fp32 and fp16 checkpoints in fp16,
  bf16 ones in bf16);
- activations: 10 % of the weights (vLLM-class engines), plus a fixed `CUDA_OVERHEAD_GIB` for the
  CUDA context, kernel workspaces and CUDA graphs (ours: 10 % of a 135M model's weights is 25 MB);
- LoRA slots: vLLM reserves `max_loras` adapters of `max_lora_rank` on the GPU, each rank r on
  every linear layer of every block (2 bytes a parameter); they get up to `LORA_SHARE` of what
  the weights leave, `MAX_LORAS` at most, at the highest rank that fits (`RANK_CEILING`);
- KV cache per token = 2 (K and V) x layers x hidden size x KV heads / heads x 2 bytes; a
  sequence of `max_model_len` tokens costs that many times it, and `max_num_seqs` sequences at
  `max_model_len` all fit at once (so a full batch is never preempted).

`max_model_len` is the model's context, shortened (to a multiple of 1024, not under 2048) where
`MIN_SEQS` (32) full-length sequences would not fit; `max_num_seqs` is what the cache then holds, up
to vLLM's default of 256. `gpu_memory_utilization` is what all of it needs, rounded up, at most
0.90 (the 10 % headroom): a small model leaves the rest of a large GPU free for another engine.

vLLM pages its cache, so sequences shorter than `max_model_len` let more run; these numbers are
the bound at which none has to wait for memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from shared.catalogue import CATALOGUE, CatalogueEntry

GIB: Final = 1024**3
# Each GPU class's memory as nvidia-smi reports it (MiB), by the ladder's device-class names.
GPU_MEMORY_MIB: Final[dict[str, int]] = {
    "nvidia-l4": 23034,
    "nvidia-a10g": 23028,
    "nvidia-a100-80gb": 81920,
    "nvidia-h100": 81559,
    "nvidia-h200": 143771,
}
MAX_UTILIZATION: Final = 0.90  # KNOWLEDGE.md: headroom 10-20 %, never under 10 %
WEIGHT_BYTES: Final = 2
ACTIVATION_SHARE: Final = 0.10  # of the weights, for vLLM-class engines (KNOWLEDGE.md)
CUDA_OVERHEAD_GIB: Final = 1.0
LORA_SHARE: Final = 0.10  # of the memory the weights leave
MAX_LORAS: Final = 16  # adapters in one batch; more stay loaded and swap in (--max-cpu-loras)
# The ranks vLLM accepts for --max-lora-rank, and the highest we size for: recipes use 8-32
# (KNOWLEDGE.md) and the trainer defaults to 16.
VLLM_RANKS: Final = (8, 16, 32, 64, 128, 256, 320, 512)
RANK_CEILING: Final = 64
# Full-length sequences the cache holds before the context may grow past MIN_MODEL_LEN: the
# batch our callers send at once (an eval point's items, a demo's comparison; ENGINE_MAX_BATCH).
MIN_SEQS: Final = 32
MIN_MODEL_LEN: Final = 2048
MAX_NUM_SEQS: Final = 256  # vLLM's own default


class ModelDoesNotFit(ValueError):
    """The model's weights, or one sequence of it, do not fit the GPU; the message says why."""


@dataclass(frozen=True)
class VllmProfile:
    model: str
    device: str
    gpu_memory_utilization: float
    max_num_seqs: int
    max_loras: int
    max_lora_rank: int
    max_model_len: int
    # The sums behind them, for the docs and the logs.
    weights_gib: float
    lora_gib: float
    kv_cache_gib: float
    kv_bytes_per_token: int

    def describe(self) -> str:
        return (
            f"{self.model} on {self.device}: gpu_memory_utilization {self.gpu_memory_utilization}"
            f", max_num_seqs {self.max_num_seqs}, max_loras {self.max_loras}, max_lora_rank "
            f"{self.max_lora_rank}, max_model_len {self.max_model_len} (weights "
            f"{self.weights_gib:.2f} GiB, LoRA slots {self.lora_gib:.2f} GiB, KV cache "
            f"{self.kv_cache_gib:.2f} GiB at {self.kv_bytes_per_token} bytes a token)"
        )


def kv_bytes_per_token(model: CatalogueEntry) -> int:
    """K and V of every layer for one token, in 2-byte values, over the KV heads' share."""
    heads, kv_heads = model.attention_heads, model.kv_heads
    grouped = kv_heads / heads if heads and kv_heads else 1.0
    return math.ceil(2 * model.layers * model.hidden_size * grouped * WEIGHT_BYTES)


def lora_slot_bytes(model: CatalogueEntry, rank: int) -> int:
    """One adapter of `rank` on q, k, v, o (hidden x hidden) and gate, up, down (hidden x mlp)
    of every block, in 2-byte values."""
    attention = 4 * rank * (model.hidden_size + model.hidden_size)
    mlp = 3 * rank * (model.hidden_size + model.intermediate_size)
    return model.layers * (attention + mlp) * WEIGHT_BYTES


def vllm_profile(model: CatalogueEntry, device: str) -> VllmProfile:
    """vLLM's settings for `model` on one GPU of class `device`; ModelDoesNotFit when it does
    not fit, KeyError for a device class not in GPU_MEMORY_MIB."""
    memory = GPU_MEMORY_MIB[device] * 1024**2
    weights = model.parameters * WEIGHT_BYTES
    fixed = weights * (1 + ACTIVATION_SHARE) + CUDA_OVERHEAD_GIB * GIB
    left = memory * MAX_UTILIZATION - fixed
    if left <= 0:
        raise ModelDoesNotFit(
            f"{model.id} needs {fixed / GIB:.1f} GiB for weights, activations and CUDA before "
            f"any KV cache; {device} offers {memory * MAX_UTILIZATION / GIB:.1f} GiB"
        )
    rank, loras = _lora_slots(model, left)
    lora = loras * lora_slot_bytes(model, rank)
    per_token = kv_bytes_per_token(model)
    tokens = int((left - lora) // per_token)
    max_model_len = _model_len(model, tokens)
    if tokens < max_model_len:
        raise ModelDoesNotFit(
            f"{model.id} on {device}: the KV cache holds {max(tokens, 0)} tokens, fewer than one "
            f"sequence of {max_model_len}"
        )
    seqs = min(MAX_NUM_SEQS, tokens // max_model_len)
    kv_cache = seqs * max_model_len * per_token
    needed = (fixed + lora + kv_cache) / memory
    return VllmProfile(
        model=model.id,
        device=device,
        gpu_memory_utilization=min(MAX_UTILIZATION, math.ceil(needed * 100) / 100),
        max_num_seqs=seqs,
        max_loras=loras,
        max_lora_rank=rank,
        max_model_len=max_model_len,
        weights_gib=weights / GIB,
        lora_gib=lora / GIB,
        kv_cache_gib=kv_cache / GIB,
        kv_bytes_per_token=per_token,
    )


def _lora_slots(model: CatalogueEntry, left: float) -> tuple[int, int]:
    """The highest rank up to RANK_CEILING of which at least one slot fits LORA_SHARE of what
    is left, and how many slots of it (at most MAX_LORAS); one slot of the lowest rank else."""
    budget = left * LORA_SHARE
    for rank in sorted((r for r in VLLM_RANKS if r <= RANK_CEILING), reverse=True):
        slots = int(budget // lora_slot_bytes(model, rank))
        if slots >= 1:
            return rank, min(MAX_LORAS, slots)
    return VLLM_RANKS[0], 1


def _model_len(model: CatalogueEntry, tokens: int) -> int:
    """The context, shortened to a multiple of 1024 (not under MIN_MODEL_LEN) where MIN_SEQS
    full-length sequences would not fit `tokens`."""
    shared = tokens // MIN_SEQS // 1024 * 1024
    return min(model.context_length, max(shared, MIN_MODEL_LEN))


def _profiles(model: CatalogueEntry) -> dict[str, VllmProfile]:
    profiles = {}
    for device in GPU_MEMORY_MIB:
        try:
            profiles[device] = vllm_profile(model, device)
        except ModelDoesNotFit:
            continue  # absent: the model does not fit that GPU
    return profiles


# Catalogue id -> device class -> settings (docs/hoster.md shows them).
VLLM_PROFILES: Final[dict[str, dict[str, VllmProfile]]] = {
    model.id: _profiles(model) for model in CATALOGUE.values()
}
