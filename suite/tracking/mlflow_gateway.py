"""The MLflow gateway: every MLflow read and write of the suite goes through this module.

* One client per tracking URI, made here. A fresh sqlite store is initialised under a file lock beside the
  database (two processes creating it at once both succeed) and switched to write-ahead logging, so
  concurrent writers wait for each other instead of failing.
* HTTP requests retry a bounded number of times (:data:`BOUNDED_RETRIES`, MLflow's own environment settings;
  a value the user set wins), so a dead tracking server costs seconds, not MLflow's default minutes.
* Every call has a deadline (:class:`_Deadlined`): a store that stops answering in the middle of a call (a stopped
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
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID as PARENT_RUN_ID
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE as RUN_NOTE  # a run's or experiment's description

from suite.config import param_text
from suite.errors import RecordingError, SuiteError

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

#: MLflow's HTTP retry settings while the suite talks to a tracking server (at most ~30 s per outage).
BOUNDED_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                   "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}

#: The longest one MLflow call may take (seconds) before the store is given up: longer than MLflow's own bounded
#: HTTP retries (~35 s), so those answer first with their reason. SUITE_TRACKING_DEADLINE_S overrides it.
CALL_DEADLINE_S = 60.0
#: The same for calls that move artifact files (a run folder, a report), which may be slow on a slow network.
ARTIFACT_DEADLINE_S = 600.0

_BATCH_METRICS = 1000  # MLflow's log_batch limits
_BATCH_PARAMS = 100
_BATCH_TAGS = 100
_PAGE = 1000
_SQLITE = "sqlite:///"


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else an embedded sqlite store ``./mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"{_SQLITE}{Path.cwd() / 'mlflow.db'}"


def normalize_uri(uri: str) -> str:
    """One spelling per store: a sqlite database by its absolute path, a server without a trailing slash."""
    if uri.startswith(_SQLITE):
        return _SQLITE + str(Path(uri[len(_SQLITE):]).expanduser().resolve())
    return uri.rstrip("/")


def sqlite_path(uri: str) -> Path | None:
    return Path(uri[len(_SQLITE):]) if uri.startswith(_SQLITE) else None


def artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """Artifacts of a local sqlite store go beside the database file (``mlartifacts/``), not into the current
    folder; a tracking server decides for itself (``None``)."""
    database = sqlite_path(tracking_uri)
    if database is None:
        return None
    return (database.parent / "mlartifacts" / experiment).resolve().as_uri()


#: Tracking URI schemes the suite records into: an sqlite file, a tracking server, a database server.
STORE_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql")


def check_tracking_uri(uri: str) -> None:
    """Refuse, in one line, a tracking URI that would lose the records or that MLflow would answer with a traceback:
    an in-memory sqlite store (gone when the process ends), a scheme the suite does not record into (``file:``,
    ``ftp:``...), a database server whose host does not resolve (a DNS failure is not transient: MLflow would retry
    it for minutes)."""
    import socket
    import urllib.parse

    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
    if scheme not in STORE_SCHEMES:
        raise SuiteError(f"tracking URI {uri!r}: the suite records into sqlite:///PATH, an MLflow server "
                         "(http[s]://HOST:PORT) or a database server (postgresql://, mysql://, mssql://), not "
                         f"{scheme + ':' if scheme else 'a plain path'}" + (" (MLflow's file store: use "
                                                                            "sqlite:///PATH/mlflow.db)"
                                                                            if scheme == "file" else ""))
    if scheme == "sqlite":
        path = uri[len("sqlite:"):].lstrip("/")
        if not path or path == ":memory:" or "mode=memory" in uri:
            raise SuiteError(f"tracking URI {uri!r} is an in-memory database: every record would vanish when the "
                             "run ends; give a file (sqlite:///PATH/mlflow.db)")
        return
    parts = urllib.parse.urlsplit(uri)
    host = parts.hostname
    if host:
        try:
            socket.getaddrinfo(host, None)
        except socket.gaierror as exc:
            raise SuiteError(f"tracking URI {uri!r}: host {host!r} does not resolve ({exc.strerror}); a name that "
                             "does not resolve is not a transient failure: check the host name") from None
    if scheme in DATABASE_PORTS and host:
        _check_database_answers(uri, host, parts.port or DATABASE_PORTS[scheme], scheme)


#: Database servers' default ports, and the bytes a live one answers first.
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306}
#: How long a database server may take to answer its first bytes before the run is refused.
DATABASE_ANSWER_S = 10.0


def _check_database_answers(uri: str, host: str, port: int, scheme: str) -> None:
    """Refuse a database server that does not answer within :data:`DATABASE_ANSWER_S`: a stopped (or hung) server
    still accepts TCP connections (the kernel queues them), and MLflow would wait on it for minutes. PostgreSQL answers
    an SSLRequest with one byte (``S`` or ``N``); MySQL greets every connection first."""
    import socket

    what = f"tracking URI {uri!r}: the {scheme} server at {host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=DATABASE_ANSWER_S) as connection:
            connection.settimeout(DATABASE_ANSWER_S)
            if scheme == "postgresql":
                connection.sendall((8).to_bytes(4, "big") + (80877103).to_bytes(4, "big"))  # SSLRequest
            if not connection.recv(1):
                raise SuiteError(f"{what} closed the connection without answering")
    except socket.timeout:
        raise SuiteError(f"{what} accepts connections but does not answer within {DATABASE_ANSWER_S:g} s (stopped "
                         "or overloaded); nothing was recorded") from None
    except OSError as exc:
        raise SuiteError(f"{what} is unreachable ({exc.strerror or exc}); start it or pass another "
                         "--tracking-uri") from None


def refuse_links(folder: Path) -> None:
    """Raise :class:`SuiteError` naming the first entry of ``folder`` (recursively) that is a symbolic link, or that
    is neither a regular file nor a folder (a FIFO, a socket, a device)."""
    import stat

    for root, folders, files in os.walk(folder, followlinks=False):
        for name in sorted(folders + files):
            path = Path(root) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise SuiteError(f"{path} is a symbolic link (to {os.readlink(path)}): not uploaded; only regular "
                                 "files inside the results folder are recorded")
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise SuiteError(f"{path} is not a regular file: not uploaded")


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail before anything runs when the tracking URI is not one to record into (:func:`check_tracking_uri`) or an
    HTTP tracking server does not answer its health check."""
    check_tracking_uri(uri)
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as response:
            if response.status != 200:
                raise SuiteError(f"MLflow tracking server {uri} answered /health with HTTP {response.status}")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SuiteError(f"MLflow tracking server {uri} is unreachable ({reason}); start it or pass another "
                         "--tracking-uri") from exc


