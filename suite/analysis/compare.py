"""Configurations side by side: one row per configuration id, with speed-ups against a baseline.

Rows come from a results folder (here) or from MLflow (:func:`suite.tracking.reading.rows_from_mlflow`). A row is
keyed by :attr:`suite.config.RunConfig.config_id` and nothing else, so configurations that differ in any field
(engine, prefetch factor, processes, batch size, seed, dataset...) are never merged. Several finished runs of
one configuration (repeats, or the same configuration in several matrices) make one row: throughput is their
MLPerf-style score (:func:`suite.analysis.scoring.score_values`), every other metric their median; the row says
how many runs it holds and how many of that configuration's runs did not finish.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from suite.analysis import memory_trend
from suite.analysis.scoring import score_values
from suite.config import RunConfig
from suite.errors import SuiteError
from suite.figures import (
    CONTENTION_OTHERS_CPU_SHARE,
    CONTENTION_PAUSED_SHARE,
    CONTENTION_STEAL_SHARE,
    THROUGHPUT_CI95_HIGH,
    THROUGHPUT_CI95_LOW,
    THROUGHPUT_CV,
    THROUGHPUT_SAMPLES_PER_S,
    device_memory_is_host,
)
from suite.meters.contention import is_contended
from suite.results.record import FINISHED, RunResult, bootstrap_mean_ci, distinct_runs

THROUGHPUT = THROUGHPUT_SAMPLES_PER_S


@dataclass(frozen=True)
class Row:
    config: RunConfig
    metrics: dict[str, float]
    runs: int = 1
    unfinished_runs: int = 0
    mlflow_run_ids: tuple[str, ...] = ()
    matrix_run_ids: tuple[str, ...] = ()
    aggregation: str = "one run"
    #: which result set the row comes from, where several are compared (see :func:`label_sets`)
    set_label: str = ""
    #: plateau / growing / inconclusive over its runs' measured windows, host and device (the worst of them);
    #: ``None`` where no run recorded one (see suite.analysis.memory_trend)
    memory_trend: str | None = None
    #: its runs' device peak memory is the host's (the device has no memory of its own; see
    #: suite.figures.device_memory_is_host)
    device_memory_is_host: bool = False

    @property
    def config_id(self) -> str:
        return self.config.config_id

    @property
    def label(self) -> str:
        return f"{self.set_label}: {self.config.describe()}" if self.set_label else self.config.describe()

    @property
    def contended(self) -> bool:
        """Other work used the machine during its measured windows (see suite.meters.contention)."""

        return is_contended(self.metrics.get(CONTENTION_OTHERS_CPU_SHARE, 0.0),
                            self.metrics.get(CONTENTION_STEAL_SHARE, 0.0),
                            self.metrics.get(CONTENTION_PAUSED_SHARE, 0.0))

    def as_dict(self) -> dict[str, Any]:
        return {"config_id": self.config_id, "label": self.label, "contended": self.contended,
                "memory_trend": self.memory_trend, "device_memory_is_host": self.device_memory_is_host,
                "config": self.config.to_dict(),
                "metrics": self.metrics, "runs": self.runs, "unfinished_runs": self.unfinished_runs,
                "aggregation": self.aggregation, "mlflow_run_ids": list(self.mlflow_run_ids),
                "matrix_run_ids": list(self.matrix_run_ids), "set": self.set_label}


@dataclass
class RowGroup:
    """The runs of one configuration id, gathered before they become a :class:`Row`."""

    config: RunConfig
    metrics: list[dict[str, float]] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    unfinished: int = 0
    device_memory_is_host: bool = False


def _sort_key(row: Row) -> tuple[Any, ...]:
    c = row.config
    return (c.workload, c.preset, c.device, c.engine, c.loader, c.precision, c.prefetch_factor or 0,
            c.nproc_per_node, c.batch_size or 0, c.num_workers, row.config_id)


def rows_of(groups: Iterable[RowGroup]) -> list[Row]:
    """One row per group with at least one finished run, sorted by the configuration's axes."""
    rows = []
    for group in groups:
        if not group.metrics:
            continue
        merged: dict[str, float] = {}
        for key in sorted({k for m in group.metrics for k in m}):
            values = [m[key] for m in group.metrics if key in m]
            merged[key] = float(statistics.median(values))
        aggregation = "one run"
        if len(group.metrics) > 1:
            values = [m[THROUGHPUT] for m in group.metrics]
            score, cv, _, method = score_values(values)
            merged[THROUGHPUT] = score
            if cv is not None:
                merged[THROUGHPUT_CV] = cv
            merged[THROUGHPUT_CI95_LOW], merged[THROUGHPUT_CI95_HIGH] = bootstrap_mean_ci(values)
            aggregation = (f"{len(values)} runs: throughput {method}, its 95 % interval over the runs; other metrics: "
                           "median")
        trend = memory_trend.worst(memory_trend.verdict_from_metrics(m, prefix) for m in group.metrics
                                   for prefix, _ in memory_trend.SERIES)
        rows.append(Row(group.config, merged, len(group.metrics), group.unfinished, tuple(group.run_ids),
                        tuple(dict.fromkeys(group.parents)), aggregation, memory_trend=trend,
                        device_memory_is_host=group.device_memory_is_host))
    return sorted(rows, key=_sort_key)


