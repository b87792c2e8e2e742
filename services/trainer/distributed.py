"""More than one process: rank and world size from torchrun's environment, the process group
(gloo on CPU, nccl on GPU), the model's wrapping (DDP, or FSDP2's `fully_shard`), and the few
collectives the loop needs so that N processes compute exactly what one process computes on the
same global batch.

Without torchrun's variables (`WORLD_SIZE` unset or 1) everything here is a no-op, so the same
code path runs on a laptop. Under FSDP2 each rank holds a shard of every parameter, gradient and
optimizer state; checkpoints and the artifact still hold whole tensors (gathered here, written by
rank 0), so any strategy resumes any other's checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

log = logging.getLogger(__name__)

Parallelism = Literal["ddp", "fsdp"]

# A rank that waits longer than this for the others has lost them: fail instead of hanging.
_COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class DistContext:
    """Where this process sits: rank, world size, device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes checkpoints and artifacts and sends reports."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer (got {raw!r})") from None


def init_distributed() -> DistContext:
    """Join torchrun's process group when launched by it; a single process otherwise."""
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=_COLLECTIVE_TIMEOUT)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def shutdown(ctx: DistContext) -> None:
    if ctx.is_distributed and dist.is_initialized():
        dist.destroy_process_group()


# --- wrapping -----------------------------------------------------------------------------------


def wrap_model(
    model: torch.nn.Module, ctx: DistContext, parallelism: Parallelism = "ddp"
) -> torch.nn.Module:
    """The model the loop trains: itself in one process, DDP or FSDP2 across processes.

    Call it after the weights are loaded and BEFORE building the optimizer: FSDP2 replaces each
    parameter by its shard (a DTensor), so an optimizer built earlier would hold stale tensors.
    """
    if not ctx.is_distributed:
        return model
    if parallelism == "fsdp":
        return shard_model(model, ctx)
    device_ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
    # DDP broadcasts rank 0's weights, so every rank starts equal.
    return DistributedDataParallel(model, device_ids=device_ids)