def _first_line(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc)
    return (message.strip().splitlines() or [type(exc).__name__])[0]


def _initialise_sqlite(uri: str, database: Path) -> None:
    """Create the store's tables under a file lock and switch the database to WAL journaling."""
    import sqlite3

    from filelock import FileLock
    from mlflow.tracking import MlflowClient

    database.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(database) + ".lock", timeout=120):
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # creates or migrates the tables
        with sqlite3.connect(database, timeout=60) as connection:
            if connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                connection.execute("PRAGMA journal_mode=WAL")


class TrackingStalled(RecordingError):
    """The tracking store did not answer a call in time (or an earlier one): given up for this process."""


def call_deadline_s() -> float:
    text = os.environ.get("SUITE_TRACKING_DEADLINE_S", "")
    try:
        value = float(text) if text else CALL_DEADLINE_S
    except ValueError:
        raise SuiteError(f"SUITE_TRACKING_DEADLINE_S must be a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise SuiteError(f"SUITE_TRACKING_DEADLINE_S must be a positive number of seconds, got {text!r}")
    return value


class _Deadlined:
    """An ``MlflowClient`` whose every method runs in a daemon thread of its own and is abandoned after its deadline
    (``threading`` rather than a pool: a call that never returns must not hold a pool's worker, nor the interpreter's
    exit). A missed deadline, or MLflow's own HTTP read timeouts, give the store up: every later call raises
    :class:`TrackingStalled` at once with the first reason, instead of waiting again."""

    def __init__(self, client: Any, uri: str) -> None:
        self._client, self._uri = client, uri
        self._deadline_s = call_deadline_s()
        self._given_up: str | None = None

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, method, args, kwargs)

        return call

    def _call(self, name: str, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._given_up is not None:
            raise TrackingStalled(self._given_up)
        outcome: dict[str, Any] = {}
        finished = threading.Event()

        def target() -> None:
            try:
                outcome["value"] = method(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
                outcome["error"] = exc
            finally:
                finished.set()

        threading.Thread(target=target, name=f"mlflow-{name}", daemon=True).start()
        deadline = ARTIFACT_DEADLINE_S if "artifact" in name else self._deadline_s
        if not finished.wait(deadline):
            self._given_up = (f"the MLflow tracking store {self._uri} did not answer {name} within {deadline:g} s "
                              "(stopped, hung or overloaded); nothing more is sent to it from this process")
            raise TrackingStalled(self._given_up)
        error = outcome.get("error")
        if error is None:
            return outcome["value"]
        if "Read timed out" in str(error):  # MLflow's bounded HTTP retries, every one timed out
            timeout = os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
            tries = int(os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")) + 1
            self._given_up = (f"the MLflow tracking server {self._uri} accepted {name} but did not answer within "
                              f"{timeout} s, {tries} times (stopped, hung or overloaded); nothing more is sent to it "
                              "from this process")
            raise TrackingStalled(self._given_up) from None
        raise error


class MlflowGateway:
    """Everything the suite asks of one MLflow tracking store."""

    def __init__(self, tracking_uri: str | None = None) -> None:
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            if self.tracking_uri.startswith(("http://", "https://")):
                for name, value in BOUNDED_RETRIES.items():
                    os.environ.setdefault(name, value)
            database = sqlite_path(self.tracking_uri)
            if database is not None:
                _initialise_sqlite(self.tracking_uri, database)
            self._client = _Deadlined(MlflowClient(tracking_uri=self.tracking_uri), self.tracking_uri)
        return self._client

    # --- experiments -----------------------------------------------------------------------------------
    def experiment_id(self, name: str, create: bool = True, description: str | None = None) -> str | None:
        """The experiment's id; created (artifacts beside a sqlite store) when absent and ``create``."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        if not create:
            return None
        tags = {RUN_NOTE: description} if description else None
        try:
            return self.client.create_experiment(name, artifact_location=artifact_location(self.tracking_uri, name),
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
                   parent_run_id: str | None = None) -> str:
        all_tags = {k: param_text(v) for k, v in tags.items()}
        if parent_run_id:
            all_tags[PARENT_RUN_ID] = parent_run_id
        run_id = self.client.create_run(experiment_id, run_name=name, tags=all_tags).info.run_id
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
            raise SuiteError(f"no MLflow run {run_id!r} at {self.tracking_uri}: {_first_line(exc)}") from exc

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
            raise SuiteError(f"MLflow query failed at {self.tracking_uri}: {_first_line(exc)}") from exc

    def finished_durations(self, config_ids: Sequence[str]) -> dict[str, list[float]]:
        """Wall seconds (start to end, set-up included) of every FINISHED configuration run of each id, from every
        experiment, without creating or migrating anything: a sqlite store that does not exist yet has no
        history (for ``suite run --dry-run``)."""
        from mlflow.tracking import MlflowClient

        database = sqlite_path(self.tracking_uri)
        if database is not None and not database.is_file():
            return {}
        client = self._client or _Deadlined(MlflowClient(tracking_uri=self.tracking_uri), self.tracking_uri)  # no init
        durations: dict[str, list[float]] = {}
        try:
            experiments = [e.experiment_id for e in client.search_experiments()]
            for config_id in config_ids:
                runs = client.search_runs(experiments, f"tags.`{CONFIG_ID}` = '{config_id}' and "
                                                       "attributes.status = 'FINISHED'", max_results=_PAGE)
                durations[config_id] = [(r.info.end_time - r.info.start_time) / 1000 for r in runs
                                        if r.info.end_time and r.info.start_time
                                        and RUN_UID in r.data.tags]  # measured runs, not a score of repeats
        except Exception as exc:
            raise SuiteError(f"MLflow query failed at {self.tracking_uri}: {_first_line(exc)}") from exc
        return durations

    def find_run(self, experiment_id: str, **tags: str) -> Any | None:
        """The run of this experiment carrying every one of these tags (the newest if several)."""
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        found = self.search_runs([experiment_id], query, order_by=["attributes.start_time DESC"])
        return found[0] if found else None

    def download_artifact(self, run_id: str, path: str, destination: Path) -> Path | None:
        """One artifact of a run into ``destination``; ``None`` when the run has no such artifact."""
        destination.mkdir(parents=True, exist_ok=True)
        try:
            return Path(self.client.download_artifacts(run_id, path, str(destination)))
        except Exception:  # noqa: BLE001 - absent artifact (MlflowException, OSError)
            return None

    def list_artifacts(self, run_id: str, path: str | None = None) -> list[str]:
        return [a.path for a in self.client.list_artifacts(run_id, path)]

    def metric_history(self, run_id: str, key: str) -> list[Any]:
        return list(self.client.get_metric_history(run_id, key))
