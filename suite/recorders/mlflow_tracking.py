"""MLflow recording: an experiment per workload, a parent run per matrix, a child run per configuration.

Each child run carries every config field as a param, the metrics under their public names (``loss``
once per step), and tags for the device, package versions and git commit. Runs are created when a
configuration begins, so a live MLflow UI shows it RUNNING, and terminated with its final status.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Sequence

from suite.config import RunConfig
from suite.recorders.base import MatrixInfo, Recorder
from suite.results import RunResult
from suite.scoring import ConfigScore

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
    """Matrix -> configuration runs; with ``repeats > 1``, matrix -> configuration (the score) -> repeats.

    With ``resume=True`` (``suite upload``), runs already recorded are found by their uid tags and left
    alone; runs that were started but never completed are completed; the rest are created.
    """

    essential = False

    def __init__(self, tracking_uri: str | None = None, experiment_name: str | None = None,
                 resume: bool = False, system_metrics_interval_s: float | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri or default_tracking_uri()
        self._experiment_name = experiment_name
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self._common_tags: dict[str, str] = {}
        self._repeats = 1
        self._open_runs: dict[tuple[str, int], str] = {}  # (config_id, repeat) -> run id
        self._score_runs: dict[str, str] = {}  # config_id -> run holding the score (repeats > 1)
        self._output_dir: Path | None = None
        self._resume = resume
        self.skipped: list[str] = []  # run uids already complete (resume mode)
        self._system_metrics_interval_s = system_metrics_interval_s
        self._monitors: dict[tuple[str, int], Any] = {}  # system metrics of the running configuration

    def _find(self, **tags: str) -> Any:
        """The one run of this experiment with all these tags, or None (resume mode)."""
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        found = self.client.search_runs([self.experiment_id], filter_string=query, max_results=2)
        return found[0] if found else None

    def _experiment(self, name: str) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        return self.client.create_experiment(name, artifact_location=_artifact_location(self.tracking_uri, name))

    def _log(self, run_id: str, metrics: Sequence[Any] = (), params: Sequence[Any] = (),
             tags: Sequence[Any] = ()) -> None:
        for chunk in _chunks(list(params), _BATCH_PARAMS):
            self.client.log_batch(run_id, params=list(chunk))
        for chunk in _chunks(list(metrics), _BATCH_METRICS):
            self.client.log_batch(run_id, metrics=list(chunk))
        for chunk in _chunks(list(tags), _BATCH_TAGS):
            self.client.log_batch(run_id, tags=list(chunk))

    def _create_run(self, name: str, parent: str | None, tags: dict[str, str], params: dict[str, str]) -> str:
        from mlflow.entities import Param

        all_tags = {**self._common_tags, **tags}
        if parent:
            all_tags[PARENT_TAG] = parent
        run_id = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags).info.run_id
        self._log(run_id, params=[Param(k, v) for k, v in params.items()])
        return run_id

    def open(self, info: MatrixInfo) -> None:
        self.experiment_id = self._experiment(self._experiment_name or info.experiment or info.workload)
        self._output_dir = info.output_dir
        self._repeats = info.repeats
        self._common_tags = {**info.tags, "suite.matrix_uid": info.uid}
        existing = self._find(**{"suite.matrix_uid": info.uid, "suite.role": "matrix"}) if self._resume else None
        if existing is not None:
            self.parent_run_id = existing.info.run_id
            return
        self.parent_run_id = self._create_run(
            info.name, None, {"suite.role": "matrix", "suite.command": " ".join(info.command)[:5000]},
            {**info.params, "repeats": str(info.repeats)},
        )

    def begin(self, config: RunConfig, repeat: int, run_uid: str) -> None:
        tags = {"suite.config_id": config.config_id, "suite.device": config.device, "suite.repeat": str(repeat)}
        if self._repeats == 1:
            parent, name, role = self.parent_run_id, config.config_id, "configuration"
        else:
            if config.config_id not in self._score_runs:
                existing = self._find(**{"suite.matrix_uid": self._common_tags["suite.matrix_uid"],
                                         "suite.config_id": config.config_id,
                                         "suite.role": "configuration"}) if self._resume else None
                self._score_runs[config.config_id] = existing.info.run_id if existing else self._create_run(
                    config.config_id, self.parent_run_id, {**tags, "suite.role": "configuration"},
                    config.as_params())
            parent, name, role = self._score_runs[config.config_id], f"{config.config_id}-r{repeat}", "repeat"
        run_id = self._create_run(name, parent, {**tags, "suite.role": role, "suite.run_uid": run_uid},
                                  config.as_params())
        self._open_runs[(config.config_id, repeat)] = run_id
        if self._system_metrics_interval_s:
            from suite.recorders.system_metrics import start_system_metrics

            self._monitors[(config.config_id, repeat)] = start_system_metrics(
                run_id, self.tracking_uri, self._system_metrics_interval_s)

    def end(self, result: RunResult) -> None:
        from mlflow.entities import Metric, Param, RunTag

        config = RunConfig.from_dict(result.config)
        key = (config.config_id, result.repeat)
        existing = self._find(**{"suite.run_uid": result.run_uid}) if self._resume and result.run_uid else None
        if existing is not None and "suite.status" in existing.data.tags:  # recorded completely already
            result.mlflow_run_id = existing.info.run_id
            self.skipped.append(result.run_uid)
            return
        if existing is not None:  # started, never completed: complete it
            self._open_runs[key] = existing.info.run_id
        if key not in self._open_runs:
            self.begin(config, result.repeat, result.run_uid or uuid.uuid4().hex)
        run_id = self._open_runs.pop(key)
        self._stop_monitor(key)
        now_ms = int((result.ended_at or time.time()) * 1000)
        metrics = [Metric(k, float(v), now_ms, 0) for k, v in result.metrics.items()]
        start_ms = int((result.started_at or time.time()) * 1000)
        metrics += [Metric("loss", float(v), start_ms, step) for step, v in enumerate(result.losses)]
        tags = _flatten("facts", result.facts)
        device_name = result.facts.get("device", {}).get("device_name")
        if device_name:
            tags["device_name"] = str(device_name)
        tags["suite.status"] = result.status
        tags["loss_digest"] = result.loss_digest
        if result.reason:
            tags["failure_reason"] = result.reason[:5000]
        run_params = [Param(f"run.{k}", str(v)[:6000]) for k, v in (result.facts.get("run_params") or {}).items()]
        self._log(run_id, metrics=metrics, params=run_params, tags=[RunTag(k, v) for k, v in tags.items()])
        run_dir = result.facts.get("run_dir")
        if run_dir and Path(run_dir).is_dir():  # config, result, manifest, logs of this run
            self.client.log_artifacts(run_id, run_dir)
        self.client.set_terminated(run_id, status=result.status, end_time=now_ms)
        result.mlflow_run_id = run_id  # only once the run is complete in MLflow

    def score(self, score: ConfigScore) -> None:
        from mlflow.entities import Metric, RunTag

        run_id = self._score_runs.pop(score.config_id, None)
        if run_id is None:  # a single repeat: its run is the configuration's run
            return
        if self._resume and "suite.status" in self.client.get_run(run_id).data.tags:
            return
        now_ms = int(time.time() * 1000)
        metrics = [Metric("repeats", float(score.repeats), now_ms, 0)]
        if score.throughput_score is not None:
            metrics.append(Metric("throughput_samples_per_s", score.throughput_score, now_ms, 0))
        if score.throughput_cv is not None:
            metrics.append(Metric("throughput_cv", score.throughput_cv, now_ms, 0))
        metrics += [Metric("throughput_repeat", v, now_ms, i) for i, v in enumerate(score.throughput_values)]
        tags = {"suite.scoring": score.method, "suite.dropped_repeats": ",".join(map(str, score.dropped_repeats)),
                "loss_digests_identical": str(score.loss_digests_identical), "suite.status": score.status}
        if score.reason:
            tags["failure_reason"] = score.reason[:5000]
        self._log(run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()])
        self.client.set_terminated(run_id, status=score.status, end_time=now_ms)

    def _stop_monitor(self, key: tuple[str, int]) -> None:
        monitor = self._monitors.pop(key, None)
        if monitor is not None:
            monitor.finish()
            for extra in monitor.monitors:
                if hasattr(extra, "shutdown"):
                    extra.shutdown()

    def close(self, status: str) -> None:
        for key in list(self._monitors):
            self._stop_monitor(key)
        # runs that never ended were interrupted
        for run_id in [*self._open_runs.values(), *self._score_runs.values()]:
            self.client.set_terminated(run_id, status="KILLED")
        self._open_runs.clear()
        self._score_runs.clear()
        if self.parent_run_id:
            for name in ("results.json", "scores.json"):
                path = self._output_dir / name if self._output_dir else None
                if path is not None and path.is_file():
                    self.client.log_artifact(self.parent_run_id, str(path))
            self.client.set_terminated(self.parent_run_id, status=status)

    def describe(self) -> dict[str, Any]:
        return {"tracking_uri": self.tracking_uri, "experiment_id": self.experiment_id,
                "parent_run_id": self.parent_run_id}
