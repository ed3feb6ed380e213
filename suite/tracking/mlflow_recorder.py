"""MLflow recording: an experiment per workload, a parent run per matrix, a child run per configuration.

Each child run carries every config field as a param, the metrics under their public names (``loss`` once
per step), and tags for the device, package versions and git commit. Runs are created when a configuration
begins, so a live MLflow UI shows it RUNNING, and terminated with its final status. Every call goes through
:class:`~suite.tracking.mlflow_gateway.MlflowGateway`.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from suite.analysis.scoring import ConfigScore
from suite.analysis.summary import summary_line
from suite.config import RunConfig
from suite.config.labels import short_labels
from suite.figures import (
    EVAL_TIME_S,
    LOSS,
    MATRIX_WALL_S,
    STEP_TIME_S,
    THROUGHPUT_CV,
    THROUGHPUT_SAMPLES_PER_S,
    device_memory_is_host,
)
from suite.redact import redact_argv
from suite.results.files import MatrixInfo, RunFiles
from suite.results.record import RUNNING, RunResult
from suite.text import markdown_literal
from suite.tracking import mlflow_gateway as tags_
from suite.tracking.base import Recorder
from suite.tracking.metric_names import mlflow_metrics
from suite.tracking.mlflow_gateway import MlflowGateway
from suite.workload import catalogue_of

#: The experiment's description (MLflow shows it above the runs table).
EXPERIMENT_NOTE = (
    "{workload} benchmark matrices recorded by `suite`. Each `suite run` is a parent run (its description holds the "
    "results table; summary metrics: summary/best_throughput_samples_per_s, summary/speedup_best_over_baseline; the "
    "full report is its artifact report/report.html). Expand it for one child run per configuration, named by the "
    "axes that vary in that matrix (the full configuration id is the tag suite.config_id). Per configuration: "
    "throughput/throughput_samples_per_s, step_time/step_time_p50_s / p99, input/data_wait_fraction, "
    "memory/host_ram_peak_pss_mib / rss (also in bytes), memory/device_peak_memory_mib (on a CPU: the training "
    "process's RSS high-water mark), quality/eval_accuracy. Every metric's unit and meaning: the matrix run's artifact "
    "figures.json (`suite metrics`).")
#: The catalogue of figures the matrix's runs record (unit, meaning, MLflow section, bounds), on its matrix run.
FIGURES_ARTIFACT = "figures.json"

#: Facts logged as metric histories (per step), not as tags.
HISTORIES = ("step_times_s", "data_wait_s", "evaluations")
#: Every fact of a configuration run (but its histories and the JSON artifacts below), as one artifact: a run's page
#: shows its description and a few tags first, not a hundred.
FACTS_ARTIFACT = "facts.json"
#: Facts logged as one JSON artifact each (``<name>.json``).
JSON_ARTIFACTS = ("accelerator_environment",)


def _run_note(config: RunConfig, result: RunResult) -> str:
    """A configuration run's description: its axes, its headline figures or why it did not finish, its id."""
    return f"{markdown_literal(summary_line(result).strip())}\n\nconfiguration id: `{config.config_id}`"


