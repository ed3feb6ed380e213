"""Faults with real processes: two runners on one folder, a full file system (a real tmpfs), kill -9 of the
runner (with and without its configuration process), and four runners sharing one fresh sqlite store.

Issue 18, defects 6, 7, 9, 10. Each test fails on the record layer before the redesign.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from suite.cli import main

from conftest import runs_of

pytestmark = [pytest.mark.e2e, pytest.mark.mechanics]
SHORT = ["--steps", "3", "--warmup-steps", "1", "--no-progress", "--system-metrics-interval", "0"]


def _suite(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "suite", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def _wait_for(predicate, what, proc=None, timeout=180):
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        assert proc is None or proc.poll() is None, f"the process ended before {what}: {proc.communicate()}"
        time.sleep(0.1)


def _training(out):
    logs = list(Path(out).glob("runs/*/run.log"))
    return bool(logs) and "phase: training" in logs[0].read_text(errors="replace")


def _runs(client, **tags):
    experiment = client.get_experiment_by_name("bridgetower")
    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    return client.search_runs([experiment.experiment_id], query)


def test_a_second_runner_on_a_folder_in_use_is_refused_and_the_first_loses_nothing(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    first = _suite("run", "--workers", "0,1", *SHORT, "--seed", "1", "--output", str(tmp_path / "out"),
                   "--tracking-uri", uri)
    _wait_for(lambda: (tmp_path / "out" / "matrix.json").exists(), "the first runner to claim the folder", first)
    second = _suite("run", "--workers", "0,1", *SHORT, "--seed", "2", "--output", str(tmp_path / "out"),
                    "--tracking-uri", uri)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 2
    assert err.strip().splitlines() == [f"suite: error: results folder {tmp_path / 'out'} is in use by another suite "
                                        f"process (pid {first.pid} on {os.uname().nodename}, matrix "
                                        f"{json.loads((tmp_path / 'out' / 'matrix.json').read_text())['name']}); "
                                        "wait for it or choose another --output"]
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    runs = runs_of(tmp_path / "out")
    assert [(r["config"]["num_workers"], r["config"]["seed"], r["status"]) for r in runs] == [
        (0, 1, "FINISHED"), (1, 1, "FINISHED")]
    for run in runs:  # each run's own folder holds its own result
        own = json.loads((tmp_path / "out" / run["facts"]["run_dir"] / "result.json").read_text())
        assert own["run_uid"] == run["run_uid"] and own["loss_digest"] == run["loss_digest"]
    again = _suite("run", "--workers", "0", *SHORT, "--output", str(tmp_path / "out"), "--tracking-uri", uri)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 2 and "already holds the results of another matrix" in err


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 1 MiB tmpfs (root only); skipped with the reason where it cannot be mounted."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); the full-disk path is "
                    "covered in-process by test_records.py")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(folder):
    with open(folder / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass


def test_a_full_file_system_mid_matrix_keeps_the_finished_run_and_recover_restores_it(tmp_path, tiny_tmpfs):
    uri = f"sqlite:///{tmp_path}/m.db"
    rescue_dir = tmp_path / "rescue"
    rescue_dir.mkdir()
    out = tiny_tmpfs / "out"
    proc = _suite("run", "--workers", "0,1", "--steps", "20", "--warmup-steps", "1", "--no-progress",
                  "--output", str(out), "--tracking-uri", uri, env={**os.environ, "TMPDIR": str(rescue_dir)})
    _wait_for(lambda: _training(out), "the first configuration to train", proc)
    _fill(tiny_tmpfs)  # the disk is full from here on: the first run cannot write its result anywhere on it
    stdout, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert "Traceback" not in err and "Traceback" not in stdout
    [rescue] = rescue_dir.glob("suite-rescue-*.json")
    assert f"suite recover {out} --from {rescue}" in err and "No space left on device" in err
    client = MlflowClient(tracking_uri=uri)
    [matrix] = _runs(client, **{"suite.role": "matrix"})
    [config] = _runs(client, **{"suite.role": "configuration"})  # the second configuration never started
    throughput = config.data.metrics["throughput/throughput_samples_per_s"]
    assert config.info.status == "FINISHED" and throughput > 0  # not lost
    assert matrix.info.status == "FAILED" and "No space left" in matrix.data.tags["failure_reason"]

    (tiny_tmpfs / "filler").unlink()  # space freed
    assert main(["recover", str(out), "--from", str(rescue)]) == 0
    [run] = runs_of(out)
    assert run["status"] == "FINISHED" and run["run_uid"] == config.data.tags["suite.run_uid"]
    assert run["metrics"]["throughput_samples_per_s"] == pytest.approx(throughput)
    matrix_json = json.loads((out / "matrix.json").read_text())
    assert matrix_json["status"] == "FAILED" and "No space left on device" in matrix_json["reason"]
    assert (out / run["facts"]["run_dir"] / "result.json").is_file()  # written back into the run's folder
    # issue 27, point 11: the manifest was written before the run, and the rescue's complete one replaced it: the
    # audit can check the record and re-run it
    manifest = json.loads((out / run["facts"]["run_dir"] / "manifest.json").read_text())
    assert manifest["stage"] == "complete" and manifest["dataset_fingerprint"] and manifest["config"] == run["config"]
    assert main(["audit", str(out), "--no-rerun", "--output", str(tmp_path / "audit"), "--tracking-uri", uri]) in (0, 3)
    report = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert not [c for c in report["checks"] if c["verdict"] == "FAIL"], report


@pytest.mark.parametrize("kill_configuration", [False, True], ids=["orphan-finishes", "both-killed"])
def test_kill_9_of_the_runner_is_finished_by_recover(tmp_path, kill_configuration):
    uri = f"sqlite:///{tmp_path}/m.db"
    out = tmp_path / "out"
    proc = _suite("run", "--workers", "0", "--steps", "25", "--warmup-steps", "1", "--no-progress",
                  "--output", str(out), "--tracking-uri", uri, start_new_session=True)
    _wait_for(lambda: _training(out), "the configuration to train", proc)
    if kill_configuration:  # the runner and its configuration process (its own process group, with its workers)
        [info] = out.glob("runs/*/run.json")
        child = json.loads(info.read_text())["pid"]
        os.killpg(proc.pid, signal.SIGKILL)
        os.killpg(child, signal.SIGKILL)
    else:
        proc.kill()  # the runner alone: its configuration process runs on, orphaned
    proc.wait()
    [folder] = out.glob("runs/*")
    if kill_configuration:
        time.sleep(1)
    else:
        _wait_for(lambda: (folder / "result.json").exists(), "the orphaned configuration to finish")
    client = MlflowClient(tracking_uri=uri)
    assert {r.info.status for r in _runs(client)} == {"RUNNING"}  # what kill -9 leaves
    assert json.loads((out / "matrix.json").read_text())["status"] == "RUNNING"

    assert main(["recover", str(out)]) == 0
    [run] = runs_of(out)
    [config] = _runs(client, **{"suite.role": "configuration"})
    [matrix] = _runs(client, **{"suite.role": "matrix"})
    if kill_configuration:
        assert run["status"] == "KILLED" and "no result was written" in run["reason"]
        assert config.info.status == "KILLED" and config.info.end_time
    else:  # the orphan's FINISHED result is recorded, in the folder and in MLflow
        assert run["status"] == "FINISHED" and "recover" in run["facts"]["recovered"]
        assert config.info.status == "FINISHED" and config.data.metrics["throughput/throughput_samples_per_s"] > 0
        assert config.info.run_id == run["mlflow_run_id"]
    assert matrix.info.status == "KILLED" and matrix.info.end_time
    assert json.loads((out / "matrix.json").read_text())["status"] == "KILLED"
    before = (out / "results.json").read_bytes()
    assert main(["recover", str(out)]) == 0  # idempotent
    assert (out / "results.json").read_bytes() == before
    assert len(_runs(client)) == 2


def test_four_runners_share_one_fresh_sqlite_store_and_every_run_is_there(tmp_path):
    uri = f"sqlite:///{tmp_path}/shared.db"  # created by whichever runner gets there first
    procs = [_suite("run", "--workers", "0", *SHORT, "--seed", str(seed), "--output", str(tmp_path / f"out{seed}"),
                    "--tracking-uri", uri) for seed in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    client = MlflowClient(tracking_uri=uri)
    configs = _runs(client, **{"suite.role": "configuration"})
    assert len(_runs(client, **{"suite.role": "matrix"})) == 4 and len(configs) == 4
    assert {r.info.status for r in configs} == {"FINISHED"}
    recorded = {r.info.run_id: r for r in configs}
    for seed in range(4):
        [run] = runs_of(tmp_path / f"out{seed}")
        assert run["status"] == "FINISHED" and run["config"]["seed"] == seed
        assert recorded[run["mlflow_run_id"]].data.params["seed"] == str(seed)


@pytest.mark.parametrize("config_text", [None, "{}", "not json"], ids=["absent", "not-a-configuration", "not-json"])
def test_recover_leaves_out_a_dead_run_without_a_readable_configuration_and_says_so(tmp_path, config_text):
    """A run folder whose process is gone with no result and no usable config.json: nothing to record it as (a
    record holds a typed configuration); `suite recover` names it and records nothing false."""
    from suite.results.files import MatrixInfo, RunFiles
    from suite.results.store import ResultsStore
    from suite.tracking.upload import repair

    store = ResultsStore.create(tmp_path / "out", MatrixInfo(name="m", workload="bridgetower",
                                                             command=["suite", "run"]))
    files = RunFiles(store.root, "bridgetower-tiny-x")
    files.folder.mkdir(parents=True)
    files.run_info.write_text(json.dumps({"run_uid": "u1", "pid": 2**22 + 12345, "repeat": 0}))
    if config_text is not None:
        files.config.write_text(config_text)
    notes, running = repair(store)
    assert not running and store.held_results() == []
    assert any(note.startswith("left bridgetower-tiny-x out: started, no result, and no readable configuration")
               for note in notes), notes
