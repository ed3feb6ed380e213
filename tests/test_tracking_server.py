"""A real MLflow tracking server on 127.0.0.1: reachability check, outage mid-matrix, `suite upload`."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from mlflow.tracking import MlflowClient

from suite.cli import main

from conftest import free_port, runs_of, start_mlflow_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.mechanics]
def test_unreachable_server_is_a_clear_error_before_anything_runs(tmp_path, capsys):
    uri = f"http://127.0.0.1:{free_port()}"
    assert main(["run", "--tracking-uri", uri, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"MLflow tracking server {uri} is unreachable" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_server_killed_mid_matrix_costs_seconds_and_upload_records_every_run_once(tmp_path):
    """Issue 18, defect 8: with MLflow's default retries a dead server stalled the matrix ~8 minutes; the suite
    bounds them itself (no retry settings are given here). Defect 11: uploading into another store leaves the
    folder's run ids alone."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_mlflow_server(tmp_path, port)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    try:
        run = subprocess.Popen([sys.executable, "-m", "suite", "run", "--workers", "0,1", "--steps", "3",
                                "--warmup-steps", "1", "--tracking-uri", uri, "--output", str(out), "--no-progress"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.time() + 120
        while not ((out / "results.json").exists() and runs_of(out) and runs_of(out)[0]["mlflow_run_id"]):
            assert time.time() < deadline and run.poll() is None, "the first configuration was never recorded"
            time.sleep(0.1)
        os.killpg(server.pid, 9)  # the server dies after the first configuration
        server.wait()
        killed_at = time.time()
        _, err = run.communicate(timeout=300)
        stall = time.time() - killed_at
        assert stall < 90, f"the matrix took {stall:.0f} s to end after the server died"  # ~10 s of training
        assert run.returncode == 1, err
        assert err.count(f"suite upload {out} --tracking-uri {uri}") == 1  # switched off once, not per call
        results = runs_of(out)
        assert [r["status"] for r in results] == ["FINISHED", "FINISHED"]  # nothing lost
        assert results[0]["mlflow_run_id"] and results[1]["mlflow_run_id"] is None
        assert json.loads((out / "matrix.json").read_text())["status"] == "FINISHED"  # what happened to the runs

        server = start_mlflow_server(tmp_path, port)
        assert main(["upload", str(out), "--tracking-uri", uri]) == 0
        assert main(["upload", str(out), "--tracking-uri", uri]) == 0  # a second upload changes nothing
        client = MlflowClient(tracking_uri=uri)
        runs = client.search_runs([client.get_experiment_by_name("bridgetower").experiment_id])
        configs = [r for r in runs if r.data.tags.get("suite.role") == "configuration"]
        matrices = [r for r in runs if r.data.tags.get("suite.role") == "matrix"]
        assert len(matrices) == 1 and len(configs) == 2
        assert matrices[0].info.status == "FINISHED" and matrices[0].info.end_time
        uploaded = runs_of(out)
        assert sorted(r.data.tags["suite.run_uid"] for r in configs) == sorted(r["run_uid"] for r in uploaded)
        assert {r.info.status for r in configs} == {"FINISHED"}
        assert sorted(r.info.run_id for r in configs) == sorted(r["mlflow_run_id"] for r in uploaded)
        for r in configs:
            assert r.data.metrics["throughput/throughput_samples_per_s"] > 0
            assert r.data.tags["mlflow.parentRunId"] == matrices[0].info.run_id

        before = (out / "results.json").read_bytes()  # another store: the folder's ids stay those of its own
        other = f"sqlite:///{tmp_path}/other.db"
        assert main(["upload", str(out), "--tracking-uri", other]) == 0
        assert (out / "results.json").read_bytes() == before
        copied = MlflowClient(tracking_uri=other).search_runs(
            [MlflowClient(tracking_uri=other).get_experiment_by_name("bridgetower").experiment_id],
            "tags.`suite.role` = 'configuration'")
        assert len(copied) == 2 and not {r.info.run_id for r in copied} & {r["mlflow_run_id"] for r in uploaded}
    finally:
        stop_server(server)


def test_a_database_store_that_stops_answering_mid_matrix_costs_its_deadline_and_says_so(tmp_path, postgres_server):
    """Issue 27, point 9: a PostgreSQL tracking store stopped (SIGSTOP) after the first configuration was recorded.
    Its client library has no read timeout: the matrix waited for ever. Now one call waits its deadline (8 s here),
    the store is given up for the rest of the matrix with one line saying so, and nothing is lost."""
    import signal

    import psutil

    uri, data = postgres_server
    uri = uri.replace("postgresql://", "postgresql+psycopg://")  # psycopg 3, the test extra's driver
    out = tmp_path / "out"
    run = subprocess.Popen([sys.executable, "-m", "suite", "run", "--workers", "0,1", "--steps", "3",
                            "--warmup-steps", "1", "--tracking-uri", uri, "--output", str(out), "--no-progress",
                            "--system-metrics-interval", "0"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "SUITE_TRACKING_DEADLINE_S": "8"})
    postmaster = psutil.Process(int((data / "postmaster.pid").read_text().split()[0]))
    stopped = []
    try:
        deadline = time.time() + 180
        while not ((out / "results.json").exists() and runs_of(out) and runs_of(out)[0]["mlflow_run_id"]):
            assert time.time() < deadline and run.poll() is None, "the first configuration was never recorded"
            time.sleep(0.1)
        stopped = [postmaster, *postmaster.children(recursive=True)]
        for process in stopped:
            process.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        _, err = run.communicate(timeout=300)
        stall = time.time() - stopped_at
    finally:
        for process in stopped:
            process.send_signal(signal.SIGCONT)
        if run.poll() is None:
            run.kill()
    assert stall < 60, f"the matrix took {stall:.0f} s to end after the store stopped"  # ~10 s of training
    assert run.returncode == 1, err
    assert "did not answer" in err and "within 8 s (stopped, hung or overloaded)" in err, err
    assert "Traceback" not in err, err
    assert err.count(f"suite upload {out} --tracking-uri") == 1
    assert [r["status"] for r in runs_of(out)] == ["FINISHED", "FINISHED"]  # nothing lost


def test_a_call_past_its_deadline_gives_the_store_up_and_later_calls_fail_at_once(tmp_path, monkeypatch):
    """The gateway's deadline without a server: a stand-in for ``MlflowClient.search_experiments`` that never
    returns (as a stopped database's client library does)."""
    from suite.tracking.mlflow_gateway import MlflowGateway
    from suite.tracking.deadlines import TrackingStalled

    monkeypatch.setenv("SUITE_TRACKING_DEADLINE_S", "0.5")
    gateway = MlflowGateway(f"sqlite:///{tmp_path}/m.db")
    never = threading.Event()
    monkeypatch.setattr(type(gateway.client._client), "search_experiments", lambda self, *a, **k: never.wait())
    started = time.monotonic()
    with pytest.raises(TrackingStalled, match=r"did not answer search_experiments within 0.5 s"):
        gateway.all_experiment_ids()
    assert time.monotonic() - started < 5
    started = time.monotonic()
    with pytest.raises(TrackingStalled, match=r"search_experiments within 0.5 s"):  # the first reason, at once
        gateway.experiment_id("bridgetower")
    assert time.monotonic() - started < 0.2
    never.set()


@pytest.mark.parametrize("value", ["x", "0", "inf", "-3"])
def test_a_deadline_that_is_not_a_positive_number_is_refused(tmp_path, monkeypatch, value):
    from suite.errors import SuiteError
    from suite.tracking.mlflow_gateway import MlflowGateway

    monkeypatch.setenv("SUITE_TRACKING_DEADLINE_S", value)
    with pytest.raises(SuiteError, match="SUITE_TRACKING_DEADLINE_S must be"):
        MlflowGateway(f"sqlite:///{tmp_path}/m.db").client