def shard_model(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """FSDP2 over all ranks: each transformer block is one unit (gathered for its forward and
    backward, then freed), the root holds the rest (embeddings, final norm, lm_head).

    `fully_shard` works in place (the module's class becomes FSDP<Class>), so `model` stays the
    object the loop and the checkpoint code know. Every rank must hold the same weights before
    this: each takes its shard of its own copy.
    """
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    blocks = transformer_blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    log.info(
        "model sharded with FSDP2: %d blocks + root over %d ranks (%s)",
        len(blocks),
        ctx.world_size,
        ctx.device.type,
    )
    return model


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks to shard one by one: modules of a class the model names in
    `_no_split_modules` (transformers' own list of blocks that must stay whole), else
    `model.model.layers`. A peft model is looked through to its base model."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    blocks = [module for module in base.modules() if type(module).__name__ in names]
    if blocks:
        return blocks
    layers = getattr(getattr(base, "model", None), "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
        return list(layers)
    raise ValueError(
        f"parallelism=fsdp: cannot find the transformer blocks of {type(base).__name__} "
        "(no _no_split_modules, no model.layers)"
    )


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


# --- one optimizer step -------------------------------------------------------------------------


@contextlib.contextmanager
def gradient_sync(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Reduce gradients across ranks only when `enabled` (the step's last micro-batch): the
    others accumulate locally. DDP: `no_sync()`; FSDP2: `set_requires_gradient_sync`."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    elif isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
    else:
        yield


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip to `max_norm` (math.inf: only measure); the pre-clip global norm. Under FSDP2 the
    grads are shards and the norm a DTensor: `full_tensor()` reduces it over ranks."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


# --- whole state out of (and into) a sharded model ----------------------------------------------


@dataclass(frozen=True)
class GatheredState:
    """Whole tensors of a sharded run, on rank 0 (CPU); empty dicts on the other ranks.

    `model`: the trainable parameters (LoRA: the adapter's) or, for a full fine-tune, the whole
    state dict, by the unwrapped model's names, without tied duplicates (lm_head when it shares
    the embedding), as `save_pretrained` would write them. `optimizer`: in `optimizer.state_dict()`
    form (parameter indices, not names), the same file a single process writes.
    """

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]


def _full_options(model: torch.nn.Module) -> StateDictOptions:
    # cpu_offload with full_state_dict: only rank 0 receives the tensors (no N copies in memory).
    # A peft model's frozen base is what it loaded, never saved: gather its adapter only.
    frozen_base = hasattr(model, "peft_config")
    return StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=frozen_base
    )


def gather_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective: every rank calls it; rank 0 gets the whole tensors (see GatheredState)."""
    state = get_model_state_dict(model, options=_full_options(model))
    aliases = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    aliases -= {name for name, _ in model.named_parameters()}
    return {name: cast(torch.Tensor, v) for name, v in state.items() if name not in aliases}


def gather_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> GatheredState:
    """Collective: model and optimizer state of a sharded run, whole, on rank 0."""
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=_full_options(model))
    return GatheredState(
        model=gather_model_state(model),
        optimizer=_by_index(optimizer_state) if optimizer_state else {},
    )


def _by_index(named: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter names -> `optimizer.state_dict()`'s form, where
    parameters are numbered in the order of the param groups."""
    index: dict[str, int] = {}
    groups = []
    for group in named["param_groups"]:
        ids = [index.setdefault(name, len(index)) for name in group["params"]]
        groups.append({**group, "params": ids})
    return {"state": {index[name]: v for name, v in named["state"].items()}, "param_groups": groups}


def _by_name(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, indexed: dict[str, Any]
) -> dict[str, Any]:
    """The inverse of `_by_index`, with this optimizer's parameters and the model's names."""
    names = {param: name for name, param in model.named_parameters()}
    ordered = [names[param] for group in optimizer.param_groups for param in group["params"]]
    groups = indexed["param_groups"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in optimizer.param_groups]:
        raise ValueError("optimizer state: its parameter groups do not match this model's")
    named_groups = [{**g, "params": [ordered[i] for i in g["params"]]} for g in groups]
    state = {ordered[int(i)]: v for i, v in indexed["state"].items()}
    return {"state": state, "param_groups": named_groups}


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a whole `optimizer.state_dict()` (e.g. from a checkpoint): directly in one process
    or under DDP; under FSDP2 every rank passes the same whole state (each read the checkpoint)
    and keeps its shard of it (collective)."""
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    set_optimizer_state_dict(
        model,
        optimizer,
        _by_name(model, optimizer, state),
        options=StateDictOptions(full_state_dict=True),
    )


def load_gathered_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put a `GatheredState.model` into an unsharded model of the same make (rank 0 builds one
    to write the final artifact)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"gathered state has tensors the model lacks: {unexpected[:5]}")
    not_loaded = set(missing)
    absent = [name for name in state if name in not_loaded]
    if absent:
        raise ValueError(f"gathered tensors not loaded: {absent[:5]}")


# --- collectives --------------------------------------------------------------------------------


def sum_across(values: list[float], ctx: DistContext) -> list[float]:
    """Element-wise sum over ranks, in float64 so token counts and loss sums stay exact."""
    if not ctx.is_distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device(ctx))
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor.tolist()]


def any_across(flag: bool, ctx: DistContext) -> bool:
    """True when any rank says so: a SIGTERM seen by one rank stops every rank at the same step."""
    return sum_across([1.0 if flag else 0.0], ctx)[0] > 0


def broadcast_object(value: Any, ctx: DistContext) -> Any:
    """Rank 0's value on every rank (e.g. the checkpoint it resolved for `latest`)."""
    if not ctx.is_distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(ctx: DistContext) -> None:
    if ctx.is_distributed:
        dist.barrier()


def _collective_device(ctx: DistContext) -> torch.device:
    # nccl only reduces CUDA tensors; gloo reduces CPU ones.
    return ctx.device if ctx.device.type == "cuda" else torch.device("cpu")
