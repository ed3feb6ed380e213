"""Set-up cost of a configuration: what it spends before its first training step, phase by phase.

Each phase is wall time in seconds, recorded as the metric ``setup_<phase>_s`` (:data:`SETUP_PHASES` says what each
covers). The configuration process measures its own phases (:class:`SetupClock`); a workload adds its own through
the same clock (model, tokenization, fingerprint...). Phases a configuration did not go through are absent, never 0.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

#: Every phase the suite or a workload records, in the order they happen, with what it covers.
SETUP_PHASES: dict[str, str] = {
    "process_start": "from the runner starting the process to its first line of Python (interpreter start)",
    "imports": "importing the suite, torch, the device's and the workload's modules",
    "device": "device set-up: the adapter, the distributed group, determinism and seeds",
    "dataset": "opening the dataset: reading its metadata and checking every file (without hashing)",
    "fingerprint": "the dataset fingerprint: a sha256 per file (cached by path, size and mtime) and of the set",
    "tokenization": "the workload's text preprocessing: tokenizing every caption (cached where the workload caches it)",
    "model": "building (or loading) the model, weights fingerprint, placing it on the device, optimizer",
    "eval_inputs": "the workload's held-out inputs prepared once, before the run (read from the cache where an "
                   "earlier run made them)",
    "loader_start": "from the start of training to the first batch in hand (loader workers started)",
    "first_step": "from the configuration's start (its hand-over to a process started ahead of its turn, or its "
                  "launch) to the end of its first training step: the first-step latency",
    "mlflow": "the runner opening the MLflow store, experiment and matrix run (once per matrix; on the matrix run)",
}

#: A phase's metric name.
METRIC = "setup_{}_s"


def metric_name(phase: str) -> str:
    if phase not in SETUP_PHASES:
        raise KeyError(f"unknown set-up phase {phase!r}; known: {', '.join(SETUP_PHASES)}")
    return METRIC.format(phase)


class SetupClock:
    """Wall time per named phase (:data:`SETUP_PHASES`); a phase timed twice adds up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        metric_name(phase)  # a typo is an error, not a new metric
        self.seconds[phase] = self.seconds.get(phase, 0.0) + max(0.0, seconds)

    @contextlib.contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - started)

    def metrics(self) -> dict[str, float]:
        """``{"setup_<phase>_s": seconds}`` in :data:`SETUP_PHASES` order."""
        return {metric_name(p): self.seconds[p] for p in SETUP_PHASES if p in self.seconds}


def process_started_at() -> float:
    """When this process started (wall clock): where a matrix run as a program begins (its imports count too)."""
    import psutil

    return psutil.Process().create_time()
