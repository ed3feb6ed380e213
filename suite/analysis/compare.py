"""Configurations side by side: one row per configuration id, with speed-ups against a baseline.

Rows come from a results folder, an MLflow matrix run, a whole experiment, or an MLflow filter string. A row is
keyed by :attr:`suite.config.RunConfig.config_id` and nothing else, so configurations that differ in any field
(engine, prefetch factor, processes, batch size, seed, dataset...) are never merged. Several finished runs of
one configuration (repeats, or the same configuration in several matrices) make one row: throughput is their
MLPerf-style score (:func:`suite.analysis.scoring.score_values`), every other metric their median; the row says
how many runs it holds and how many of that configuration's runs did not finish.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from suite.analysis.scoring import score_values
from suite.config import RunConfig
from suite.errors import SuiteError
from suite.records.results import FINISHED, RunResult, bootstrap_mean_ci

THROUGHPUT = "throughput_samples_per_s"


@dataclass(frozen=True)
class Row:
    config: RunConfig
    metrics: dict[str, float]
    runs: int = 1
    unfinished_runs: int = 0
    mlflow_run_ids: tuple[str, ...] = ()
    matrix_run_ids: tuple[str, ...] = ()
    aggregation: str = "one run"

    @property
    def config_id(self) -> str:
        return self.config.config_id

    @property
    def label(self) -> str:
        return self.config.describe()

    @property
    def contended(self) -> bool:
        """Other work used the machine during its measured windows (see suite.trackers.contention)."""
        from suite.trackers.contention import is_contended

        return is_contended(self.metrics.get("contention_others_cpu_share", 0.0),
                            self.metrics.get("contention_steal_share", 0.0))

    def as_dict(self) -> dict[str, Any]:
        return {"config_id": self.config_id, "label": self.label, "contended": self.contended,
                "config": self.config.to_dict(),
                "metrics": self.metrics, "runs": self.runs, "unfinished_runs": self.unfinished_runs,
                "aggregation": self.aggregation, "mlflow_run_ids": list(self.mlflow_run_ids),
                "matrix_run_ids": list(self.matrix_run_ids)}


@dataclass
class _Group:
    config: RunConfig
    metrics: list[dict[str, float]] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    unfinished: int = 0


def _sort_key(row: Row) -> tuple[Any, ...]:
    c = row.config
    return (c.workload, c.preset, c.device, c.engine, c.loader, c.precision, c.prefetch_factor or 0,
            c.nproc_per_node, c.batch_size or 0, c.num_workers, row.config_id)


def _rows(groups: Iterable[_Group]) -> list[Row]:
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
                merged["throughput_cv"] = cv
            merged["throughput_ci95_low"], merged["throughput_ci95_high"] = bootstrap_mean_ci(values)
            aggregation = (f"{len(values)} runs: throughput {method}, its 95 % interval over the runs; other metrics: "
                           "median")
        rows.append(Row(group.config, merged, len(group.metrics), group.unfinished, tuple(group.run_ids),
                        tuple(dict.fromkeys(group.parents)), aggregation))
    return sorted(rows, key=_sort_key)


def rows_from_results(results: Sequence[RunResult]) -> list[Row]:
    """One row per configuration id of a results folder's runs."""
    groups: dict[str, _Group] = {}
    for result in results:
        config = result.config
        group = groups.setdefault(config.config_id, _Group(config))
        if result.status != FINISHED or THROUGHPUT not in result.metrics:
            group.unfinished += 1
            continue
        group.metrics.append(dict(result.metrics))
        if result.mlflow_run_id:
            group.run_ids.append(result.mlflow_run_id)
    return _rows(groups.values())


def rows_from_mlflow(gateway: Any, run_id: str | None = None, experiment: str | None = None,
                     filter_string: str | None = None) -> list[Row]:
    """One row per configuration id over the measured runs (one per configuration run, repeats included) of a
    matrix run, an experiment, or matching a filter string; every page of results is read."""
    from suite.recorders import mlflow_gateway as tags
    from suite.recorders.metric_names import suite_metrics

    clauses = [f"tags.`{tags.ROLE}` != 'matrix'", f"tags.`{tags.ROLE}` != 'audit'"]
    if run_id:
        matrix = gateway.get_run(run_id)
        experiment_ids = [matrix.info.experiment_id]
        uid = matrix.data.tags.get(tags.MATRIX_UID)
        if matrix.data.tags.get(tags.ROLE) != "matrix" or not uid:
            raise SuiteError(f"MLflow run {run_id} is not a matrix run of this suite")
        matrix_id = matrix.data.tags.get(tags.MATRIX_ID)  # a shard: every shard of its matrix
        clauses.append(f"tags.`{tags.MATRIX_ID}` = '{matrix_id}'" if matrix_id
                       else f"tags.`{tags.MATRIX_UID}` = '{uid}'")
    elif experiment:
        found = gateway.experiment_id(experiment, create=False)
        if found is None:
            raise SuiteError(f"no MLflow experiment {experiment!r} at {gateway.tracking_uri}")
        experiment_ids = [found]
    else:
        experiment_ids = gateway.all_experiment_ids()
    if filter_string:
        clauses.append(f"({filter_string})" if " or " in filter_string.lower() else filter_string)
    groups: dict[str, _Group] = {}
    for run in gateway.search_runs(experiment_ids, " and ".join(clauses)):
        if tags.RUN_UID not in run.data.tags:  # a configuration run that holds the score of its repeats
            continue
        try:
            config = RunConfig.from_params(run.data.params)
        except SuiteError as exc:
            raise SuiteError(f"MLflow run {run.info.run_id}: {exc}") from None
        group = groups.setdefault(config.config_id, _Group(config))
        metrics = suite_metrics(run.data.metrics)
        if run.info.status != FINISHED or THROUGHPUT not in metrics:
            group.unfinished += 1
            continue
        group.metrics.append(metrics)
        group.run_ids.append(run.info.run_id)
        parent = _matrix_run_of(gateway, run)
        if parent:
            group.parents.append(parent)
    return _rows(groups.values())


def _matrix_run_of(gateway: Any, run: Any) -> str | None:
    from suite.recorders import mlflow_gateway as tags

    parent = run.data.tags.get(tags.PARENT_RUN_ID)
    if run.data.tags.get(tags.ROLE) == "repeat" and parent:  # repeat -> configuration -> matrix
        parent = gateway.get_run(parent).data.tags.get(tags.PARENT_RUN_ID)
    return parent


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
