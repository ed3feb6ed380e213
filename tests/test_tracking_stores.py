"""A new sqlite MLflow store from the migrated template: the same store MLflow's own migrations make, a damaged or
hostile template rebuilt, no cache no problem, two processes at once."""

import multiprocessing
import os
import sqlite3
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from suite.tracking import sqlite_template
from suite.tracking.mlflow_gateway import MlflowGateway

pytestmark = pytest.mark.mechanics

#: Columns that hold the moment a row was written
TIMES = ("creation_time", "last_update_time")


def _clauses(sql: str) -> list[str]:
    """A CREATE statement's clauses, sorted: alembic's batch migrations on sqlite rewrite a table with its constraints
    in set order, so two stores made by MLflow itself (in two processes) list them in different orders."""
    return sorted(line.strip().rstrip(",").strip() for line in (sql or "").splitlines())


def _contents(database: Path) -> dict:
    """Every table's schema and rows (times left out), as sqlite holds them."""
    with sqlite3.connect(database) as connection:
        tables = {name: _clauses(sql) for name, sql in connection.execute(
            "SELECT name, sql FROM sqlite_master WHERE type IN ('table', 'index') AND name NOT LIKE 'sqlite_%'")}
        contents = {}
        for name in sorted(tables):
            if not connection.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone():
                contents[name] = tables[name]
                continue
            columns = [row[1] for row in connection.execute(f"PRAGMA table_info('{name}')")]
            keep = [c for c in columns if c not in TIMES]
            rows = connection.execute(f"SELECT {', '.join(keep) or '1'} FROM '{name}'").fetchall()
            contents[name] = (tables[name], keep, sorted(map(repr, rows)))
    return contents


def _suite_store(path: Path) -> MlflowGateway:
    gateway = MlflowGateway(f"sqlite:///{path}")
    gateway.client.search_experiments(max_results=1)
    return gateway


def test_a_store_from_the_template_is_the_store_mlflow_makes(tmp_path, isolated_cache, monkeypatch):
    monkeypatch.chdir(tmp_path)  # both default experiments' artifact locations are relative to here
    by_mlflow = tmp_path / "mlflow-made.db"
    MlflowClient(tracking_uri=f"sqlite:///{by_mlflow}").search_experiments(max_results=1)
    template = sqlite_template.template_path()
    template.unlink(missing_ok=True)
    _suite_store(tmp_path / "first.db")  # builds the template
    assert template.is_file()
    built = template.stat()
    _suite_store(tmp_path / "second.db")  # copies it
    assert (template.stat().st_ino, template.stat().st_mtime_ns) == (built.st_ino, built.st_mtime_ns)
    for made in ("first.db", "second.db"):
        contents = _contents(tmp_path / made)
        assert contents == _contents(by_mlflow)
        assert any("Default" in row for row in contents["experiments"][2])  # MLflow made its default experiment
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'second.db'}")
    run = client.create_run(client.create_experiment("e"))
    client.log_metric(run.info.run_id, "m", 1.0)
    assert client.get_run(run.info.run_id).data.metrics == {"m": 1.0}


@pytest.mark.parametrize("damage", ["garbage", "truncated", "with an experiment"])
def test_a_damaged_or_hostile_template_is_rebuilt_not_copied(tmp_path, isolated_cache, damage):
    template = sqlite_template.template_path()
    _suite_store(tmp_path / "first.db")
    if damage == "garbage":
        template.write_bytes(b"not a database" * 100)
    elif damage == "truncated":
        template.write_bytes(template.read_bytes()[:4096])
    else:
        with sqlite3.connect(template) as connection:
            connection.execute("INSERT INTO experiments (experiment_id, name, lifecycle_stage) "
                               "VALUES (7, 'planted', 'active')")
    gateway = _suite_store(tmp_path / "store.db")
    names = [e.name for e in gateway.client.search_experiments()]
    assert names == ["Default"], names
    assert sqlite_template._usable(template)


def test_without_a_writable_cache_mlflow_makes_the_store(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("SUITE_CACHE_DIR", str(blocker))
    assert not sqlite_template.create_from_template(tmp_path / "direct.db")
    assert not (tmp_path / "direct.db").exists()
    gateway = _suite_store(tmp_path / "store.db")
    assert [e.name for e in gateway.client.search_experiments()] == ["Default"]


def _make_store(path: str) -> None:
    _suite_store(Path(path)).experiment_id("matrix")


def test_two_processes_make_stores_at_once_from_no_template(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_CACHE_DIR", str(tmp_path / "cache"))
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_make_store, args=(str(tmp_path / f"{i}.db"),)) for i in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    for i in range(2):
        names = sorted(e.name for e in MlflowClient(tracking_uri=f"sqlite:///{tmp_path / f'{i}.db'}")
                       .search_experiments())
        assert names == ["Default", "matrix"]
    assert [p.name for p in (tmp_path / "cache" / "mlflow-sqlite").iterdir()] == [
        sqlite_template.template_path().name]
    assert os.environ.get("SUITE_CACHE_DIR") == str(tmp_path / "cache")
