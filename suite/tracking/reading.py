"""What the suite reads back from MLflow: comparison rows, a matrix run's records, and what a report of an MLflow
matrix run shows (its tags, its first manifest, the audits linked to it). The only module that knows how the
suite's runs are tagged, besides the recorder that tags them."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from suite.analysis.compare import THROUGHPUT, ResultSet, Row, RowGroup, rows_of
from suite.config import RunConfig
from suite.errors import SuiteError
from suite.figures import usable
from suite.results.files import read_json, read_results_file, read_scores_file, validate_result
from suite.results.manifest import MANIFEST_FILE, load_manifest
from suite.results.mlperf_log import RunInterval, interval_or_reason
from suite.results.record import FINISHED, RunResult
from suite.tracking import mlflow_gateway as tags
from suite.tracking.metric_names import suite_metrics

if TYPE_CHECKING:
    from suite.tracking.mlflow_gateway import MlflowGateway


def rows_from_mlflow(gateway: MlflowGateway, run_id: str | None = None, experiment: str | None = None,
                     filter_string: str | None = None) -> list[Row]:
    """One row per configuration id over the measured runs (one per configuration run, repeats included) of a
    matrix run, an experiment, or matching a filter string; every page of results is read."""
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
    groups: dict[str, RowGroup] = {}
    for run in gateway.search_runs(experiment_ids, " and ".join(clauses)):
        if tags.RUN_UID not in run.data.tags:  # a configuration run that holds the score of its repeats
            continue
        try:
            config = RunConfig.from_params(run.data.params)
        except SuiteError as exc:
            raise SuiteError(f"MLflow run {run.info.run_id}: {exc}") from None
        group = groups.setdefault(config.config_id, RowGroup(config))
        metrics, _ = usable(suite_metrics(run.data.metrics))  # a value its figure cannot take: shown as "-"
        if run.info.status != FINISHED or THROUGHPUT not in metrics:
            group.unfinished += 1
            continue
        group.metrics.append(metrics)
        group.device_memory_is_host |= run.data.tags.get(tags.DEVICE_MEMORY) == "host"
        group.run_ids.append(run.info.run_id)
        parent = _matrix_run_of(gateway, run)
        if parent:
            group.parents.append(parent)
    return rows_of(groups.values())


def _matrix_run_of(gateway: MlflowGateway, run: Any) -> str | None:
    parent = run.data.tags.get(tags.PARENT_RUN_ID)
    if run.data.tags.get(tags.ROLE) == "repeat" and parent:  # repeat -> configuration -> matrix
        parent = gateway.get_run(parent).data.tags.get(tags.PARENT_RUN_ID)
    return parent



def matrix_records(gateway: MlflowGateway, run_id: str) -> tuple[list[RunResult], list[dict[str, Any] | None],
                                                    list[dict[str, Any]]]:
    """A matrix run's (or one configuration run's) records from its MLflow artifacts: its runs, each run's manifest
    (``None`` where it has none) and the scores of its repeats."""
    run = gateway.get_run(run_id)
    with tempfile.TemporaryDirectory(prefix="suite-audit-") as workdir:  # everything is read into memory
        def fetch(rid: str, name: str) -> Path | None:
            return gateway.download_artifact(rid, name, Path(workdir) / rid)

        if run.data.tags.get(tags.ROLE) == "matrix":
            results_path = fetch(run_id, "results.json")
            if results_path is None:
                raise SuiteError(f"MLflow run {run_id} has no results.json artifact")
            results = read_results_file(results_path)
            scores_path = fetch(run_id, "scores.json")
            scores = read_scores_file(scores_path) if scores_path else []
        else:
            result_path = fetch(run_id, "result.json")
            if result_path is None:
                raise SuiteError(f"MLflow run {run_id} has no result.json artifact")
            results, scores = [validate_result(read_json(result_path), str(result_path))], []
            results[0].mlflow_run_id = run_id
        manifests = []
        for result in results:
            path = fetch(result.mlflow_run_id, MANIFEST_FILE) if result.mlflow_run_id else None
            manifests.append(load_manifest(path) if path else None)
    return results, manifests, scores




@dataclass(frozen=True)
class MatrixRunView:
    """What a report of an MLflow matrix run shows: its rows, status, tags, command, the manifest of its first
    configuration run (``{}`` without one) and the checks of the audits linked to it (subject, name, verdict,
    detail)."""

    rows: list[Row]
    status: str
    reason: str | None
    tags: dict[str, str]
    command: str
    manifest: dict[str, Any] = field(default_factory=dict)
    audit_checks: list[tuple[str, str, str, str]] = field(default_factory=list)


def matrix_run_view(gateway: MlflowGateway, run_id: str) -> MatrixRunView:
    """A matrix run as its report shows it (see :class:`MatrixRunView`)."""
    matrix = gateway.get_run(run_id)
    rows = rows_from_mlflow(gateway, run_id=run_id)
    manifest: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for row in rows:  # the first configuration run that has one
            path = gateway.download_artifact(row.mlflow_run_ids[0], MANIFEST_FILE, Path(scratch))
            if path is not None:
                manifest = read_json(path)
                break
    checks = []
    for audit in gateway.search_runs([matrix.info.experiment_id], f"tags.`{tags.ROLE}` = 'audit' and "
                                                                   f"tags.`suite.audited_run_id` = '{run_id}'"):
        for key, value in sorted(audit.data.tags.items()):
            if key.startswith("check.") and ": " in value:
                subject, _, name = key.split(".", 2)[-1].rpartition(".")  # check.NNN.<subject>.<name>
                verdict, detail = value.split(": ", 1)
                checks.append((subject, name, verdict, detail))
    return MatrixRunView(rows, matrix.info.status, matrix.data.tags.get("failure_reason"), dict(matrix.data.tags),
                         matrix.data.tags.get(tags.COMMAND, ""), manifest, checks)


def matrix_run_set(gateway: MlflowGateway, run_id: str) -> ResultSet:
    """A matrix run's rows as one result set of a comparison, named by the run, with when it started, on which host
    and at which commit (its tags)."""
    rows = rows_from_mlflow(gateway, run_id=run_id)
    if not rows:
        raise SuiteError(f"no configuration of MLflow run {run_id} finished: nothing to compare")
    run = gateway.get_run(run_id)
    run_tags = run.data.tags
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime(run.info.start_time / 1000))
    return ResultSet(run.info.run_name or run_id[:8], {"started": started, "host": run_tags.get("host.hostname", ""),
                                                       "commit": run_tags.get("git_commit", "")[:10]}, rows)


def run_rows(gateway: MlflowGateway, experiment: str) -> list[dict[str, Any]]:
    """Every configuration run (each repeat its own) of an MLflow experiment as a row of ``suite export``: its
    configuration from its params, its metrics' last values, its status, and its facts from ``facts.json``."""
    from suite.analysis.export import row_of_result

    experiment_id = gateway.experiment_id(experiment, create=False)
    if experiment_id is None:
        raise SuiteError(f"no MLflow experiment {experiment!r} at {gateway.tracking_uri}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="suite-export-") as scratch:
        for run in gateway.search_runs([experiment_id], f"tags.`{tags.ROLE}` != 'matrix' and "
                                                        f"tags.`{tags.ROLE}` != 'audit'"):
            run_tags = run.data.tags
            if tags.RUN_UID not in run_tags:  # a configuration run holding the score of its repeats
                continue
            config = RunConfig.from_params(run.data.params)
            path = gateway.download_artifact(run.info.run_id, "facts.json", Path(scratch) / run.info.run_id)
            facts = read_json(path) if path is not None else {}
            metrics, _ = usable(suite_metrics(run.data.metrics))  # a value its figure cannot take: an empty cell
            result = RunResult(config, run_tags.get(tags.STATUS, run.info.status), run_tags.get("failure_reason"),
                               metrics, facts=facts if isinstance(facts, dict) else {}, mlflow_run_id=run.info.run_id,
                               started_at=run.info.start_time / 1000, ended_at=(run.info.end_time or 0) / 1000 or None,
                               repeat=int(run_tags.get(tags.REPEAT, 0) or 0), run_uid=run_tags.get(tags.RUN_UID))
            rows.append(row_of_result(result, f"mlflow:{experiment}"))
    return rows


def time_to_train_records(gateway: MlflowGateway, run_id: str) -> list[tuple[RunResult, dict[str, Any] | None,
                                                                    RunInterval | str]]:
    """Each configuration run of a matrix run (or the one configuration run) with its manifest and what its
    ``mlperf.log`` artifact says of run_start -> run_stop (a string: why it cannot be read, e.g. no such artifact)."""
    results, manifests, _ = matrix_records(gateway, run_id)
    records: list[tuple[RunResult, dict[str, Any] | None, RunInterval | str]] = []
    with tempfile.TemporaryDirectory(prefix="suite-score-") as workdir:
        for result, manifest in zip(results, manifests, strict=True):
            interval: RunInterval | str = "no MLflow run id recorded, so no mlperf.log to read"
            if result.mlflow_run_id:
                path = gateway.download_artifact(result.mlflow_run_id, "mlperf.log",
                                                 Path(workdir) / result.mlflow_run_id)
                interval = interval_or_reason(path, "no mlperf.log artifact")
            records.append((result, manifest, interval))
    return records
