"""Runs the suite logs to MLflow besides a matrix's: an audit's, and a tuning sweep's figures on its matrix run."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from suite.errors import SuiteError
from suite.figures import (
    DATA_WAIT_FRACTION,
    HOST_RAM_PEAK_PSS_ANON_BYTES,
    HOST_RAM_PEAK_PSS_BYTES,
    THROUGHPUT_SAMPLES_PER_S,
)
from suite.results.record import FINISHED
from suite.tracking import mlflow_gateway as tags

if TYPE_CHECKING:
    from suite.analysis.tune import TuneOutcome
    from suite.tracking.mlflow_gateway import MlflowGateway


def _tag_safe(text: str) -> str:
    """MLflow tag keys allow alphanumerics, underscores, dashes, periods, spaces and slashes."""
    return re.sub(r"[^\w\-. /]", "_", text)


def log_audit(gateway: MlflowGateway, experiment: str, report: Any, counts: dict[str, int], verdicts: dict[str, str],
              artifact: Path) -> str:
    """Record an audit (``report``: its target, audited run ids, verdict and checks) as an MLflow run linked to the
    audited runs: a metric per verdict count, a tag per check and per check name's verdict; returns its run id."""
    experiment_id = gateway.experiment_id(experiment)
    audited_parent = None
    for run_id in report.audited_run_ids[:1]:
        try:
            audited_parent = gateway.get_run(run_id).data.tags.get(tags.PARENT_RUN_ID)
        except SuiteError:  # the audited runs may live in another store
            audited_parent = None
    run_tags = {tags.ROLE: "audit", "suite.audited_target": report.target[:5000],
                "suite.audited_run_ids": ",".join(report.audited_run_ids)[:5000],
                "suite.verdict": report.verdict}
    if audited_parent:
        run_tags["suite.audited_run_id"] = audited_parent
    run_id = gateway.create_run(experiment_id, f"audit-{time.strftime('%Y%m%d-%H%M%S')}", run_tags,
                                {"target": report.target[:500]})
    now = int(time.time() * 1000)
    check_tags = {f"check.{i:03d}.{_tag_safe(c.subject)}.{c.name}"[:250]: f"{c.verdict}: {c.detail}"[:5000]
                  for i, c in enumerate(report.checks)}
    check_tags.update({f"suite.verdict.{_tag_safe(name)}"[:250]: verdict  # per check, over its subjects
                       for name, verdict in verdicts.items()})
    gateway.log(run_id, metrics=[(f"checks_{k.lower()}", float(v), now, 0) for k, v in counts.items()],
                tags=check_tags)
    gateway.log_artifact(run_id, artifact)
    gateway.terminate(run_id, "FINISHED")
    return run_id


def log_tune(gateway: MlflowGateway, run_id: str, outcome: TuneOutcome, files: Sequence[Path]) -> None:
    """The sweep as metrics over num_workers (one series per prefetch factor), the pick as tags."""
    now_ms = int(time.time() * 1000)
    metrics = []
    for point in outcome.points:
        if point.status != FINISHED:
            continue
        suffix = "workers0" if point.prefetch_factor is None else f"pf{point.prefetch_factor}"
        for name in (THROUGHPUT_SAMPLES_PER_S, HOST_RAM_PEAK_PSS_ANON_BYTES, HOST_RAM_PEAK_PSS_BYTES,
                     DATA_WAIT_FRACTION):
            value = getattr(point, name)
            if value is not None:
                metrics.append((f"tune.{name}.{suffix}", float(value), now_ms, point.num_workers))
    pick = outcome.recommended
    gateway.log(run_id, metrics=metrics, tags={
        "suite.tune.recommended_num_workers": pick.num_workers,
        "suite.tune.recommended_prefetch_factor": pick.prefetch_factor,
        "suite.tune.best_num_workers": outcome.best.num_workers,
        "suite.tune.tolerance": outcome.tolerance})
    for path in files:
        gateway.log_artifact(run_id, path, artifact_path="tune")
