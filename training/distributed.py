"""torch.distributed setup for `medclr train` under torchrun (NCCL on GPUs, gloo on CPU).

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; without them the run
is a single process and nothing here touches torch.distributed. The contrastive features are
gathered inside the losses (medclr/losses/distributed.py: local anchors x global candidates with
a gradient-summing all-gather), which makes DDP's gradient average the exact full-batch gradient;
this module only starts/stops the process group and provides the few collectives the loop needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from medclr.distributed import env_world, init_group


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        from medclr.errors import MedclrError

        raise MedclrError(f"train.device={requested}: CUDA is not available on this machine (use train.device=cpu)")
    if requested.startswith("cuda:"):
        return torch.device(requested)
    return torch.device("cuda", local_rank)


def setup(requested_device: str = "auto", timeout_s: float = 600.0) -> DistEnv:
    rank, world, local = env_world()
    device = pick_device(requested_device, local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1:
        backend = "nccl" if device.type == "cuda" else "gloo"
        init_group(backend, timeout_s, **({"device_id": device} if device.type == "cuda" else {}))
    return DistEnv(rank=rank, world_size=world, local_rank=local, device=device)


def barrier(env: DistEnv) -> None:
    if env.enabled:
        if env.device.type == "cuda":
            dist.barrier(device_ids=[env.device.index])
        else:
            dist.barrier()


def all_reduce_mean(x: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if not env.enabled:
        return x
    y = x.detach().clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y / env.world_size


def average_grads(params, env: DistEnv) -> None:
    """Average .grad over ranks for parameters outside DDP (the loss's learnable scalars)."""
    if not env.enabled:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(env.world_size)


def broadcast_object(obj, env: DistEnv):
    """Rank 0's Python object on every rank (e.g. the step budget measured on rank 0)."""
    if not env.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
