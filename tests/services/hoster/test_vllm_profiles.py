"""vLLM's per-GPU settings from KNOWLEDGE.md's serving rule: the KV cache a token costs, what
each GPU class gets for SmolLM2-135M, and how a larger model trades context, concurrency and
LoRA slots (or does not fit)."""

from __future__ import annotations

import pytest

from services.hoster.vllm_profiles import (
    ACTIVATION_SHARE,
    CUDA_OVERHEAD_GIB,
    GIB,
    GPU_MEMORY_MIB,
    MAX_NUM_SEQS,
    MAX_UTILIZATION,
    VLLM_PROFILES,
    VLLM_RANKS,
    ModelDoesNotFit,
    VllmProfile,
    kv_bytes_per_token,
    lora_slot_bytes,
    vllm_profile,
)
from shared.catalogue import SMOLLM2_135M_INSTRUCT, CatalogueEntry

SMOLLM2 = SMOLLM2_135M_INSTRUCT
# Public shapes, for the trade-offs the catalogue's one small model does not show.
LLAMA_31_8B = CatalogueEntry(
    "Llama-3.1-8B-Instruct", "Llama 3.1 8B", "test", 131072, "llama3", 8_030_261_248, "llama3",
    layers=32, hidden_size=4096, intermediate_size=14336, attention_heads=32, kv_heads=8,
)  # fmt: skip
LLAMA_2_7B = CatalogueEntry(
    "Llama-2-7b", "Llama 2 7B", "test", 4096, "llama2", 6_738_415_616, "llama2",
    layers=32, hidden_size=4096, intermediate_size=11008,
)  # fmt: skip
LLAMA_31_70B = CatalogueEntry(
    "Llama-3.1-70B", "Llama 3.1 70B", "test", 131072, "llama3", 70_553_706_496, "llama3",
    layers=80, hidden_size=8192, intermediate_size=28672, attention_heads=64, kv_heads=8,
)  # fmt: skip


def test_a_token_costs_k_and_v_of_every_layer_over_the_kv_heads() -> None:
    # 2 (K, V) x 30 layers x 576 x 3/9 KV heads x 2 bytes.
    assert kv_bytes_per_token(SMOLLM2) == 23_040
    assert kv_bytes_per_token(LLAMA_31_8B) == 128 * 1024  # GQA 8 of 32 heads
    assert kv_bytes_per_token(LLAMA_2_7B) == 512 * 1024  # no grouping: the full cache
    # Rank 64 on every linear layer of Llama-2-7B: the known ~160 M parameters, 2 bytes each.
    assert lora_slot_bytes(LLAMA_2_7B, 64) == pytest.approx(2 * 160e6, rel=0.01)


def within_the_rule(profile: VllmProfile, model: CatalogueEntry) -> None:
    """What the settings promise adds up: weights, activations, CUDA, LoRA slots and a full
    batch at max_model_len fit what vLLM may take, which keeps >= 10 % headroom."""
    memory = GPU_MEMORY_MIB[profile.device] * 1024**2
    fixed = profile.weights_gib * (1 + ACTIVATION_SHARE) + CUDA_OVERHEAD_GIB
    full_batch = profile.max_num_seqs * profile.max_model_len * kv_bytes_per_token(model) / GIB
    assert profile.kv_cache_gib == pytest.approx(full_batch)
    assert profile.lora_gib * GIB == profile.max_loras * lora_slot_bytes(
        model, profile.max_lora_rank
    )
    used = (fixed + profile.lora_gib + profile.kv_cache_gib) * GIB
    assert used <= memory * profile.gpu_memory_utilization <= memory * MAX_UTILIZATION
    assert profile.max_lora_rank in VLLM_RANKS
    assert 1 <= profile.max_num_seqs <= MAX_NUM_SEQS
    assert profile.max_model_len <= model.context_length


@pytest.mark.parametrize("device", sorted(GPU_MEMORY_MIB))
def test_every_gpu_class_has_smollm2_settings_within_the_rule(device: str) -> None:
    profile = VLLM_PROFILES[SMOLLM2.id][device]
    assert profile == vllm_profile(SMOLLM2, device)  # computed, not typed in
    within_the_rule(profile, SMOLLM2)
    assert profile.max_model_len == SMOLLM2.context_length  # a 135M model keeps its context
    assert (profile.max_loras, profile.max_lora_rank) == (16, 64)


def test_a_small_model_leaves_a_large_gpu_free_and_fills_a_small_one() -> None:
    l4, h100, h200 = (
        VLLM_PROFILES[SMOLLM2.id][d] for d in ("nvidia-l4", "nvidia-h100", "nvidia-h200")
    )
    # On an L4 the cache is the limit: all of the 90 % vLLM may take, 104 sequences of 8192.
    assert (l4.gpu_memory_utilization, l4.max_num_seqs) == (0.9, 104)
    # On an H100 vLLM's 256 sequences are the limit, and what they need is all it asks for.
    assert (h100.max_num_seqs, h100.gpu_memory_utilization) == (256, 0.59)
    assert h200.gpu_memory_utilization < h100.gpu_memory_utilization


def test_an_8b_model_shortens_its_context_and_slots_on_a_24_gb_gpu() -> None:
    l4 = vllm_profile(LLAMA_31_8B, "nvidia-l4")
    within_the_rule(l4, LLAMA_31_8B)
    # 15 GiB of weights leave ~3 GiB: one rank-32 slot, 2048-token sequences, 10 at once.
    assert (l4.max_loras, l4.max_lora_rank, l4.max_model_len, l4.max_num_seqs) == (1, 32, 2048, 10)
    h100 = vllm_profile(LLAMA_31_8B, "nvidia-h100")
    within_the_rule(h100, LLAMA_31_8B)
    # Room for 32 sequences of 12288 tokens (of its 131072) beside 16 rank-64 slots.
    assert (h100.max_loras, h100.max_lora_rank, h100.max_model_len, h100.max_num_seqs) == (
        16, 64, 12288, 32,
    )  # fmt: skip
    # Without grouped-query attention a token costs 4x: 32 sequences of Llama-2-7B's 4096
    # tokens (64 GiB) do not fit an A100's ~52 GiB of cache, they do an H200's.
    assert vllm_profile(LLAMA_2_7B, "nvidia-a100-80gb").max_model_len == 3072
    assert vllm_profile(LLAMA_2_7B, "nvidia-h200").max_model_len == 4096


def test_a_model_too_large_for_a_gpu_does_not_fit() -> None:
    with pytest.raises(
        ModelDoesNotFit, match=r"Llama-3.1-70B needs 145.6 GiB .* nvidia-h200 offers 126.4 GiB"
    ):
        vllm_profile(LLAMA_31_70B, "nvidia-h200")
    with pytest.raises(KeyError):
        vllm_profile(SMOLLM2, "nvidia-t4")
