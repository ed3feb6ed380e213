"""``results.json`` (a list of runs, rewritten atomically after every run) and ``scores.json``
(one score per configuration over its repeats)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from suite.fileio import write_json_atomic
from suite.recorders.base import MatrixInfo, Recorder
from suite.results import RunResult
from suite.scoring import ConfigScore

RESULTS_FILE = "results.json"
SCORES_FILE = "scores.json"
MATRIX_FILE = "matrix.json"


class JsonResultsRecorder(Recorder):
    def __init__(self, output_dir: str | Path) -> None:
        self.output_dir = Path(output_dir)
        self.results_path = self.output_dir / RESULTS_FILE
        self._runs: list[dict[str, Any]] = []
        self._scores: list[dict[str, Any]] = []
        self._matrix: dict[str, Any] = {}

    def open(self, info: MatrixInfo) -> None:
        self._matrix = {"name": info.name, "uid": info.uid, "workload": info.workload, "experiment": info.experiment,
                        "command": info.command, "repeats": info.repeats, "tags": info.tags, "params": info.params,
                        "status": "RUNNING"}
        write_json_atomic(self.output_dir / MATRIX_FILE, self._matrix)
        write_json_atomic(self.results_path, self._runs)

    def end(self, result: RunResult) -> None:
        self._runs.append(result.to_dict())
        write_json_atomic(self.results_path, self._runs)

    def score(self, score: ConfigScore) -> None:
        self._scores.append(score.as_dict())
        write_json_atomic(self.output_dir / SCORES_FILE, self._scores)

    def close(self, status: str) -> None:
        self._matrix["status"] = status
        write_json_atomic(self.output_dir / MATRIX_FILE, self._matrix)

    def describe(self) -> dict[str, Any]:
        return {"results": str(self.results_path)}
