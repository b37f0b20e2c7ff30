"""Where this process sits in a distributed job: rank, world size, local rank, and its data-loader worker.

From ``torch.distributed`` when it is initialized, else from the ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` /
``LOCAL_WORLD_SIZE`` variables that ``torchrun`` sets, else a single process. Inside a torch DataLoader worker
``worker`` / ``num_workers`` say which of the rank's workers this is: torch hands a rank's steps to its workers
round robin (step ``s`` to worker ``s % num_workers``, see :func:`~mmfeed.packing.plan.worker_steps`), so the
batches come back in step order. Planning takes all of these as plain integers, so layouts of any size can be
simulated without starting processes::

    >>> info = dist_info()
    >>> 0 <= info.rank < info.world_size and info.node == info.rank // info.local_world_size
    True
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["DistInfo", "dist_info"]


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job.

    rank, world_size: the global rank and the number of ranks (training processes).
    local_rank, local_world_size: the rank on this node and the ranks per node.
    worker, num_workers: this DataLoader worker of the rank (0 of 1 in the main process).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    @property
    def node(self) -> int:
        """The node (machine) index, with ``local_world_size`` ranks per node as torchrun lays them out."""
        return self.rank // max(self.local_world_size, 1)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} must be an integer (torchrun sets it; unset it for one process)") from None


def dist_info() -> DistInfo:
    """This process's place: torch.distributed if initialized, else torchrun's environment, else rank 0 of 1.

    Raises ValueError when the environment is inconsistent (RANK outside WORLD_SIZE, non-integer values).
    """
    import torch.distributed as dist
    import torch.utils.data

    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", 1 if "LOCAL_RANK" not in os.environ else max(world, 1))
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is not in range for WORLD_SIZE={world}")
    if local_world < 1 or not 0 <= local < local_world:
        raise ValueError(f"LOCAL_RANK={local} is not in range for LOCAL_WORLD_SIZE={local_world}")
    worker = torch.utils.data.get_worker_info()
    return DistInfo(rank=rank, world_size=world, local_rank=local, local_world_size=local_world,
                    worker=0 if worker is None else worker.id, num_workers=1 if worker is None else worker.num_workers)
