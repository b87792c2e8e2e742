"""More than one process: rank and world size from torchrun's environment, the process group
(gloo on CPU, nccl on GPU), DDP wrapping, and the few collectives the loop needs so that N
processes compute exactly what one process computes on the same global batch.

Without torchrun's variables (`WORLD_SIZE` unset or 1) everything here is a no-op, so the same
code path runs on a laptop. FSDP2 (`torch.distributed.fsdp.fully_shard`) is the branch for
multi-GPU nodes where a model does not fit one device; it is not wired here because these
machines have no GPU to test it on (see docs/trainer.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

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


def wrap_model(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """DDP across processes (it also broadcasts rank 0's weights, so every rank starts equal)."""
    if not ctx.is_distributed:
        return model
    device_ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


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
