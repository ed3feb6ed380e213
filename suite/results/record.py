"""Results: raw per-step samples, the statistics derived from them, and the record of one run.

:class:`StepStats` keeps only raw samples of the *measured* steps (warm-up steps are excluded the same
way on every device); every statistic is a cached property listed in :attr:`StepStats.fields`, which
drives :meth:`StepStats.as_dict`. Metric names are the public MLflow/JSON keys.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Sequence

import numpy as np

from suite.config import RunConfig
from suite.errors import LossDigestMismatch
from suite.figures import (
    DATA_WAIT_FRACTION,
    MEASURED_STEPS,
    MEASURED_WALL_S,
    STEP_TIME_P50_S,
    STEP_TIME_P90_S,
    STEP_TIME_P99_S,
    THROUGHPUT_CI95_HIGH,
    THROUGHPUT_CI95_LOW,
    THROUGHPUT_SAMPLES_PER_S,
    misfit_fact,
    usable,
)
from suite.meters.timing import StepTiming

FINISHED = "FINISHED"
FAILED = "FAILED"
KILLED = "KILLED"
RUNNING = "RUNNING"  # a matrix still running (or whose runner died: see ``suite recover``)
#: How a configuration's run can end.
END_STATUSES = (FINISHED, FAILED, KILLED)


@dataclass(frozen=True)
class StepStats:
    """Statistics of the measured steps of one run."""

    step_times_s: tuple[float, ...]
    data_waits_s: tuple[float, ...]
    samples_per_step: int

    fields = (
        THROUGHPUT_SAMPLES_PER_S,
        STEP_TIME_P50_S,
        STEP_TIME_P90_S,
        STEP_TIME_P99_S,
        DATA_WAIT_FRACTION,
        MEASURED_STEPS,
        MEASURED_WALL_S,
        THROUGHPUT_CI95_LOW,
        THROUGHPUT_CI95_HIGH,
    )

    def __post_init__(self) -> None:
        if not self.step_times_s:
            raise ValueError("StepStats needs at least one measured step")
        if len(self.step_times_s) != len(self.data_waits_s):
            raise ValueError("step_times_s and data_waits_s differ in length")
        if self.samples_per_step < 1:
            raise ValueError(f"samples_per_step must be >= 1, got {self.samples_per_step}")

    @classmethod
    def from_timings(cls, timings: Sequence[StepTiming], samples_per_step: int) -> "StepStats":
        return cls(
            tuple(t.step_time_s for t in timings), tuple(t.data_wait_s for t in timings), samples_per_step
        )

    @cached_property
    def measured_steps(self) -> int:
        return len(self.step_times_s)

    @cached_property
    def measured_wall_s(self) -> float:
        # Steps are timed back to back, so their sum is the measured wall time.
        return math.fsum(self.step_times_s)

    @cached_property
    def throughput_samples_per_s(self) -> float:
        return self.measured_steps * self.samples_per_step / self.measured_wall_s

    def _percentile(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.step_times_s), q))

    @cached_property
    def step_time_p50_s(self) -> float:
        return self._percentile(50)

    @cached_property
    def step_time_p90_s(self) -> float:
        return self._percentile(90)

    @cached_property
    def step_time_p99_s(self) -> float:
        return self._percentile(99)

    @cached_property
    def _throughput_ci95(self) -> tuple[float, float]:
        return bootstrap_throughput_ci(self.step_times_s, self.samples_per_step)

    @cached_property
    def throughput_ci95_low(self) -> float:
        """Lower end of the 95 % interval of the throughput (block bootstrap over the measured steps)."""
        return self._throughput_ci95[0]

    @cached_property
    def throughput_ci95_high(self) -> float:
        return self._throughput_ci95[1]

    @cached_property
    def data_wait_fraction(self) -> float:
        return math.fsum(self.data_waits_s) / self.measured_wall_s

    def as_dict(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in self.fields}


#: Resamples of the bootstrap; blocks of consecutive steps resampled (at most this many blocks).
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_BLOCKS = 40


def bootstrap_throughput_ci(step_times_s: Sequence[float], samples_per_step: float, level: float = 0.95,
                            seed: int = 0) -> tuple[float, float]:
    """A ``level`` interval of the throughput over these steps: a block bootstrap (consecutive steps grouped into
    at most :data:`BOOTSTRAP_BLOCKS` blocks, resampled with replacement, :data:`BOOTSTRAP_RESAMPLES` times, a fixed
    seed so the same steps give the same interval), which respects the correlation between neighbouring steps.
    One step gives a zero-width interval: nothing is known of its spread."""
    times = np.asarray(step_times_s, dtype=np.float64)
    if len(times) < 2:
        value = samples_per_step * len(times) / float(times.sum())
        return value, value
    blocks = np.array_split(times, min(len(times), BOOTSTRAP_BLOCKS))
    sums = np.array([b.sum() for b in blocks])
    counts = np.array([len(b) for b in blocks])
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(blocks), size=(BOOTSTRAP_RESAMPLES, len(blocks)))
    throughput = counts[pick].sum(axis=1) * samples_per_step / sums[pick].sum(axis=1)
    low, high = np.quantile(throughput, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def bootstrap_mean_ci(values: Sequence[float], level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """A ``level`` bootstrap interval of the mean of ``values`` (repeats of a configuration)."""
    data = np.asarray(values, dtype=np.float64)
    if len(data) < 2:
        return float(data.mean()), float(data.mean())
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(BOOTSTRAP_RESAMPLES, len(data)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def losses_hex(losses: Sequence[float]) -> list[str]:
    """Each loss exactly, as ``float.hex`` (no decimal rounding)."""
    return [float(x).hex() for x in losses]


def loss_digest(losses: Sequence[float]) -> str:
    """sha256 of the exact loss trajectory; equal digests mean bit-identical trajectories."""
    return hashlib.sha256("\n".join(losses_hex(losses)).encode()).hexdigest()


#: The longest name of a metric or of a fact's field (MLflow's own limit for a metric key): every name becomes a
#: column of ``suite export``, a row of a table, an MLflow key.
MAX_NAME = 250


def _overlong_key(value: Any) -> str | None:
    """The first key of ``value`` (an object, at any depth) longer than :data:`MAX_NAME`."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if len(key) > MAX_NAME:
                    return key
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)
    return None


