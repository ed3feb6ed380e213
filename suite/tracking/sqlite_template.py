"""A fresh sqlite MLflow store from a migrated copy instead of MLflow's migrations.

MLflow creates a new sqlite store by running every alembic migration of its schema (1.2 s on an idle core here, 3-5 s
while the configuration processes started ahead import torch beside it: time before the matrix's first measured
window). The result depends only on the MLflow version, so the first store a version creates is kept, emptied of
its experiments, as a *template* under the suite's cache (``$SUITE_CACHE_DIR/mlflow-sqlite/<version>.db``); a new
store is a copy of it. MLflow then opens it as any existing store: it checks the schema is its own
(``_verify_schema``) and, finding no experiment, creates its default experiment with this store's artifact
location, as it does in a new store. A template that is missing or damaged (not an intact sqlite database with
MLflow's schema version and no experiment) is rebuilt the ordinary way first; where none can be had (no writable
cache), the store is made by MLflow's migrations, so the template only ever saves time.
``tests/test_tracking_stores.py`` compares a store made from the template with one made by MLflow, table by table.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from suite.fileio import cache_root


def template_path() -> Path:
    import mlflow

    return cache_root() / "mlflow-sqlite" / f"mlflow-{mlflow.__version__}.db"


def _open_store(database: Path) -> None:
    """Open ``database`` as MLflow does (creating or migrating its tables where it has none)."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{database}").search_experiments(max_results=1)


def _build_template(template: Path) -> None:
    """A store made by MLflow's own migrations, its experiments removed, put in place atomically."""
    template.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".template-", suffix=".db", dir=template.parent)
    os.close(fd)
    os.unlink(tmp)  # MLflow creates it
    try:
        _open_store(Path(tmp))
        with sqlite3.connect(tmp) as connection:  # rollback journal: the file alone is the database
            connection.execute("DELETE FROM experiment_tags")
            connection.execute("DELETE FROM experiments")
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, template)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _usable(template: Path) -> bool:
    """The template is an intact sqlite database with MLflow's tables, a schema version and no experiment."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{template}?mode=ro", uri=True)) as connection:
            if connection.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                return False
            version = connection.execute("SELECT version_num FROM alembic_version").fetchone()
            experiments = connection.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]
    except sqlite3.Error:
        return False
    return version is not None and experiments == 0


def create_from_template(database: Path) -> bool:
    """Make the new store ``database`` (absent or empty; the caller holds its lock) a copy of the template, the
    template (re)built first where it is missing or damaged. False, with ``database`` left absent for MLflow's own
    creation, where that cannot be done (no writable cache, a full disk); MLflow then opens it as it opens any store
    (and refuses it, with its own error, if its schema were not MLflow's)."""
    template = template_path()
    tmp = database.with_name(f".{database.name}.from-template")
    try:
        if not _usable(template):
            _build_template(template)
        shutil.copyfile(template, tmp)
        os.replace(tmp, database)
    except (OSError, sqlite3.Error):
        tmp.unlink(missing_ok=True)
        database.unlink(missing_ok=True)
        return False
    return True
