"""torchrun's environment, read in one place, and the process group's start and end.

Training (``medclr.training.distributed``: NCCL on GPUs, gloo on CPUs, DDP) and the archive scorer
(``medclr.jobs.scoring``: a gloo group for its barrier only) both run under torchrun; they read who they
are and open and close the default process group through these functions, so the two cannot drift.
"""

from __future__ import annotations

import datetime
import os

__all__ = ["cleanup", "env_world", "init_group"]


def env_world() -> tuple[int, int, int]:
    """(rank, world size, local rank) as torchrun announces them; (0, 1, 0) otherwise."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)))


def init_group(backend: str, timeout_s: float, **kwargs) -> None:
    """Open the default process group (``torch.distributed.init_process_group``) unless one is open."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)


def cleanup() -> None:
    """Close the default process group if one is open (idempotent)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
