"""Run one configuration in the current process: warm-up steps, then measured steps.

The runner starts this module in a fresh process per configuration (``python -m suite.execute``) so
that memory figures are clean and a crash cannot take the matrix down. Any failure becomes a FAILED
result with a one-line reason; the traceback goes to the run's log.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from suite.config import RunConfig
from suite.errors import SuiteError
from suite.events import emit
from suite.fileio import write_json_atomic
from suite.mlperf_log import MlperfLog
from suite.registry import load_device, load_workload
from suite.results import FAILED, FINISHED, RunResult, StepStats
from suite.trackers.timing import StepTimer, StepTiming

EmitFn = Callable[..., None]


def _no_emit(**_: Any) -> None:
    pass


def _one_line(exc: BaseException) -> str:
    """A one-line reason; for an error re-raised from a DataLoader worker, the worker's original error."""
    message = str(exc)
    if "Original Traceback" in message:
        last = [line.strip() for line in message.splitlines() if line.strip()][-1]
        return f"in a loader worker: {last}"
    text = " ".join(message.split()) or repr(exc)
    if isinstance(exc, MemoryError):
        return f"out of memory (MemoryError{': ' + text if text != repr(exc) else ''})"
    return text if isinstance(exc, SuiteError) else f"{type(exc).__name__}: {text}"


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


def execute(config: RunConfig, emit_event: EmitFn = _no_emit, mllog_path: str | None = None,
            rank: Rank | None = None) -> RunResult:
    """Run ``config`` here and return its result; never raises for a failure of the run itself.

    With ``mllog_path``, an MLPerf-format log of the run is written there (see :mod:`suite.mlperf_log`).
    Under torchrun (``rank.world_size > 1``) every rank trains on its share of each global batch with the
    device's distributed backend, and the result aggregates the ranks: global throughput over the
    slowest rank's wall time, device peak memory as the maximum per rank, data-wait as the mean.
    """
    rank = rank or Rank()
    if config.batch_size is None:
        raise ValueError("execute() needs a resolved batch_size (see suite.runner.resolve)")
    result = RunResult(config=config.to_dict(), status=FAILED, started_at=time.time())
    facts = result.facts
    facts["warmup_steps_excluded"] = config.warmup_steps
    facts["batch_size_used"] = None
    adapter = workload = None
    mlperf = MlperfLog(mllog_path)
    try:
        mlperf.event("submission_benchmark", config.workload)
        mlperf.start("init_start")
        if rank.world_size % config.nproc_per_node:
            raise SuiteError(f"nproc_per_node is {config.nproc_per_node} but {rank.world_size} process(es) run, "
                             "not a whole number of nodes")
        adapter = load_device(config.device)(local_rank=rank.local_rank)
        emit_event(phase="device setup")
        adapter.setup()
        if rank.world_size > 1:
            import torch.distributed as dist

            dist.init_process_group(backend=adapter.distributed_backend)
            facts["world_size"] = rank.world_size
            facts["nodes"] = rank.world_size // config.nproc_per_node
            facts["distributed_backend"] = adapter.distributed_backend
        facts["global_batch_size"] = config.batch_size * rank.world_size
        facts["device"] = adapter.device_info()
        prepare_device(config, adapter)
        workload = load_workload(config.workload)(config, adapter)
        emit_event(phase="workload setup")
        workload.setup()
        facts["workload"] = workload.facts()
        facts["precision_used"] = config.precision
        facts["run_params"] = adapter.run_params()
        facts["loader_used"] = config.loader
        _log_hyperparameters(mlperf, config, workload, rank)
        mlperf.end("init_stop")
        mlperf.start("run_start")
        if config.engine == "hf-trainer":
            _train_with_trainer(config, adapter, workload, result, emit_event, mlperf, rank)
        else:
            _train(config, adapter, workload, result, emit_event, mlperf, rank)
        result.metrics.update(workload.metrics())
        mlperf.end("run_stop", metadata={"status": "success"})
        result.status = FINISHED
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, none lost
        result.status = FAILED
        result.reason = _one_line(exc)
        traceback.print_exc(file=sys.stderr)
        mlperf.abort()
    except BaseException:  # interrupted: close the MLPerf log's intervals, then let it propagate
        mlperf.abort()
        raise
    finally:
        mlperf.close()
        for closer in (workload, adapter):
            if closer is not None:
                try:
                    closer.teardown()
                except Exception:  # noqa: BLE001 - teardown must not mask the run's own outcome
                    traceback.print_exc(file=sys.stderr)
        if rank.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        result.ended_at = time.time()
    return result


def prepare_device(config: RunConfig, adapter: Any) -> None:
    """Refuse a loader or precision the device does not run (never swap it), then make it deterministic
    and seed every RNG. Shared by the run process and the pytest plugin."""
    if config.loader not in adapter.supported_loaders:
        raise SuiteError(
            f"loader {config.loader!r} is not supported on {config.device}; "
            f"supported: {', '.join(adapter.supported_loaders)}"
        )
    adapter.autocast(config.precision)  # fails now, not mid-run, if the precision is unsupported
    adapter.configure_determinism()
    adapter.seed(config.seed)


