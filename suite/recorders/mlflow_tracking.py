"""MLflow recording: an experiment per workload, a parent run per matrix, a child run per configuration.

Each child run carries every config field as a param, the metrics under their public names (``loss``
once per step), and tags for the device, package versions and git commit. Runs are created when a
configuration begins, so a live MLflow UI shows it RUNNING, and terminated with its final status.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from suite.config import RunConfig
from suite.recorders.base import MatrixInfo, Recorder
from suite.results import RunResult

PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
_BATCH_METRICS = 1000  # MLflow's log_batch limits
_BATCH_PARAMS = 100
_BATCH_TAGS = 100


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else an embedded sqlite store ``./mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def _artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """Artifacts of a local sqlite store go beside the database file (``mlartifacts/``), not into the
    current directory; a tracking server decides for itself (``None``)."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    database = Path(tracking_uri[len(prefix):])
    return (database.parent / "mlartifacts" / experiment).resolve().as_uri()


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _flatten(prefix: str, data: dict[str, Any]) -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(_flatten(name, value))
        else:
            flat[name] = str(value)[:5000]  # MLflow's tag value limit is far above anything we record
    return flat


class MlflowRecorder(Recorder):
    def __init__(self, tracking_uri: str | None = None, experiment_name: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri or default_tracking_uri()
        self._experiment_name = experiment_name
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self._common_tags: dict[str, str] = {}
        self._open_runs: dict[str, str] = {}  # config_id -> run id
        self._output_dir: Path | None = None

    def _experiment(self, name: str) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        return self.client.create_experiment(name, artifact_location=_artifact_location(self.tracking_uri, name))

    def open(self, info: MatrixInfo) -> None:
        from mlflow.entities import Param

        self.experiment_id = self._experiment(self._experiment_name or info.workload)
        self._output_dir = info.output_dir
        self._common_tags = dict(info.tags)
        run = self.client.create_run(
            self.experiment_id, run_name=info.name, tags={**self._common_tags, "suite.role": "matrix",
                                                           "suite.command": " ".join(info.command)[:5000]}
        )
        self.parent_run_id = run.info.run_id
        params = [Param(k, v) for k, v in info.params.items()]
        for chunk in _chunks(params, _BATCH_PARAMS):
            self.client.log_batch(self.parent_run_id, params=list(chunk))

    def begin(self, config: RunConfig) -> None:
        from mlflow.entities import Param

        tags = {**self._common_tags, "suite.role": "configuration", "suite.config_id": config.config_id,
                "suite.device": config.device}
        if self.parent_run_id:
            tags[PARENT_TAG] = self.parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=config.config_id, tags=tags)
        self._open_runs[config.config_id] = run.info.run_id
        params = [Param(k, v) for k, v in config.as_params().items()]
        for chunk in _chunks(params, _BATCH_PARAMS):
            self.client.log_batch(run.info.run_id, params=list(chunk))

    def end(self, result: RunResult) -> None:
        from mlflow.entities import Metric, RunTag

        config = RunConfig.from_dict(result.config)
        run_id = self._open_runs.pop(config.config_id, None)
        if run_id is None:
            self.begin(config)
            run_id = self._open_runs.pop(config.config_id)
        result.mlflow_run_id = run_id
        now_ms = int((result.ended_at or time.time()) * 1000)
        metrics = [Metric(k, float(v), now_ms, 0) for k, v in result.metrics.items()]
        start_ms = int((result.started_at or time.time()) * 1000)
        metrics += [Metric("loss", float(v), start_ms, step) for step, v in enumerate(result.losses)]
        tags = _flatten("facts", result.facts)
        device_name = result.facts.get("device", {}).get("device_name")
        if device_name:
            tags["device_name"] = str(device_name)
        tags["suite.status"] = result.status
        tags["suite.repeat"] = str(result.repeat)
        tags["loss_digest"] = result.loss_digest
        if result.reason:
            tags["failure_reason"] = result.reason[:5000]
        tag_entities = [RunTag(k, v) for k, v in tags.items()]
        for chunk in _chunks(metrics, _BATCH_METRICS):
            self.client.log_batch(run_id, metrics=list(chunk))
        for chunk in _chunks(tag_entities, _BATCH_TAGS):
            self.client.log_batch(run_id, tags=list(chunk))
        run_dir = result.facts.get("run_dir")
        if run_dir and Path(run_dir).is_dir():  # config.json, result.json, run.log of this configuration
            self.client.log_artifacts(run_id, run_dir)
        self.client.set_terminated(run_id, status=result.status, end_time=now_ms)

    def close(self, status: str) -> None:
        for run_id in self._open_runs.values():  # configurations that never ended: interrupted
            self.client.set_terminated(run_id, status="KILLED")
        self._open_runs.clear()
        if self.parent_run_id:
            results = self._output_dir / "results.json" if self._output_dir else None
            if results is not None and results.is_file():
                self.client.log_artifact(self.parent_run_id, str(results))
            self.client.set_terminated(self.parent_run_id, status=status)

    def describe(self) -> dict[str, Any]:
        return {"tracking_uri": self.tracking_uri, "experiment_id": self.experiment_id,
                "parent_run_id": self.parent_run_id}
