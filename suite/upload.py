"""``suite upload``: record a results directory into MLflow after the fact, without duplicates.

Used when the tracking server was unreachable during a matrix (results.json kept every run), or to
copy a matrix into another store. Runs are matched by the uids the runner gave them: complete runs
are left alone, runs started but never completed are completed, the rest are created.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from suite.errors import SuiteError
from suite.fileio import write_json_atomic
from suite.recorders.base import MatrixInfo
from suite.recorders.json_results import MATRIX_FILE, RESULTS_FILE, SCORES_FILE
from suite.recorders.mlflow_tracking import MlflowRecorder
from suite.results import RunResult
from suite.scoring import ConfigScore


@dataclass(frozen=True)
class UploadReport:
    recorded: int
    already_there: int
    parent_run_id: str | None


def upload(directory: Path, tracking_uri: str) -> UploadReport:
    matrix_file, results_file = directory / MATRIX_FILE, directory / RESULTS_FILE
    for required in (matrix_file, results_file):
        if not required.is_file():
            raise SuiteError(f"{directory} is not a results directory: {required.name} is missing")
    matrix = json.loads(matrix_file.read_text())
    records = json.loads(results_file.read_text())
    results = [RunResult.from_dict(r) for r in records]
    missing_uid = [i for i, r in enumerate(results) if not r.run_uid]
    if missing_uid or "uid" not in matrix:
        raise SuiteError(f"{results_file} predates run uids: it cannot be matched against MLflow safely")
    scores_file = directory / SCORES_FILE
    scores = json.loads(scores_file.read_text()) if scores_file.is_file() else []
    info = MatrixInfo(name=matrix["name"], workload=matrix["workload"], command=matrix["command"],
                      output_dir=directory, repeats=matrix.get("repeats", 1), experiment=matrix.get("experiment"),
                      tags=matrix.get("tags", {}), params=matrix.get("params", {}), uid=matrix["uid"])
    recorder = MlflowRecorder(tracking_uri, resume=True)
    recorder.open(info)
    for result in results:
        recorder.end(result)
    for score in scores:
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in score.items()}
        recorder.score(ConfigScore(**fields))
    recorder.close(matrix.get("status", "FINISHED"))
    write_json_atomic(results_file, [r.to_dict() for r in results])  # now with every MLflow run id
    return UploadReport(len(results) - len(recorder.skipped), len(recorder.skipped), recorder.parent_run_id)