#: The latest time a record may hold (the year 3000): beyond it a date cannot be shown (``time.gmtime``).
LATEST_TIMESTAMP = 32_503_680_000.0


def timestamp_problem(value: Any) -> str | None:
    """Why ``value`` is not a time a record can hold (``None`` where it is, or is absent): seconds since the epoch,
    a finite number from 1970 to the year 3000."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "is not a number"
    if not 0 <= value <= LATEST_TIMESTAMP:
        return f"is {value!r}, not a time from 1970 to the year 3000 (seconds since the epoch)"
    return None


WORKER_NODE = "worker"  # facts["node_role"] of a run whose measurement another node recorded


@dataclass
class RunResult:
    """The record of one configuration: what ran, how it ended, what it measured.

    ``metrics`` holds scalar metrics under their public names; ``losses`` the loss of every step
    (warm-up included, step index = position); ``facts`` what actually ran (device, precision,
    loader, batch size used...). A record read back keeps apart, in ``unusable``, each recorded metric whose value
    its figure cannot take (:mod:`suite.figures`: NaN, a throughput of 0...) with the reason: every reader shows it
    as "-" and never computes with it; it is written back as it was read.
    """

    config: RunConfig
    status: str
    reason: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    mlflow_run_id: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    repeat: int = 0
    run_uid: str | None = None
    unusable: dict[str, tuple[Any, str]] = field(default_factory=dict, compare=False)

    @property
    def loss_digest(self) -> str:
        return loss_digest(self.losses)

    @property
    def recorded_elsewhere(self) -> bool:
        """This node ran its share of a multi-node configuration whose global rank 0, on another node, measured
        and recorded it: kept in this node's results folder, never scored or sent to MLflow from here."""
        return self.facts.get("node_role") == WORKER_NODE

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "repeat": self.repeat,
            "run_uid": self.run_uid,
            "status": self.status,
            "reason": self.reason,
            "metrics": {**self.metrics, **{name: value for name, (value, _) in self.unusable.items()}},
            "loss_digest": self.loss_digest,
            "losses_hex": losses_hex(self.losses),
            "losses": self.losses,
            "facts": self.facts,
            "mlflow_run_id": self.mlflow_run_id,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "RunResult":
        """Rebuild from :meth:`to_dict` output, checking every field; the exact losses (hex) win and must match
        the digest. Raises ``ValueError`` saying what is wrong (the results store adds the file)."""
        if not isinstance(data, dict):
            raise ValueError(f"a run record must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        digest = data.pop("loss_digest", None)
        hexes = data.pop("losses_hex", None)
        known = {f.name for f in fields(cls)} - {"unusable"}  # unusable: made here, never read
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}")
        missing = [name for name in ("config", "status") if name not in data]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        if not isinstance(data["config"], dict):
            raise ValueError("config is not a JSON object")
        if data["status"] not in END_STATUSES:
            raise ValueError(f"status {data['status']!r} is not one of {', '.join(END_STATUSES)}")
        for name, kind in (("metrics", dict), ("facts", dict), ("losses", list)):
            if name in data and not isinstance(data[name], kind):
                raise ValueError(f"{name} is not a JSON {'object' if kind is dict else 'array'}")
        for name, value in data.get("metrics", {}).items():
            if len(name) > MAX_NAME:
                raise ValueError(f"a metric name of {len(name):,} characters (over {MAX_NAME}): {name[:40]!r}...")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"metric {name} is not a number: {value!r}")
        long_key = _overlong_key(data.get("facts", {}))
        if long_key is not None:
            raise ValueError(f"facts: a name of {len(long_key):,} characters (over {MAX_NAME}): {long_key[:40]!r}...")
        recorded = data.get("metrics", {})
        data["metrics"], set_aside = usable(recorded)
        data["unusable"] = {name: (recorded[name], reason) for name, reason in set_aside.items()}
        for name in ("reason", "run_uid", "mlflow_run_id"):
            if data.get(name) is not None and not isinstance(data[name], str):
                raise ValueError(f"{name} is not a string")
        for name in ("started_at", "ended_at"):
            problem = timestamp_problem(data.get(name))
            if problem:
                raise ValueError(f"{name} {problem}")
        misfit = misfit_fact(data.get("facts", {}))
        if misfit:
            raise ValueError(misfit)
        if isinstance(data.get("repeat"), bool) or not isinstance(data.get("repeat", 0), int):
            raise ValueError("repeat is not an integer")
        if hexes is not None:
            try:
                data["losses"] = [float.fromhex(h) for h in hexes]
            except (TypeError, ValueError):
                raise ValueError("losses_hex holds a value that is not a hex float") from None
        elif any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in data.get("losses", [])):
            raise ValueError("losses holds a value that is not a number")
        data["config"] = RunConfig.from_dict(data["config"])  # a ConfigError (a ValueError) names the field
        result = cls(**data)
        if digest is not None and digest != result.loss_digest:
            raise LossDigestMismatch("loss_digest does not match the recorded losses: the record is corrupt or "
                                     "edited")
        return result


