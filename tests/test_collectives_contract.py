"""Multi-device runs exchange the suite's figures where NCCL and HCCL would refuse them (issue 25, defect 2).

torch 2.13's ``distributed_c10d`` registers NCCL for the ``cuda`` device type only (HCCL for ``hpu``): a collective on
a CPU tensor fails with "No backend type associated with device type cpu". The backend string ``"cuda:gloo"`` gives a
process group with exactly that rule on this CPU machine (gloo serving the cuda device type only), so these tests meet
the failure the way an 8-GPU run would, after its measured steps, and fail without the host group.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from suite.config import RunConfig
from suite.results.mlperf_log import MlperfLog
from suite.results.record import RunResult
from suite.run.quality import QualityTracker
from suite.run.ranks import HostGroup, aggregate_ranks

from conftest import free_port

pytestmark = [pytest.mark.hardware_contract, pytest.mark.mechanics]


class _Workload:
    def __init__(self, accuracy: float) -> None:
        self.accuracy = accuracy

    def evaluate(self) -> dict[str, float]:
        return {"eval_accuracy": self.accuracy, "eval_samples": 4.0}


def _rank_main(rank: int, world: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend="cuda:gloo", rank=rank, world_size=world)  # NCCL's rule: no CPU tensors
    outcome: dict = {"rank": rank}
    try:
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_gather([torch.zeros(1) for _ in range(world)], torch.zeros(1))  # the rule holds here
        host = HostGroup.create()
        result = RunResult(config=RunConfig(workload="w", preset="p", device="cpu", num_workers=0, loader="cpu",
                                            precision="fp32"), status="FINISHED")
        result.metrics.update(measured_wall_s=2.0 + rank, data_wait_fraction=0.1 * (rank + 1), measured_steps=10.0,
                              throughput_samples_per_s=40.0, device_peak_memory_bytes=100.0 * (rank + 1))
        result.facts["global_batch_size"] = 8 * world
        aggregate_ranks(result, host)
        config = RunConfig(workload="w", preset="tiny", device="cpu", num_workers=0, loader="cpu", precision="fp32", steps=4,
                           warmup_steps=1, batch_size=8, target_quality=0.5, eval_every=1)
        quality = QualityTracker(config, _Workload(0.9), MlperfLog(None), lambda **_: None, rank, host, 0.0, 16)
        outcome["stop"] = quality.evaluate(2)  # rank 0 evaluates, every rank learns to stop
        host.barrier()
        outcome["metrics"] = dict(result.metrics)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        outcome["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        queue.put(outcome)
        dist.destroy_process_group()


def test_rank_figures_and_the_stop_decision_travel_under_a_backend_that_refuses_cpu_tensors():
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(_rank_main, args=(2, free_port(), queue), nprocs=2, start_method="spawn")
    outcomes = sorted((queue.get() for _ in range(2)), key=lambda o: o["rank"])
    assert [o.get("error") for o in outcomes] == [None, None]
    for outcome in outcomes:
        m = outcome["metrics"]
        assert m["measured_wall_s"] == 3.0  # the slowest rank's
        assert m["throughput_samples_per_s"] == pytest.approx(10 * 16 / 3.0)
        assert m["data_wait_fraction"] == pytest.approx(0.15)
        assert m["device_peak_memory_bytes"] == 200.0
        assert outcome["stop"] is True  # rank 1 never evaluated: it learnt the decision from rank 0
