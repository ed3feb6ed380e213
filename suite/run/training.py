"""The training a configuration process runs: warm-up and measured steps with the suite loop or the workload's
trainer, evaluations between steps for a quality target, cache clearing, FLOPs and the observed loader recorded."""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from mlperf_logging.mllog import constants

from suite.analysis import memory_trend
from suite.config import ENGINE_NOTES, RunConfig
from suite.devices.interfaces import MemoryMeter
from suite.errors import SuiteError
from suite.figures import (
    MEASURED_STEPS,
    MEASURED_WALL_S,
    MFU,
    MODEL_FLOPS_PER_S,
    MODEL_FLOPS_PER_STEP,
    THROUGHPUT_SAMPLES_PER_S,
)
from suite.meters.contention import ContentionMeter
from suite.results.mlperf_log import MlperfLog
from suite.results.record import RunResult
from suite.run.quality import QualityTracker, evaluation_every
from suite.run.ranks import HostGroup, Rank, aggregate_ranks
from suite.run.steps import TrainingSteps
from suite.text import visible

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter
    from suite.workload import Workload

EmitFn = Callable[..., None]


def log_traceback() -> None:
    """The exception being handled, into the run's log (stderr), its control characters made visible: a file name
    quoted in it is data."""
    try:
        sys.stderr.write(visible(traceback.format_exc(), keep_newlines=True))
        sys.stderr.flush()
    except OSError:  # a log that cannot be written (full disk) must not end the run
        pass


def one_line(exc: BaseException) -> str:
    """A one-line reason; for an error re-raised from a DataLoader worker, the worker's original error."""
    message = str(exc)
    if "Original Traceback" in message:
        last = [line.strip() for line in message.splitlines() if line.strip()][-1]
        return f"in a loader worker: {last}"
    text = " ".join(message.split()) or repr(exc)
    if isinstance(exc, MemoryError):
        return f"out of memory (MemoryError{': ' + text if text != repr(exc) else ''})"
    return text if isinstance(exc, SuiteError) else f"{type(exc).__name__}: {text}"


def record_observed_loader(result: RunResult, workload: Workload) -> None:
    """What the workload's loader really was (the pipeline built, the DataLoader that ran), for the audit."""
    try:
        observed = workload.observed_loader()
    except Exception:  # noqa: BLE001 - a workload that cannot say leaves the facts absent (the audit fails)
        log_traceback()
        return
    for key in ("loader", "num_workers", "prefetch_factor", "decoder"):
        if key in observed:
            result.facts[f"{key}_used"] = observed[key]


def log_hyperparameters(mlperf: MlperfLog, config: RunConfig, workload: Workload, rank: Rank) -> None:
    mlperf.event(constants.SEED, config.seed)
    mlperf.event(constants.GLOBAL_BATCH_SIZE, config.batch * rank.world_size)
    mlperf.event(constants.GRADIENT_ACCUMULATION_STEPS, 1)
    for key, value in workload.mlperf_hyperparameters().items():
        mlperf.event(key, value)
    mlperf.event(constants.MAX_STEPS, config.total_steps)  # warm-up and the most measured steps
    mlperf.event("quality_target", config.target_quality, metadata={"metric": "eval_accuracy",
                                                                    "null": "a throughput measurement"})
    mlperf.event("eval_frequency_steps", evaluation_every(config) or 0, metadata={"also": "at the end of every run",
                                                               "unit": "measured steps; 0: at the end only"})
    for key in ("device", "num_workers", "loader", "precision", "warmup_steps", "steps"):
        mlperf.event(f"suite_{key}", getattr(config, key))


