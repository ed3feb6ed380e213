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
        "throughput_samples_per_s",
        "step_time_p50_s",
        "step_time_p90_s",
        "step_time_p99_s",
        "data_wait_fraction",
        "measured_steps",
        "measured_wall_s",
        "throughput_ci95_low",
        "throughput_ci95_high",
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


WORKER_NODE = "worker"  # facts["node_role"] of a run whose measurement another node recorded


@dataclass
class RunResult:
    """The record of one configuration: what ran, how it ended, what it measured.

    ``metrics`` holds scalar metrics under their public names; ``losses`` the loss of every step
    (warm-up included, step index = position); ``facts`` what actually ran (device, precision,
    loader, batch size used...).
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
            "metrics": self.metrics,
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
        known = {f.name for f in fields(cls)}
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
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"metric {name} is not a number: {value!r}")
        for name in ("reason", "run_uid", "mlflow_run_id"):
            if data.get(name) is not None and not isinstance(data[name], str):
                raise ValueError(f"{name} is not a string")
        for name in ("started_at", "ended_at"):
            value = data.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{name} is not a number")
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
            raise ValueError("loss_digest does not match the recorded losses: the record is corrupt or edited")
        return result


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
