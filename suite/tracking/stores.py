"""Tracking stores: the default one, URIs checked before anything is recorded (scheme, a database that answers, a
server that is reachable), SQLite stores created, and run folders refused when they hold links."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Iterator

from suite.errors import SuiteError
from suite.redact import redact_text, redact_uri, userinfo_credentials

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

    shown = redact_uri(uri)
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
    if scheme not in STORE_SCHEMES:
        raise SuiteError(f"tracking URI {shown!r}: the suite records into sqlite:///PATH, an MLflow server "
                         "(http[s]://HOST:PORT) or a database server (postgresql://, mysql://, mssql://), not "
                         f"{scheme + ':' if scheme else 'a plain path'}" + (" (MLflow's file store: use "
                                                                            "sqlite:///PATH/mlflow.db)"
                                                                            if scheme == "file" else ""))
    if scheme == "sqlite":
        path = uri[len("sqlite:"):].lstrip("/")
        if not path or path == ":memory:" or "mode=memory" in uri:
            raise SuiteError(f"tracking URI {shown!r} is an in-memory database: every record would vanish when the "
                             "run ends; give a file (sqlite:///PATH/mlflow.db)")
        return
    parts = urllib.parse.urlsplit(uri)
    host = parts.hostname
    if host:
        try:
            socket.getaddrinfo(host, None)
        except socket.gaierror as exc:
            raise SuiteError(f"tracking URI {shown!r}: host {host!r} does not resolve ({exc.strerror}); a name that "
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

    what = f"tracking URI {redact_uri(uri)!r}: the {scheme} server at {host}:{port}"
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

    shown = redact_uri(uri)
    bare, credentials = userinfo_credentials(uri)
    request = urllib.request.Request(bare.rstrip("/") + "/health", headers=_authorization(credentials))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            if response.status != 200:
                raise SuiteError(f"MLflow tracking server {shown} answered /health with HTTP {response.status}")
    except urllib.error.HTTPError as exc:
        raise SuiteError(f"MLflow tracking server {shown} answered /health with HTTP {exc.code} ({exc.reason})"
                         + ("; check the user and password" if exc.code in (401, 403) else "")) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = redact_text(str(getattr(exc, "reason", exc)))
        raise SuiteError(f"MLflow tracking server {shown} is unreachable ({reason}); start it or pass another "
                         "--tracking-uri") from None


def _authorization(credentials: tuple[str, str] | None) -> dict[str, str]:
    """The Authorization header MLflow's own client sends (``mlflow.utils.rest_utils.http_request``): basic
    authentication from the URI's user-info, else from ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``,
    else a bearer ``MLFLOW_TRACKING_TOKEN``; none where none is set."""
    import base64

    user, password = credentials or (os.environ.get("MLFLOW_TRACKING_USERNAME"),
                                     os.environ.get("MLFLOW_TRACKING_PASSWORD"))
    if user and password:
        return {"Authorization": "Basic " + base64.standard_b64encode(f"{user}:{password}".encode()).decode()}
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def first_error_line(exc: BaseException) -> str:
    """The first line of an error from MLflow or a database driver, credentials redacted (a driver may quote its
    connection URL)."""
    message = getattr(exc, "message", None) or str(exc)
    return redact_text((message.strip().splitlines() or [type(exc).__name__])[0])


def initialise_sqlite(uri: str, database: Path) -> None:
    """Create the store's tables under a file lock (a new store: from the migrated template,
    :mod:`suite.tracking.sqlite_template`) and switch the database to WAL journaling."""
    import sqlite3

    from filelock import FileLock
    from mlflow.tracking import MlflowClient

    from suite.tracking.sqlite_template import create_from_template

    database.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(database) + ".lock", timeout=120), _quiet("mlflow.store.db.utils", "alembic"):
        if not database.exists() or database.stat().st_size == 0:
            create_from_template(database)
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # creates or migrates the tables
        with sqlite3.connect(database, timeout=60) as connection:
            if connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                connection.execute("PRAGMA journal_mode=WAL")


@contextlib.contextmanager
def _quiet(*loggers: str) -> Iterator[None]:
    """The INFO lines of these loggers left out meanwhile (a new store's "Creating initial MLflow database tables",
    alembic's migrations: the suite says what it creates); warnings and errors still show."""
    saved = {name: logging.getLogger(name).level for name in loggers}
    for name in loggers:
        logging.getLogger(name).setLevel(max(saved[name], logging.WARNING))
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
