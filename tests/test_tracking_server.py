"""A real MLflow tracking server on 127.0.0.1: reachability check, outage mid-matrix, `suite upload`."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from suite.cli import main

pytestmark = pytest.mark.e2e
MLFLOW = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or "mlflow"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(workdir: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([MLFLOW, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{workdir}/server.db"],
                            cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    _stop_server(proc)
    raise AssertionError("mlflow server did not answer /health within 90 s")


def _stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)  # the server and its worker processes
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_unreachable_server_is_a_clear_error_before_anything_runs(tmp_path, capsys):
    uri = f"http://127.0.0.1:{_free_port()}"
    assert main(["run", "--tracking-uri", uri, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"MLflow tracking server {uri} is unreachable" in err[0]
    assert not (tmp_path / "out").exists()


def test_server_outage_mid_matrix_keeps_every_run_and_upload_records_them_once(tmp_path):
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    server = _start_server(tmp_path, port)
    out = tmp_path / "out"
    env = {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    try:
        run = subprocess.Popen([sys.executable, "-m", "suite", "run", "--workers", "0,1", "--steps", "3",
                                "--warmup-steps", "1", "--tracking-uri", uri, "--output", str(out), "--no-progress"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.time() + 120
        while not ((out / "results.json").exists() and json.loads((out / "results.json").read_text())):
            assert time.time() < deadline and run.poll() is None, "the first configuration never ended"
            time.sleep(0.1)
        _stop_server(server)  # the server goes away after the first configuration
        _, err = run.communicate(timeout=180)
        assert run.returncode == 1, err
        assert f"suite upload {out} --tracking-uri {uri}" in err
        results = json.loads((out / "results.json").read_text())
        assert [r["status"] for r in results] == ["FINISHED", "FINISHED"]  # nothing lost
        assert results[0]["mlflow_run_id"] and results[1]["mlflow_run_id"] is None

        server = _start_server(tmp_path, port)
        assert main(["upload", str(out), "--tracking-uri", uri]) == 0
        assert main(["upload", str(out), "--tracking-uri", uri]) == 0  # a second upload changes nothing
        client = MlflowClient(tracking_uri=uri)
        runs = client.search_runs([client.get_experiment_by_name("bridgetower").experiment_id])
        configs = [r for r in runs if r.data.tags.get("suite.role") == "configuration"]
        matrices = [r for r in runs if r.data.tags.get("suite.role") == "matrix"]
        assert len(matrices) == 1 and len(configs) == 2
        uploaded = json.loads((out / "results.json").read_text())
        assert sorted(r.data.tags["suite.run_uid"] for r in configs) == sorted(r["run_uid"] for r in uploaded)
        assert {r.info.status for r in configs} == {"FINISHED"}
        assert sorted(r.info.run_id for r in configs) == sorted(r["mlflow_run_id"] for r in uploaded)
        for r in configs:
            assert r.data.metrics["throughput_samples_per_s"] > 0
            assert r.data.tags["mlflow.parentRunId"] == matrices[0].info.run_id
    finally:
        _stop_server(server)