def rows_from_results(results: Sequence[RunResult]) -> list[Row]:
    """One row per configuration id of a results folder's runs, each run counted once (by its run uid)."""
    groups: dict[str, RowGroup] = {}
    for result in distinct_runs(results)[0]:
        config = result.config
        group = groups.setdefault(config.config_id, RowGroup(config))
        if result.status != FINISHED or THROUGHPUT not in result.metrics:
            group.unfinished += 1
            continue
        group.metrics.append(dict(result.metrics))
        group.device_memory_is_host |= device_memory_is_host(result.facts)
        if result.mlflow_run_id:
            group.run_ids.append(result.mlflow_run_id)
    return rows_of(groups.values())


def nothing_comparable(results: Sequence[RunResult], source: object, doing: str) -> SuiteError:
    """The error when ``results`` give no row: none finished, or those that did recorded no usable throughput
    (the reasons said)."""
    finished = [r for r in results if r.status == FINISHED]
    reasons = sorted({r.unusable[THROUGHPUT][1] for r in finished if THROUGHPUT in r.unusable})
    if finished and reasons:
        shown = "; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else "")
        return SuiteError(f"no configuration of {source} recorded a usable throughput ({THROUGHPUT}: {shown}): "
                          f"nothing to {doing}")
    return SuiteError(f"no configuration of {source} finished: nothing to {doing}")


def pick_baseline(rows: Sequence[Row], baseline: str | None = None) -> Row:
    """The row a speed-up is relative to: the one whose id (or label, or MLflow run id) contains ``baseline``;
    default the first row."""
    if not rows:
        raise SuiteError("no finished configuration to compare")
    if not baseline:
        return rows[0]
    matches = [r for r in rows if baseline in r.config_id or baseline in r.label or baseline in r.mlflow_run_ids]
    if len(matches) != 1:
        listing = "; ".join(r.config_id for r in rows)
        what = "matches no configuration" if not matches else f"matches {len(matches)} configurations"
        raise SuiteError(f"baseline {baseline!r} {what}; configurations: {listing}")
    return matches[0]


def speedups(rows: Sequence[Row], baseline: str | None = None) -> tuple[Row, list[float]]:
    """Throughput of each row over the baseline row's."""
    base = pick_baseline(rows, baseline)
    reference = base.metrics[THROUGHPUT]
    return base, [r.metrics[THROUGHPUT] / reference for r in rows]


@dataclass(frozen=True)
class ResultSet:
    """One result set of a comparison: its name (a folder's, an MLflow run's), facts about it (when it started,
    host, commit) and its rows."""

    name: str
    facts: dict[str, str]
    rows: list[Row]


def label_sets(sets: Sequence[ResultSet]) -> list[Row]:
    """The rows of every set; where there are several, each row's ``set_label`` names its set and what tells the
    sets apart: of steps, preset, batch size, start time, host and commit, those that differ between sets."""
    if len(sets) < 2:
        return [row for result_set in sets for row in result_set.rows]
    described = []
    for result_set in sets:
        configs = [row.config for row in result_set.rows]
        described.append({"steps": ",".join(sorted({str(c.steps) for c in configs})),
                          "preset": ",".join(sorted({c.preset for c in configs})),
                          "batch": ",".join(sorted({str(c.batch_size) for c in configs})), **result_set.facts})
    keys = [key for key in dict.fromkeys(k for d in described for k in d)
            if len({d.get(key, "") for d in described}) > 1]
    names = [s.name for s in sets]
    rows = []
    for index, (result_set, facts) in enumerate(zip(sets, described, strict=True)):
        name = result_set.name if names.count(result_set.name) == 1 else f"{result_set.name} #{index + 1}"
        differs = ", ".join(f"{key} {facts[key]}" for key in keys if facts.get(key))
        label = f"{name} ({differs})" if differs else name
        rows += [dataclasses.replace(row, set_label=label) for row in result_set.rows]
    return rows