def train(config: RunConfig, adapter: DeviceAdapter, workload: Workload, result: RunResult, emit_event: EmitFn,
           mlperf: MlperfLog | None = None, rank: Rank | None = None, quality: QualityTracker | None = None,
           first_step_done: Callable[[Any], None] | None = None, host: HostGroup | None = None) -> None:
    """Warm-up then measured steps (up to ``config.most_steps``); evaluations between steps, off the clock."""
    rank = rank or Rank()
    mlperf = mlperf or MlperfLog(None)
    global_batch = config.batch * rank.world_size
    quality = quality or QualityTracker(config, workload, mlperf, emit_event, rank.rank, host, time.monotonic(),
                                        global_batch)
    total = config.total_steps
    steps = TrainingSteps(config, adapter, workload, losses=result.losses)
    emit_event(phase="training", total=total)
    adapter.memory().reset_peak()
    steps.start_clock()
    flops_per_step: float | None = None
    done = 0
    # contention of this configuration's own processes: under torchrun every local rank, so the launcher's tree
    own = ContentionMeter(os.getppid() if rank.world_size > 1 else None)
    block = _MeasuredBlock(config, mlperf, global_batch, own, adapter.memory())
    for step in range(total):
        if step == config.warmup_steps:
            block.start()
        if step == 0 and config.warmup_steps > 0:  # count model FLOPs once, in an unmeasured step
            flops_per_step = _counted_step(steps)
        else:
            steps.step()
        done = step + 1
        block.step_done()
        if step == 0 and first_step_done is not None:
            first_step_done(steps.timings[0])
        emit_event(step=done, total=total, loss=result.losses[-1])
        if _evaluate_between_steps(quality, steps, done):
            break
    block.end(done, result)
    stats = steps.record(result)
    if stats is None:
        raise SuiteError(f"no measured step: the run stopped after {done} steps, within its {config.warmup_steps} "
                         "warm-up steps")
    if host is not None:
        aggregate_ranks(result, host)
    _record_flops(result, flops_per_step, rank)
    mlperf.event("throughput", result.metrics[THROUGHPUT_SAMPLES_PER_S], metadata={"unit": "samples/s"})
    quality.finish(result, done)
    emit_event(phase="finishing", compute_done=True)  # the runner may start the next configuration's process now


def train_with_trainer(config: RunConfig, adapter: DeviceAdapter, workload: Workload, result: RunResult,
                       emit_event: EmitFn, mlperf: MlperfLog, rank: Rank, quality: QualityTracker,
                        first_step_done: Callable[[Any], None] | None = None) -> None:
    """Engine hf-trainer: the workload's trainer drives the steps; the suite's clock and accounting time them."""
    if rank.world_size > 1:
        raise SuiteError("engine hf-trainer runs on one device per configuration (use engine suite to scale out)")
    total = config.total_steps
    steps = TrainingSteps(config, adapter, workload, losses=result.losses)
    block = _MeasuredBlock(config, mlperf, config.batch, ContentionMeter(), adapter.memory())
    emit_event(phase="training (hf-trainer)", total=total)

    class Hooks:
        block_started = False

        def begin(self) -> None:
            adapter.memory().reset_peak()
            steps.start_clock()

        def batch_ready(self, batch: Any) -> None:
            if len(steps.timings) == config.warmup_steps and not self.block_started:
                block.start()
                self.block_started = True
            steps.batch_ready(batch)

        def step_end(self, loss: Any) -> bool:
            """After each optimizer step; True asks the trainer to stop (the quality target is met)."""
            steps.step_end(loss)
            block.step_done()
            done = len(steps.timings)
            if done == 1 and first_step_done is not None:
                first_step_done(steps.timings[0])
            emit_event(step=done, total=total, loss=result.losses[-1])
            return _evaluate_between_steps(quality, steps, done)

    trainer_figures = workload.train_with_trainer(Hooks())
    result.facts["workload"] = workload.facts()  # now including what the trainer built
    done = len(steps.timings)
    if done != total and quality.reached is None:
        raise SuiteError(f"the trainer ran {done} steps, not {total}")
    block.end(done, result)
    steps.record(result)
    for key, value in trainer_figures.items():
        result.metrics[f"trainer_{key}"] = float(value)
    result.facts["engine"] = ("transformers Trainer driving the steps; step times, data-wait and throughput by the "
                              "suite's clock over the measured steps; trainer_* metrics are the trainer's own "
                              "(all steps, warm-up and start-up included); " + ENGINE_NOTES["hf-trainer"])
    result.facts["mfu"] = "not measured with engine hf-trainer"
    mlperf.event("throughput", result.metrics[THROUGHPUT_SAMPLES_PER_S], metadata={"unit": "samples/s"})
    quality.finish(result, done)
    emit_event(phase="finishing", compute_done=True)