def distinct_runs(results: Sequence["RunResult"]) -> tuple[list["RunResult"], list[str]]:
    """``results`` with each run counted once (the first record of each ``run_uid``; a run without one kept), and
    the run uids listed more than once: one run copied in a record is still one run (compare, report, score)."""
    seen: set[str] = set()
    kept, repeated = [], []
    for result in results:
        if result.run_uid is not None:
            if result.run_uid in seen:
                repeated.append(result.run_uid)
                continue
            seen.add(result.run_uid)
        kept.append(result)
    return kept, list(dict.fromkeys(repeated))


def unusable_notes(results: Sequence["RunResult"]) -> list[str]:
    """A line per run whose record holds figures that no reader may use (``RunResult.unusable``): its
    configuration, each figure and why (``device=cpu workers=0 ...: throughput_samples_per_s: nan is not a finite
    number``)."""
    notes = []
    for result in results:
        if result.unusable:
            figures = "; ".join(f"{name}: {reason}" for name, (_, reason) in sorted(result.unusable.items()))
            notes.append(f"{result.config.describe()}{f' #{result.repeat}' if result.repeat else ''}: {figures}")
    return notes


def differing_datasets(results: Sequence["RunResult"]) -> dict[str, list[str]]:
    """Runs grouped by the dataset fingerprint they recorded (a 12-character digest of it -> their configurations),
    when they did not all read the same data (a file replaced mid-matrix); empty when they did."""
    groups: dict[str, list[str]] = {}
    for result in results:
        fingerprint = (result.facts.get("workload") or {}).get("dataset_fingerprint")
        if fingerprint is None:
            continue
        digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:12]
        label = result.config.describe()
        groups.setdefault(digest, []).append(label + (f" #{result.repeat}" if result.repeat else ""))
    return groups if len(groups) > 1 else {}


def dataset_warning(groups: dict[str, list[str]]) -> str:
    """One sentence for :func:`differing_datasets`'s groups (empty: none)."""
    if not groups:
        return ""
    parts = "; ".join(f"{len(labels)} run(s) read dataset {digest} ({', '.join(labels[:3])}"
                      f"{' and more' if len(labels) > 3 else ''})" for digest, labels in groups.items())
    return (f"the dataset changed during the matrix: {parts}. Figures of runs that read different data are not "
            "comparable")
