"""The MLflow gateway: every MLflow read and write of the suite goes through this module. MLflow itself is imported
only when the gateway connects (:func:`mlflow_missing` says whether it can).

* One client per tracking URI, made here. A fresh sqlite store is initialised under a file lock beside the
  database (two processes creating it at once both succeed) and switched to write-ahead logging, so
  concurrent writers wait for each other instead of failing.
* HTTP requests retry a bounded number of times (:data:`BOUNDED_RETRIES`, MLflow's own environment settings;
  a value the user set wins), so a dead tracking server costs seconds, not MLflow's default minutes.
* Every call has a deadline (:class:`Deadlined`): a store that stops answering in the middle of a call (a stopped
  PostgreSQL server: its client library has no read timeout, the call waited for ever) costs at most
  :data:`CALL_DEADLINE_S`; the store is then given up for the rest of the process (every later call fails at
  once, saying why) and the results folder keeps everything for ``suite upload``.
* Searches are paged: every matching run is returned, however many there are.
* Tag names are MLflow's own constants (``mlflow.utils.mlflow_tags``) and the suite's, defined here once.
* Values are written as :func:`suite.config.param_text` spells them.

Read failures raise :class:`~suite.errors.SuiteError` with MLflow's first line; write failures propagate
as MLflow raised them (the recorder that called is then switched off, see :mod:`suite.run.matrix`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence, overload

from suite.config import param_text
from suite.errors import SuiteError
from suite.redact import redact_uri
from suite.tracking.deadlines import Deadlined
from suite.tracking.stores import (
    artifact_location,
    default_tracking_uri,
    first_error_line,
    initialise_sqlite,
    refuse_links,
    sqlite_path,
)

# --- MLflow's tag names (mlflow.utils.mlflow_tags; tests/test_records.py holds them to MLflow's own), written
# here so that this module imports MLflow only when it connects: a run records to its results folder without it ---
PARENT_RUN_ID = "mlflow.parentRunId"
RUN_NOTE = "mlflow.note.content"  # a run's or experiment's description

# --- the suite's own tag names ----------------------------------------------------------------------------
ROLE = "suite.role"  # matrix, configuration, repeat, audit
KIND = "suite.kind"  # matrix, tune, audit
MATRIX_UID = "suite.matrix_uid"  # one invocation of suite run (one results folder)
MATRIX_ID = "suite.matrix_id"  # the matrix its shards share (suite run --shard I/N --matrix-id ID)
SHARD = "suite.shard"
RUN_UID = "suite.run_uid"
CONFIG_ID = "suite.config_id"
STATUS = "suite.status"  # set once a configuration run is recorded completely
REPEAT = "suite.repeat"
COMMAND = "suite.command"
DEVICE_MEMORY = "suite.device_memory"  # "host" where the device has no memory of its own

#: MLflow's HTTP retry settings while the suite talks to a tracking server (at most ~30 s per outage).
BOUNDED_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                   "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}

_BATCH_METRICS = 1000  # MLflow's log_batch limits
_BATCH_PARAMS = 100
_BATCH_TAGS = 100
_PAGE = 1000


def mlflow_missing() -> str | None:
    """Why MLflow cannot be imported here (``None`` when it can): a box with torch and no MLflow records to its results
    folder and is uploaded later (``suite upload``) from any machine that has it."""
    try:
        import mlflow  # noqa: F401
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class MlflowGateway:
    """Everything the suite asks of one MLflow tracking store."""

    def __init__(self, tracking_uri: str | None = None) -> None:
        #: the URI as given, credentials included: used to connect, never shown or recorded
        self._uri = tracking_uri or default_tracking_uri()
        #: the URI as it may be shown and recorded (:func:`suite.redact.redact_uri`)
        self.tracking_uri = redact_uri(self._uri)
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            from mlflow.environment_variables import MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT
            from mlflow.tracking import MlflowClient

            if self._uri.startswith(("http://", "https://")):
                for name, value in BOUNDED_RETRIES.items():
                    os.environ.setdefault(name, value)
                if self.tracking_uri != self._uri:  # MLflow prints "View run ... at: URI" with the password in it
                    os.environ[MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.name] = "true"
            database = sqlite_path(self._uri)
            if database is not None:
                initialise_sqlite(self._uri, database)
            self._client = Deadlined(MlflowClient(tracking_uri=self._uri), self.tracking_uri)
        return self._client

    # --- experiments -----------------------------------------------------------------------------------
    @overload
    def experiment_id(self, name: str, create: Literal[True] = True, description: str | None = None) -> str: ...

    @overload
    def experiment_id(self, name: str, create: bool, description: str | None = None) -> str | None: ...

    def experiment_id(self, name: str, create: bool = True, description: str | None = None) -> str | None:
        """The experiment's id; created (artifacts beside a sqlite store) when absent and ``create``."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        if not create:
            return None
        tags = {RUN_NOTE: description} if description else None
        try:
            return self.client.create_experiment(name, artifact_location=artifact_location(self._uri, name),
                                                 tags=tags)
        except Exception:  # another process created it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def all_experiment_ids(self) -> list[str]:
        return [e.experiment_id for e in self.client.search_experiments()]

    # --- writing -------------------------------------------------------------------------------------
    def create_run(self, experiment_id: str, name: str, tags: Mapping[str, str], params: Mapping[str, Any],
                   parent_run_id: str | None = None, start_time_s: float | None = None) -> str:
        """A run (under ``parent_run_id``), started at ``start_time_s`` (default: now); returns its id."""
        all_tags = {k: param_text(v) for k, v in tags.items()}
        if parent_run_id:
            all_tags[PARENT_RUN_ID] = parent_run_id
        start_ms = int(start_time_s * 1000) if start_time_s is not None else None
        run_id = self.client.create_run(experiment_id, start_time=start_ms, run_name=name, tags=all_tags).info.run_id
        self.log(run_id, params=params)
        return run_id

    def log(self, run_id: str, metrics: Iterable[tuple[str, float, int, int]] = (),
            params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None) -> None:
        """Metrics as ``(key, value, timestamp_ms, step)``; params and tags as values (written as
        :func:`param_text` spells them), in MLflow's batch sizes."""
        from mlflow.entities import Metric, Param, RunTag

        param_list = [Param(k, param_text(v)[:6000]) for k, v in (params or {}).items()]
        metric_list = [Metric(k, float(v), int(t), int(s)) for k, v, t, s in metrics]
        tag_list = [RunTag(k, param_text(v)[:5000]) for k, v in (tags or {}).items()]
        for items, size, key in ((param_list, _BATCH_PARAMS, "params"), (metric_list, _BATCH_METRICS, "metrics"),
                                 (tag_list, _BATCH_TAGS, "tags")):
            for start in range(0, len(items), size):
                self.client.log_batch(run_id, **{key: items[start:start + size]})

    def log_artifacts(self, run_id: str, folder: Path, artifact_path: str | None = None) -> None:
        """Every file of ``folder`` as artifacts; only regular files inside it: a symbolic link anywhere in it is
        refused, naming it (MLflow would copy the file it points to, any file of this machine, into a store others
        read)."""
        refuse_links(Path(folder))
        self.client.log_artifacts(run_id, str(folder), artifact_path=artifact_path)

    def log_json(self, run_id: str, data: Any, artifact_file: str) -> None:
        """``data`` as one JSON artifact of the run (MLflow's ``log_dict``)."""
        self.client.log_dict(run_id, data, artifact_file)

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        """One regular file as an artifact; a symbolic link is refused (see :meth:`log_artifacts`)."""
        if Path(path).is_symlink():
            raise SuiteError(f"{path} is a symbolic link (to {os.readlink(path)}): not uploaded; only regular files "
                             "are recorded")
        self.client.log_artifact(run_id, str(path), artifact_path=artifact_path)

    def terminate(self, run_id: str, status: str, end_time_s: float | None = None) -> None:
        end_ms = int((end_time_s if end_time_s is not None else time.time()) * 1000)
        self.client.set_terminated(run_id, status=status, end_time=end_ms)

    # --- reading -------------------------------------------------------------------------------------
    def get_run(self, run_id: str) -> Any:
        try:
            return self.client.get_run(run_id)
        except Exception as exc:  # MlflowException, or a store that cannot be reached
            raise SuiteError(f"no MLflow run {run_id!r} at {self.tracking_uri}: {first_error_line(exc)}") from exc

    def search_runs(self, experiment_ids: Sequence[str], filter_string: str = "",
                    order_by: Sequence[str] | None = None) -> list[Any]:
        """Every run matching ``filter_string``, page after page."""
        runs: list[Any] = []
        token = None
        try:
            while True:
                page = self.client.search_runs(list(experiment_ids), filter_string=filter_string,
                                               max_results=_PAGE, order_by=list(order_by or []), page_token=token)
                runs.extend(page)
                token = page.token
                if not token:
                    return runs
        except Exception as exc:
            raise SuiteError(f"MLflow query failed at {self.tracking_uri}: {first_error_line(exc)}") from exc

    def finished_durations(self, config_ids: Sequence[str]) -> dict[str, list[float]]:
        """Wall seconds (start to end, set-up included) of every FINISHED configuration run of each id, from every
        experiment, without creating or migrating anything: a sqlite store that does not exist yet has no
        history (for ``suite run --dry-run``)."""
        from mlflow.tracking import MlflowClient

        database = sqlite_path(self._uri)
        if database is not None and not database.is_file():
            return {}
        durations: dict[str, list[float]] = {}
        try:
            client = self._client or Deadlined(MlflowClient(tracking_uri=self._uri), self.tracking_uri)  # no init
            experiments = [e.experiment_id for e in client.search_experiments()]
            for config_id in config_ids:
                runs = client.search_runs(experiments, f"tags.`{CONFIG_ID}` = '{config_id}' and "
                                                       "attributes.status = 'FINISHED'", max_results=_PAGE)
                durations[config_id] = [(r.info.end_time - r.info.start_time) / 1000 for r in runs
                                        if r.info.end_time and r.info.start_time
                                        and RUN_UID in r.data.tags]  # measured runs, not a score of repeats
        except Exception as exc:
            raise SuiteError(f"MLflow query failed at {self.tracking_uri}: {first_error_line(exc)}") from exc
        return durations

    def matrix_overheads(self, limit: int = 10) -> list[float]:
        """For the latest ``limit`` FINISHED matrix runs of the store: the matrix's duration less its configuration
        runs' (starting the runner, opening MLflow, the gaps between configurations); for the dry run's estimate.
        Nothing is created or migrated."""
        from mlflow.tracking import MlflowClient

        database = sqlite_path(self._uri)
        if database is not None and not database.is_file():
            return []
        overheads = []
        try:
            client = self._client or Deadlined(MlflowClient(tracking_uri=self._uri), self.tracking_uri)
            experiments = [e.experiment_id for e in client.search_experiments()]
            matrices = client.search_runs(experiments, f"tags.`{ROLE}` = 'matrix' and attributes.status = 'FINISHED'",
                                          max_results=limit, order_by=["attributes.start_time DESC"])
            for matrix in matrices:
                children = client.search_runs(experiments, f"tags.`{PARENT_RUN_ID}` = '{matrix.info.run_id}'",
                                              max_results=_PAGE)
                inside = sum((r.info.end_time - r.info.start_time) / 1000 for r in children
                             if r.info.end_time and r.info.start_time)
                if children and matrix.info.end_time:
                    overheads.append(max(0.0, (matrix.info.end_time - matrix.info.start_time) / 1000 - inside))
        except Exception as exc:
            raise SuiteError(f"MLflow query failed at {self.tracking_uri}: {first_error_line(exc)}") from exc
        return overheads

    def find_run(self, experiment_id: str, **tags: str) -> Any | None:
        """The run of this experiment carrying every one of these tags (the newest if several)."""
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        found = self.search_runs([experiment_id], query, order_by=["attributes.start_time DESC"])
        return found[0] if found else None

    def download_artifact(self, run_id: str, path: str, destination: Path) -> Path | None:
        """One artifact of a run into ``destination``; ``None`` when the run has no such artifact. MLflow's
        "Downloading artifacts" bar is switched off: the suite's own output says what it reads."""
        from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR

        destination.mkdir(parents=True, exist_ok=True)
        os.environ[MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name] = "false"
        try:
            return Path(self.client.download_artifacts(run_id, path, str(destination)))
        except Exception:  # noqa: BLE001 - absent artifact (MlflowException, OSError)
            return None

    def list_artifacts(self, run_id: str, path: str | None = None) -> list[str]:
        return [a.path for a in self.client.list_artifacts(run_id, path)]

    def metric_history(self, run_id: str, key: str) -> list[Any]:
        return list(self.client.get_metric_history(run_id, key))