class _MeasuredBlock:
    """The measured window of both engines: MLPerf's block_start/block_stop around the measured steps, how busy
    the machine was with other work meanwhile (see suite.meters.contention), its times on the machine's monotonic clock
    (the runner fits the host memory it sampled meanwhile) and the device memory in use after each of its steps (its
    trend: suite.analysis.memory_trend)."""

    def __init__(self, config: RunConfig, mlperf: MlperfLog, global_batch: int, contention: ContentionMeter,
                 memory: MemoryMeter) -> None:
        self.config, self.mlperf, self.global_batch, self.contention = config, mlperf, global_batch, contention
        self.memory = memory
        self.started: float | None = None
        self.device_memory: list[int] = []  # after each measured step

    def start(self) -> None:
        first = self.config.warmup_steps
        self.mlperf.start(constants.BLOCK_START, metadata={"first_step": first, "step_count": self.config.most_steps,
                                                           "samples_count": first * self.global_batch})
        self.contention.start()
        self.started = time.monotonic()

    def step_done(self) -> None:
        """After a step; inside the window, the device memory in use (an allocator counter: no device sync)."""
        if self.started is not None and (current := self.memory.current_bytes()) is not None:
            self.device_memory.append(current)

    def end(self, done: int, result: RunResult) -> None:
        """After ``done`` steps in all (warm-up included)."""
        first = self.config.warmup_steps
        self.mlperf.end(constants.BLOCK_STOP, metadata={"first_step": first, "step_count": done - first,
                                                        "samples_count": done * self.global_batch})
        reading = self.contention.stop()
        if reading is not None:
            result.metrics.update(reading.metrics())
            result.facts["contention"] = reading.facts()
        if self.started is None:
            return
        result.facts["measured_window_monotonic_s"] = [self.started, time.monotonic()]
        if self.device_memory:
            trend = memory_trend.fit(range(1, len(self.device_memory) + 1), self.device_memory, done - first,
                                     "device memory in use after each measured step")
            memory_trend.record(trend, "device_memory", result.metrics, result.facts)


def _evaluate_between_steps(quality: QualityTracker, steps: TrainingSteps, done: int) -> bool:
    """Evaluate when due after ``done`` steps; the step clock restarts after it, so the evaluation is in no step's
    time. True: the quality target is met (stop training)."""
    if not quality.due(done):
        return False
    stop = quality.evaluate(done)
    steps.start_clock()
    return stop


def clear_caches(config: RunConfig, mlperf: MlperfLog, facts: dict[str, Any]) -> None:
    """MLPerf's cache_clear: with --clear-caches, drop the OS page cache (root only) and say whether it happened."""
    cleared, how = False, "not requested (--clear-caches)"
    if config.clear_caches:
        try:
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            cleared, how = True, "page cache, dentries and inodes dropped (/proc/sys/vm/drop_caches)"
        except OSError as exc:
            how = f"could not drop the page cache: {exc.strerror or exc} (needs root)"
    facts["cache_clear"] = {"cleared": cleared, "how": how}
    mlperf.event(constants.CACHE_CLEAR, cleared, metadata={"how": how})


def _counted_step(steps: "TrainingSteps") -> float:
    """One training step under ``torch.utils.flop_counter``; its FLOPs (forward + backward, this rank)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        steps.step()
    return float(counter.get_total_flops())


def _record_flops(result: RunResult, flops_per_step: float | None, rank: Rank) -> None:
    """Model FLOP/s achieved over the measured steps, and MFU against the device's dense peak for the precision that
    ran (bf16: the tensor cores' bf16 peak; fp32: the FP32 peak, TF32 being off)."""
    facts = result.facts
    if flops_per_step is None:
        facts["mfu"] = "not measured: FLOPs are counted in the first warm-up step and there was none"
        return
    m = result.metrics
    achieved = flops_per_step * m[MEASURED_STEPS] / m[MEASURED_WALL_S]  # per device
    m[MODEL_FLOPS_PER_STEP] = flops_per_step
    m[MODEL_FLOPS_PER_S] = achieved
    precision = result.config.precision
    peak = ((facts.get("device") or {}).get("peak_flops") or {}).get(precision)
    if peak:
        m[MFU] = achieved / float(peak)
        facts["mfu"] = (f"model FLOPs per step (torch.utils.flop_counter, forward+backward, counted once on rank "
                        f"{rank.rank}) x measured steps / measured wall time / the device's dense {precision} peak "
                        f"{peak:.4g} FLOP/s")
    else:
        facts["mfu"] = f"not computed: no {precision} peak FLOP/s is known for this device"
