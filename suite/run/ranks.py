"""This process's place in a torchrun launch, and the collectives of host-side figures between the ranks.

The training itself runs on the device's own backend (NCCL on CUDA, HCCL on Gaudi), and those backends serve their
own device type only: a collective on a CPU tensor under NCCL fails with "No backend type associated with device type
cpu" (torch's ``distributed_c10d``). The suite's figures are host values (wall times, fractions, a stop flag), so
they travel on a gloo side group, :class:`HostGroup`, made by every rank right after the process group: one rule on
every device, no device copies, and nothing in the training's own streams.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from suite.figures import (
    DATA_WAIT_FRACTION,
    DEVICE_PEAK_MEMORY_BYTES,
    MEASURED_STEPS,
    MEASURED_WALL_S,
    THROUGHPUT_CI95_HIGH,
    THROUGHPUT_CI95_LOW,
    THROUGHPUT_SAMPLES_PER_S,
)

if TYPE_CHECKING:
    from suite.results.record import RunResult


@dataclass(frozen=True)
class Rank:
    """This process's place in a torchrun launch (rank 0 of 1 without one)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_environment(cls) -> "Rank":
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1)))


class HostGroup:
    """A gloo process group over every rank, for host-side figures whatever backend trains; made collectively (every
    rank calls :meth:`create` at the same point, after ``init_process_group``)."""

    def __init__(self, group: Any, world_size: int) -> None:
        self._group, self.world_size = group, world_size

    @classmethod
    def create(cls) -> "HostGroup":
        import torch.distributed as dist

        return cls(dist.new_group(backend="gloo"), dist.get_world_size())

    def all_gather_floats(self, values: Sequence[float]) -> list[list[float]]:
        """Every rank's ``values`` (same length on each), in rank order."""
        import torch
        import torch.distributed as dist

        mine = torch.tensor(list(values), dtype=torch.float64)
        gathered = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine, group=self._group)
        return [g.tolist() for g in gathered]

    def broadcast_flag(self, flag: bool, src: int = 0) -> bool:
        """Rank ``src``'s ``flag`` on every rank."""
        import torch
        import torch.distributed as dist

        value = torch.tensor([1 if flag else 0], dtype=torch.int64)
        dist.broadcast(value, src=src, group=self._group)
        return bool(value.item())

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self._group)


def aggregate_ranks(result: "RunResult", host: HostGroup) -> None:
    """Global figures over the ranks: samples of all ranks over the slowest rank's measured wall time."""
    m = result.metrics
    gathered = host.all_gather_floats(
        [m[MEASURED_WALL_S], m[DATA_WAIT_FRACTION], m.get(DEVICE_PEAK_MEMORY_BYTES, -1.0)])
    walls, waits, memories = zip(*gathered, strict=True)
    m[MEASURED_WALL_S] = max(walls)
    rank0 = m[THROUGHPUT_SAMPLES_PER_S]
    m[THROUGHPUT_SAMPLES_PER_S] = m[MEASURED_STEPS] * result.facts["global_batch_size"] / max(walls)
    for bound in (THROUGHPUT_CI95_LOW, THROUGHPUT_CI95_HIGH):  # rank 0's interval, scaled to the global figure
        if bound in m:
            m[bound] *= m[THROUGHPUT_SAMPLES_PER_S] / rank0
    m[DATA_WAIT_FRACTION] = sum(waits) / len(waits)
    if min(memories) >= 0:
        m[DEVICE_PEAK_MEMORY_BYTES] = max(memories)
    result.facts["aggregation"] = ("throughput: samples of all ranks / slowest rank's measured wall time; "
                                   "device peak memory: max per rank; data-wait: mean of ranks; "
                                   "step times and losses: rank 0; exchanged on a gloo side group (host figures)")
