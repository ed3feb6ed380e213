"""Synchronized step timing with data-wait accounting.

Steps are timed back to back: the end of one step is the start of the next, so the sum of step times
is exactly the measured wall time and nothing between steps escapes the accounting. Each step splits
into *data wait* (from the step start until the batch is in hand) and the rest. The clock is read
only after the device has been synchronized.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class StepTiming:
    step_time_s: float
    data_wait_s: float


class StepTimer:
    """Call :meth:`start` once, then per step :meth:`batch_ready` and :meth:`step_done`."""

    def __init__(self, synchronize: Callable[[], None], clock: Callable[[], float] = time.perf_counter):
        self._synchronize = synchronize
        self._clock = clock
        self._step_start: float | None = None
        self._batch_ready: float | None = None

    def start(self) -> None:
        self._synchronize()
        self._step_start = self._clock()
        self._batch_ready = None

    def batch_ready(self) -> None:
        if self._step_start is None:
            raise RuntimeError("StepTimer.start() must be called before batch_ready()")
        self._batch_ready = self._clock()

    def step_done(self) -> StepTiming:
        if self._step_start is None or self._batch_ready is None:
            raise RuntimeError("StepTimer.step_done() called before batch_ready()")
        self._synchronize()
        now = self._clock()
        timing = StepTiming(step_time_s=now - self._step_start, data_wait_s=self._batch_ready - self._step_start)
        self._step_start, self._batch_ready = now, None
        return timing