def _aggregate_ranks(result: RunResult, rank: Rank) -> None:
    """Global figures over the ranks: samples of all ranks over the slowest rank's measured wall time."""
    import torch
    import torch.distributed as dist

    m = result.metrics
    values = torch.tensor([m["measured_wall_s"], m["data_wait_fraction"], m.get("device_peak_memory_bytes", -1.0)],
                          dtype=torch.float64)
    gathered = [torch.zeros_like(values) for _ in range(rank.world_size)]
    dist.all_gather(gathered, values)
    walls, waits, memories = zip(*(g.tolist() for g in gathered), strict=True)
    m["measured_wall_s"] = max(walls)
    m["throughput_samples_per_s"] = m["measured_steps"] * result.facts["global_batch_size"] / max(walls)
    m["data_wait_fraction"] = sum(waits) / len(waits)
    if min(memories) >= 0:
        m["device_peak_memory_bytes"] = max(memories)
    result.facts["aggregation"] = ("throughput: samples of all ranks / slowest rank's measured wall time; "
                                   "device peak memory: max per rank; data-wait: mean of ranks; "
                                   "step times and losses: rank 0")


def _log_hyperparameters(mlperf: MlperfLog, config: RunConfig, workload: Any, rank: Rank) -> None:
    mlperf.event("seed", config.seed)
    mlperf.event("global_batch_size", config.batch_size * rank.world_size)
    mlperf.event("gradient_accumulation_steps", 1)
    for key, value in workload.mlperf_hyperparameters().items():
        mlperf.event(key, value)
    for key in ("device", "num_workers", "loader", "precision", "warmup_steps", "steps"):
        mlperf.event(f"suite_{key}", getattr(config, key))


class TrainingSteps:
    """Training steps one at a time, timed the suite's way; shared by the run process and the pytest plugin.

    Each step's clock covers waiting for the batch (data wait), the step itself and the device
    synchronization; the batch size is checked on every step and a non-finite loss stops the run.
    Losses are appended to ``losses`` as they come, so a failure keeps the trajectory so far.
    """

    def __init__(self, config: RunConfig, adapter: Any, workload: Any, losses: list[float] | None = None) -> None:
        self.config, self.adapter, self.workload = config, adapter, workload
        self.losses = losses if losses is not None else []
        self.timings: list[StepTiming] = []
        self._batches = workload.batches()
        self._timer = StepTimer(adapter.synchronize)

    @property
    def batches(self) -> Any:
        """The endless batch iterator these steps draw from (shared with a bare loop by bench-overhead)."""
        return self._batches

    def start_clock(self) -> None:
        """(Re)start the clock: steps that follow without a restart are timed back to back."""
        self._timer.start()

    def step(self) -> StepTiming:
        batch = next(self._batches)
        self.batch_ready(batch)
        return self.step_end(self.workload.train_step(batch))

    # The two halves of a step, also called by an external training loop (engine hf-trainer).
    def batch_ready(self, batch: Any) -> None:
        """The step's batch is in hand: the data wait ends; its size must be the recorded batch size."""
        self._timer.batch_ready()
        samples = self.workload.count_samples(batch)
        if samples != self.config.batch_size:
            raise SuiteError(f"step {len(self.timings)} got a batch of {samples} samples but the recorded batch "
                             f"size is {self.config.batch_size}")

    def step_end(self, loss: Any) -> StepTiming:
        """After the optimizer step: device step boundary, loss read back, clock read after a device sync."""
        index = len(self.timings)
        self.adapter.step_boundary()
        loss_value = float(loss)
        timing = self._timer.step_done()
        self.timings.append(timing)
        self.losses.append(loss_value)
        if not math.isfinite(loss_value):
            raise SuiteError(f"loss became {loss_value} at step {index}")
        return timing

    def record(self, result: RunResult) -> StepStats | None:
        """Metrics of the measured steps (after the warm-up ones) and peak device memory, into ``result``."""
        result.facts["batch_size_used"] = self.config.batch_size
        measured = self.timings[self.config.warmup_steps:]
        stats = StepStats.from_timings(measured, self.config.batch_size) if measured else None
        if stats is not None:
            result.metrics.update(stats.as_dict())
        memory = self.adapter.peak_memory()
        if memory is not None:
            result.metrics["device_peak_memory_bytes"] = float(memory.peak_bytes)
            result.facts["device_peak_memory_source"] = memory.source
            for name, value in memory.extra.items():
                result.metrics[f"device_{name}_bytes"] = float(value)
        return stats