class MlflowRecorder(Recorder):
    """Matrix -> configuration runs; with ``repeats > 1``, matrix -> configuration (the score) -> repeats.

    With ``resume=True`` (``suite upload`` / ``suite recover``), runs already recorded are found by their uid
    tags and left alone, runs started but never completed are completed, the rest are created.
    """

    def __init__(self, gateway: MlflowGateway, experiment_name: str | None = None, resume: bool = False,
                 system_metrics_interval_s: float | None = None) -> None:
        self.gateway = gateway
        self._experiment_name = experiment_name
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self._matrix_uid = ""
        self._matrix_ended_at: float | None = None
        self._matrix_started_at = time.time()
        self._common_tags: dict[str, str] = {}
        self._repeats = 1
        self._results_root: Path | None = None
        self._open_runs: dict[tuple[str, int], str] = {}  # (config_id, repeat) -> run id
        self._score_runs: dict[str, str] = {}  # config_id -> run holding the score (repeats > 1)
        self._resume = resume
        self.skipped: list[str] = []  # run uids already complete (resume mode)
        self._system_metrics_interval_s = system_metrics_interval_s
        self._monitors: dict[tuple[str, int], Any] = {}  # system metrics of the running configuration
        self._labels: dict[str, str] = {}  # config_id -> run name: the axes that vary in this matrix

    @property
    def tracking_uri(self) -> str:
        return self.gateway.tracking_uri

    def open(self, info: MatrixInfo, results_root: Path) -> None:
        experiment_id = self.gateway.experiment_id(self._experiment_name or info.experiment or info.workload,
                                                   description=EXPERIMENT_NOTE.format(workload=info.workload))
        self.experiment_id = experiment_id
        self._results_root = results_root
        self._repeats = info.repeats
        self._matrix_uid = info.uid
        self._matrix_ended_at = info.ended_at
        self._matrix_started_at = info.started_at
        self._common_tags = {**info.tags, tags_.MATRIX_UID: info.uid, tags_.KIND: info.kind}
        if info.matrix_id:
            self._common_tags[tags_.MATRIX_ID] = info.matrix_id
        if info.shard:
            self._common_tags[tags_.SHARD] = info.shard
        if self._resume:
            existing = self.gateway.find_run(experiment_id, **{tags_.MATRIX_UID: info.uid,
                                                                    tags_.ROLE: "matrix"})
            if existing is not None:
                self.parent_run_id = existing.info.run_id
                return
        self.parent_run_id = self.gateway.create_run(
            experiment_id, info.name + (f" shard {info.shard}" if info.shard else ""),
            {**self._common_tags, tags_.ROLE: "matrix", tags_.COMMAND: " ".join(redact_argv(info.command))[:5000]},
            {**info.params, "repeats": info.repeats}, start_time_s=info.started_at)
        self.gateway.log_json(self.parent_run_id, {"workload": info.workload,
                                                   "figures": catalogue_of(info.workload).listing()},
                              FIGURES_ARTIFACT)

    def _child(self, name: str, parent: str | None, tags: dict[str, str], config: RunConfig) -> str:
        """A configuration or repeat run: the matrix's identity tags (host, versions and commit are on the matrix
        run), its own, and the configuration as params."""
        assert self.experiment_id is not None
        identity = {k: v for k, v in self._common_tags.items() if k.startswith("suite.")}
        return self.gateway.create_run(self.experiment_id, name, {**identity, **tags}, config.as_params(),
                                       parent_run_id=parent)

    def plan(self, configs: Sequence[RunConfig]) -> None:
        self._labels = short_labels(configs)

    def begin(self, config: RunConfig, repeat: int, run_uid: str) -> None:
        if config.nnodes > 1:  # created at its end, by the node that held global rank 0 only (see end)
            return
        self._begin(config, repeat, run_uid)

    def _begin(self, config: RunConfig, repeat: int, run_uid: str) -> None:
        config_id = config.config_id
        label = self._labels.get(config_id) or config.describe()
        tags = {tags_.CONFIG_ID: config_id, "suite.device": config.device, tags_.REPEAT: str(repeat),
                tags_.RUN_NOTE: f"{config.describe()} (running)\n\nconfiguration id: `{config_id}`"}
        if self._repeats == 1:
            parent, name, role = self.parent_run_id, label, "configuration"
        else:
            if config_id not in self._score_runs:
                existing = self.gateway.find_run(self.experiment_id or "", **{
                    tags_.MATRIX_UID: self._matrix_uid, tags_.CONFIG_ID: config_id,
                    tags_.ROLE: "configuration"}) if self._resume else None
                self._score_runs[config_id] = existing.info.run_id if existing else self._child(
                    label, self.parent_run_id, {**tags, tags_.ROLE: "configuration"}, config)
            parent, name, role = self._score_runs[config_id], f"{label} repeat={repeat}", "repeat"
        run_id = self._child(name, parent, {**tags, tags_.ROLE: role, tags_.RUN_UID: run_uid}, config)
        self._open_runs[(config_id, repeat)] = run_id
        if self._system_metrics_interval_s:
            from suite.tracking.system_metrics import start_system_metrics

            self._monitors[(config_id, repeat)] = start_system_metrics(
                self.gateway, run_id, self._system_metrics_interval_s)

    def end(self, result: RunResult) -> None:
        if result.recorded_elsewhere:  # this node's share of a multi-node run: global rank 0's node records it
            return
        config = result.config
        key = (config.config_id, result.repeat)
        existing = None
        if self._resume and result.run_uid:
            existing = self.gateway.find_run(self.experiment_id or "", **{tags_.RUN_UID: result.run_uid})
        if existing is not None and tags_.STATUS in existing.data.tags:  # recorded completely already
            result.mlflow_run_id = existing.info.run_id
            self.skipped.append(result.run_uid or "")
            return
        if existing is not None:  # started, never completed: complete it
            self._open_runs[key] = existing.info.run_id
        if key not in self._open_runs:
            self._begin(config, result.repeat, result.run_uid or uuid.uuid4().hex)
        run_id = self._open_runs.pop(key)
        self._stop_monitor(key)
        end_ms = int((result.ended_at or time.time()) * 1000)
        start_ms = int((result.started_at or time.time()) * 1000)
        metrics = [(k, float(v), end_ms, 0) for k, v in result.metrics.items()]
        metrics += [(LOSS, float(v), start_ms, step) for step, v in enumerate(result.losses)]
        warmup = result.config.warmup_steps
        metrics += [(STEP_TIME_S, float(v), start_ms, warmup + i)
                    for i, v in enumerate(result.facts.get("step_times_s") or [])]
        for evaluation in result.facts.get("evaluations") or []:  # quality over the run, at its step
            metrics += [(k, float(v), start_ms, int(evaluation["step"])) for k, v in evaluation.items()
                        if k.startswith("eval_") and k != EVAL_TIME_S]
        tags: dict[str, Any] = {}  # a few to filter by; every fact is in facts.json
        device_name = (result.facts.get("device") or {}).get("device_name")
        if device_name:
            tags["device_name"] = device_name
        tags[tags_.STATUS] = result.status
        if device_memory_is_host(result.facts):  # the readers' caption of its device memory column
            tags[tags_.DEVICE_MEMORY] = "host"
        tags["loss_digest"] = result.loss_digest
        if result.reason:
            tags["failure_reason"] = result.reason[:5000]
        run_params = {f"run.{k}": v for k, v in (result.facts.get("run_params") or {}).items()}
        tags[tags_.RUN_NOTE] = _run_note(config, result)
        self.gateway.log(run_id, metrics=mlflow_metrics(metrics), params=run_params, tags=tags)
        self.gateway.log_json(run_id, {k: v for k, v in result.facts.items() if k not in HISTORIES + JSON_ARTIFACTS},
                              FACTS_ARTIFACT)
        for name in JSON_ARTIFACTS:
            if name in result.facts:
                self.gateway.log_json(run_id, result.facts[name], f"{name}.json")
        folder = self._run_folder(result)
        if folder is not None and folder.is_dir():  # config, result, manifest, logs of this run
            self.gateway.log_artifacts(run_id, folder)
        self.gateway.terminate(run_id, result.status, result.ended_at)
        result.mlflow_run_id = run_id  # only once the run is complete in MLflow

    def _run_folder(self, result: RunResult) -> Path | None:
        run_dir = result.facts.get("run_dir")
        if self._results_root is None or not isinstance(run_dir, str):
            return None
        return RunFiles(self._results_root, Path(run_dir).name).folder

    def score(self, score: ConfigScore) -> None:
        run_id = self._score_runs.pop(score.config_id, None)
        if run_id is None:  # a single repeat: its run is the configuration's run
            return
        if self._resume and tags_.STATUS in self.gateway.get_run(run_id).data.tags:
            return
        now_ms = int(time.time() * 1000)
        metrics = [("repeats", float(score.repeats), now_ms, 0)]
        if score.throughput_score is not None:
            metrics.append((THROUGHPUT_SAMPLES_PER_S, score.throughput_score, now_ms, 0))
        if score.throughput_cv is not None:
            metrics.append((THROUGHPUT_CV, score.throughput_cv, now_ms, 0))
        metrics += [("throughput_repeat", v, now_ms, i) for i, v in enumerate(score.throughput_values)]
        tags = {"suite.scoring": score.method, "suite.dropped_repeats": ",".join(map(str, score.dropped_repeats)),
                "loss_digests_identical": score.loss_digests_identical, tags_.STATUS: score.status}
        if score.reason:
            tags["failure_reason"] = score.reason[:5000]
        self.gateway.log(run_id, metrics=mlflow_metrics(metrics), tags=tags)
        self.gateway.terminate(run_id, score.status)

    def kill_leftovers(self) -> int:
        """Runs of this matrix still RUNNING (their runner died) become KILLED with an end time; the count."""
        assert self.experiment_id is not None
        left = self.gateway.search_runs([self.experiment_id], f"tags.`{tags_.MATRIX_UID}` = '{self._matrix_uid}' "
                                                              f"and attributes.status = '{RUNNING}'")
        left = [run for run in left if run.info.run_id != self.parent_run_id]
        for run in left:
            self.gateway.log(run.info.run_id, tags={"failure_reason": "its runner stopped before recording an end; "
                                                                      "marked by suite recover"})
            self.gateway.terminate(run.info.run_id, "KILLED")
        return len(left)

    def _stop_monitor(self, key: tuple[str, int], wait: bool = True) -> None:
        monitor = self._monitors.pop(key, None)
        if monitor is None:
            return

        def stop() -> None:
            monitor.finish()
            for extra in monitor.monitors:
                if hasattr(extra, "shutdown"):
                    extra.shutdown()

        if wait:
            stop()
        else:  # a dead server would hold the final flush for as long as MLflow retries
            threading.Thread(target=stop, name="system-metrics-stop", daemon=True).start()

    def abandon(self) -> None:
        for key in list(self._monitors):
            self._stop_monitor(key, wait=False)

    def close(self, status: str, reason: str | None = None) -> None:
        for key in list(self._monitors):
            self._stop_monitor(key)
        for run_id in [*self._open_runs.values(), *self._score_runs.values()]:  # never ended: interrupted
            self.gateway.terminate(run_id, "KILLED")
        self._open_runs.clear()
        self._score_runs.clear()
        if not self.parent_run_id:
            return
        if reason:
            self.gateway.log(self.parent_run_id, tags={"failure_reason": reason})
        if self._results_root is not None:
            for name in ("results.json", "scores.json", "matrix.json"):
                path = self._results_root / name
                if path.is_file():
                    self.gateway.log_artifact(self.parent_run_id, path)
        if self._resume:
            run = self.gateway.get_run(self.parent_run_id)
            if run.info.status == status and run.info.end_time:
                return  # already closed as it ended: nothing to change
        self.gateway.terminate(self.parent_run_id, status, self._matrix_ended_at)

    def matrix_metrics(self, metrics: dict[str, float]) -> None:
        if MATRIX_WALL_S in metrics and not self._resume:  # the matrix run lasts as long as the matrix
            self._matrix_ended_at = self._matrix_started_at + metrics[MATRIX_WALL_S]
        if self.parent_run_id:
            now_ms = int(time.time() * 1000)
            headline = mlflow_metrics([(k, v, now_ms, 0) for k, v in metrics.items()])
            self.gateway.log(self.parent_run_id, metrics=headline)

    def attach_report(self, metrics: dict[str, float], note: str, tags: dict[str, str], files: Sequence[Path]) -> None:
        """Give the matrix run what a reader scans for (:func:`suite.report.mlflow_summary` makes it): summary
        metrics, a description (Markdown), tags, and the report's files as artifacts under ``report/``."""
        if not self.parent_run_id:
            return
        now_ms = int(time.time() * 1000)
        self.gateway.log(self.parent_run_id, metrics=[(k, v, now_ms, 0) for k, v in metrics.items()],
                         tags={tags_.RUN_NOTE: note, **tags})
        for path in files:
            self.gateway.log_artifact(self.parent_run_id, path, artifact_path="report")

    def describe(self) -> dict[str, Any]:
        return {"tracking_uri": self.tracking_uri, "experiment_id": self.experiment_id,
                "parent_run_id": self.parent_run_id}
