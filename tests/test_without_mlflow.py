"""Issue 47 (2): many accelerator boxes have torch and no MLflow (nor network). `suite run` records to its results folder
there, says so in one line, and `suite upload` records the folder later from a machine with MLflow. MLflow is made
unimportable for the run and its configuration processes by a package of that name that raises ImportError, first
on PYTHONPATH."""

import json
import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from suite.cli import main

from conftest import runs_of

pytestmark = [pytest.mark.mechanics, pytest.mark.e2e]


@pytest.fixture
def without_mlflow(tmp_path):
    block = tmp_path / "block" / "mlflow"
    block.mkdir(parents=True)
    (block / "__init__.py").write_text('raise ImportError("No module named \'mlflow\' (made unimportable by the test)")\n')
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(block.parent), os.environ.get("PYTHONPATH", "")]),
            "SUITE_REPORT": "1"}


def _run(args, env, cwd):
    return subprocess.run([sys.executable, "-m", "suite", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600)


def test_a_run_without_mlflow_records_to_its_folder_and_is_uploaded_later(tmp_path, without_mlflow, monkeypatch):
    out = tmp_path / "out"
    done = _run(["run", "--workers", "0", "--steps", "2", "--warmup-steps", "0", "--no-progress",
                 "--system-metrics-interval", "0", "--output", str(out)], without_mlflow, tmp_path)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "MLflow is not installed here" in line]
    assert len(said) == 1 and f"suite upload {out}" in said[0], done.stderr
    assert "Traceback" not in done.stdout + done.stderr and not (tmp_path / "mlflow.db").exists()
    assert [r["status"] for r in runs_of(out)] == ["FINISHED"] and (out / "report.html").is_file()
    assert json.loads((out / "matrix.json").read_text())["tracking_uri"] is None
    # an explicit store cannot be honoured without MLflow: one line, nothing run
    refused = _run(["run", "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--output", str(tmp_path / "no")],
                   without_mlflow, tmp_path)
    assert refused.returncode == 2 and "--tracking-uri needs MLflow" in refused.stderr
    assert not (tmp_path / "no").exists()
    # later, where MLflow is: the default store (./mlflow.db) takes the folder, which now names it
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["upload", str(out)]) == 0
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("bridgetower").experiment_id])
    configs = [r for r in runs if r.data.tags.get("suite.role") == "configuration"]
    assert len(configs) == 1 and runs_of(out)[0]["mlflow_run_id"] == configs[0].info.run_id
    assert json.loads((out / "matrix.json").read_text())["tracking_uri"] == uri
