"""The suite's step loop, shared by the configuration process, the pytest plugin and bench-overhead.

:class:`TrainingSteps` times steps one at a time with the suite's accounting (data wait, device-synchronized clock,
batch-size check, exact loss); :func:`suite.devices.base.prepare_device` readies the device first.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from suite.config import RunConfig
from suite.errors import SuiteError
from suite.figures import DECODER_BUILDS_IN_MEASURED_STEPS, DEVICE_PEAK_MEMORY_BYTES, WARMUP_WALL_S
from suite.meters.timing import StepTimer, StepTiming
from suite.results.record import RunResult, StepStats

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter
    from suite.workload import Workload


class TrainingSteps:
    """Training steps one at a time, timed the suite's way; shared by the run process and the pytest plugin.

    Each step's clock covers waiting for the batch (data wait), the step itself and the device
    synchronization; the batch size is checked on every step and a non-finite loss stops the run.
    Losses are appended to ``losses`` as they come, so a failure keeps the trajectory so far.
    """

    def __init__(self, config: RunConfig, adapter: DeviceAdapter, workload: Workload,
                 losses: list[float] | None = None) -> None:
        self.config, self.adapter, self.workload = config, adapter, workload
        self.losses = losses if losses is not None else []
        self.timings: list[StepTiming] = []
        self.decoder_builds: list[int] = []  # per step: decoder pipelines built inside it (on its clock)
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
        builds = self.adapter.decoders.builds()
        batch = next(self._batches)
        self.batch_ready(batch)
        timing = self.step_end(self.workload.train_step(batch))
        self.decoder_builds.append(self.adapter.decoders.builds() - builds)
        return timing

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
        self.adapter.training().step_boundary()
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
        stats = StepStats.from_timings(measured, self.config.batch) if measured else None
        if stats is not None:
            result.metrics.update(stats.as_dict())
            warmup = self.timings[:self.config.warmup_steps]
            result.metrics[WARMUP_WALL_S] = sum(t.step_time_s for t in warmup)  # the warm-up steps' own time
            result.facts["step_times_s"] = list(stats.step_times_s)  # every measured step: the audit recomputes
            result.facts["data_wait_s"] = list(stats.data_waits_s)  # every headline from these two
            if any(self.decoder_builds):  # a decoder pipeline built on a step's clock: said, never hidden
                result.metrics[DECODER_BUILDS_IN_MEASURED_STEPS] = float(
                    sum(self.decoder_builds[self.config.warmup_steps:]))
                result.facts["decoder_builds_per_step"] = list(self.decoder_builds)
        memory = self.adapter.memory().peak()
        if memory is not None:
            result.metrics[DEVICE_PEAK_MEMORY_BYTES] = float(memory.peak_bytes)
            result.facts["device_peak_memory_source"] = memory.source
            result.facts["device_peak_memory_is_host"] = memory.host_memory
            for name, value in memory.extra.items():
                result.metrics[f"device_{name}_bytes"] = float(value)
        return stats