def _train(config: RunConfig, adapter: Any, workload: Any, result: RunResult, emit_event: EmitFn,
           mlperf: MlperfLog | None = None, rank: Rank | None = None) -> None:
    rank = rank or Rank()
    mlperf = mlperf or MlperfLog(None)
    total = config.warmup_steps + config.steps
    steps = TrainingSteps(config, adapter, workload, losses=result.losses)
    emit_event(phase="training", total=total)
    adapter.reset_peak_memory()
    steps.start_clock()
    flops_per_step: float | None = None
    for step in range(total):
        if step == config.warmup_steps:
            mlperf.start("block_start", metadata={"first_step": step, "step_count": config.steps})
        if step == 0 and config.warmup_steps > 0:  # count model FLOPs once, in an unmeasured step
            flops_per_step = _counted_step(steps)
        else:
            steps.step()
        emit_event(step=step + 1, total=total, loss=result.losses[-1])
    mlperf.end("block_stop", metadata={"first_step": config.warmup_steps, "step_count": config.steps})
    stats = steps.record(result)
    if stats is None:  # unreachable: RunConfig requires steps >= 1
        raise SuiteError("no measured step")
    if rank.world_size > 1:
        _aggregate_ranks(result, rank)
    _record_flops(result, flops_per_step, rank)
    mlperf.event("throughput", result.metrics["throughput_samples_per_s"], metadata={"unit": "samples/s"})


def _train_with_trainer(config: RunConfig, adapter: Any, workload: Any, result: RunResult, emit_event: EmitFn,
                        mlperf: MlperfLog, rank: Rank) -> None:
    """Engine hf-trainer: the workload's trainer drives the steps; the suite's clock and accounting time them."""
    if rank.world_size > 1:
        raise SuiteError("engine hf-trainer runs on one device per configuration (use engine suite to scale out)")
    total = config.warmup_steps + config.steps
    steps = TrainingSteps(config, adapter, workload, losses=result.losses)
    emit_event(phase="training (hf-trainer)", total=total)

    class Hooks:
        block_started = False

        def begin(self) -> None:
            adapter.reset_peak_memory()
            steps.start_clock()

        def batch_ready(self, batch: Any) -> None:
            if len(steps.timings) == config.warmup_steps and not self.block_started:
                mlperf.start("block_start", metadata={"first_step": config.warmup_steps, "step_count": config.steps})
                self.block_started = True
            steps.batch_ready(batch)

        def step_end(self, loss: Any) -> None:
            steps.step_end(loss)
            emit_event(step=len(steps.timings), total=total, loss=result.losses[-1])

    trainer_figures = workload.train_with_trainer(Hooks())
    result.facts["workload"] = workload.facts()  # now including what the trainer built
    if len(steps.timings) != total:
        raise SuiteError(f"the trainer ran {len(steps.timings)} steps, not {total}")
    mlperf.end("block_stop", metadata={"first_step": config.warmup_steps, "step_count": config.steps})
    steps.record(result)
    for key, value in trainer_figures.items():
        result.metrics[f"trainer_{key}"] = float(value)
    result.facts["engine"] = ("transformers Trainer driving the steps; step times, data-wait and throughput by the "
                              "suite's clock over the measured steps; trainer_* metrics are the trainer's own "
                              "(all steps, warm-up and start-up included)")
    result.facts["mfu"] = "not measured with engine hf-trainer"
    mlperf.event("throughput", result.metrics["throughput_samples_per_s"], metadata={"unit": "samples/s"})


def _counted_step(steps: "TrainingSteps") -> float:
    """One training step under ``torch.utils.flop_counter``; its FLOPs (forward + backward, this rank)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        steps.step()
    return float(counter.get_total_flops())


def _record_flops(result: RunResult, flops_per_step: float | None, rank: Rank) -> None:
    """Model FLOP/s achieved over the measured steps, and MFU against the device's dense bf16 peak."""
    facts = result.facts
    if flops_per_step is None:
        facts["mfu"] = "not measured: FLOPs are counted in the first warm-up step and there was none"
        return
    m = result.metrics
    achieved = flops_per_step * m["measured_steps"] / m["measured_wall_s"]  # per device
    m["model_flops_per_step"] = flops_per_step
    m["model_flops_per_s"] = achieved
    peak = (facts.get("device") or {}).get("peak_bf16_flops")
    if peak:
        m["mfu_bf16_peak"] = achieved / float(peak)
        facts["mfu"] = (f"model FLOPs per step (torch.utils.flop_counter, forward+backward, counted once on rank "
                        f"{rank.rank}) x measured steps / measured wall time / dense bf16 peak {peak:.4g} FLOP/s")
    else:
        facts["mfu"] = "not computed: no peak FLOP/s is known for this device"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.execute", description=__doc__)
    parser.add_argument("--config", required=True, help="JSON file with one resolved RunConfig")
    parser.add_argument("--result", required=True, help="where to write the RunResult JSON")
    parser.add_argument("--mllog", default=None, help="where to write the MLPerf-format log")
    args = parser.parse_args(argv)
    with open(args.config) as fh:
        config = RunConfig.from_dict(json.load(fh))
    rank = Rank.from_environment()
    leader = rank.rank == 0  # only rank 0 reports progress and writes the result and the MLPerf log
    result = execute(config, emit_event=emit if leader else _no_emit, mllog_path=args.mllog if leader else None,
                     rank=rank)
    if leader:
        write_json_atomic(args.result, result.to_dict())
    return 0 if leader or result.status == FINISHED else 1


if __name__ == "__main__":
    raise SystemExit(main())
