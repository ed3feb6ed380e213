"""Scale-out (issue 16): a matrix sharded over a cluster's scheduler (the shipped Slurm / Kubernetes scripts run
here with their variables set), every shard in one MLflow matrix; a shared tracking server on PostgreSQL."""

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from suite.analysis.compare import rows_from_mlflow
from suite.cli import main
from suite.config import MatrixSpec
from suite.recorders import MlflowGateway
from suite.run.matrix import shard_of

from conftest import free_port, runs_of, start_mlflow_server, stop_server

pytestmark = pytest.mark.mechanics
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
TINY = "--steps 2 --warmup-steps 1 --system-metrics-interval 0"


def _configs(workers, loaders):
    spec = MatrixSpec(workload="bridgetower", preset="tiny", workers=workers, loaders=loaders)
    return [dataclasses.replace(c, batch_size=8) for c in spec.expand()]


def test_every_configuration_is_in_exactly_one_shard_whatever_the_option_order():
    forward, backward = _configs((0, 1, 2), ("cpu", "device")), _configs((2, 0, 1), ("device", "cpu"))
    for count in range(1, 8):
        shards = [shard_of(forward, index, count) for index in range(count)]
        ids = [c.config_id for shard in shards for c in shard]
        assert sorted(ids) == sorted(c.config_id for c in forward)  # all, once
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        assert [{c.config_id for c in s} for s in shards] == [
            {c.config_id for c in shard_of(backward, index, count)} for index in range(count)]


def test_a_shard_needs_a_matrix_id_and_a_valid_index(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert main(["run", "--shard", "0/2", "--output", str(tmp_path / "o")]) == 2
    assert "--shard needs --matrix-id" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--shard", "2/2"])
    assert "I in 0..N-1" in capsys.readouterr().err
    assert main(["run", "--shard", "5/8", "--matrix-id", "m", "--dry-run"]) == 0  # 3 configurations, 8 shards
    assert "holds no configuration" in capsys.readouterr().out


def _shard_env(tmp_path, uri, **scheduler):
    return {**os.environ, "MLFLOW_TRACKING_URI": uri, "SUITE": f"{sys.executable} -m suite",
            "SUITE_OUTPUT_ROOT": str(tmp_path / "results"), **scheduler}


def test_the_indexed_job_manifest_runs_the_shard_script_with_its_own_count(tmp_path):
    manifest = yaml.safe_load((SCRIPTS / "k8s-indexed-job.yaml").read_text())
    spec = manifest["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    [container] = spec["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["command"][0].endswith("scripts/run-shard.sh") and env["SUITE_SHARD_COUNT"] == str(
        spec["completions"])
    # the pod's command, with what Kubernetes sets (JOB_COMPLETION_INDEX) and the manifest's count
    done = subprocess.run([str(SCRIPTS / "run-shard.sh"), "--dry-run"], capture_output=True, text=True, timeout=120,
                          env=_shard_env(tmp_path, f"sqlite:///{tmp_path}/m.db", JOB_COMPLETION_INDEX="1",
                                         SUITE_SHARD_COUNT=env["SUITE_SHARD_COUNT"], SUITE_MATRIX_ID="suite-matrix",
                                         SUITE_ARGS="--workers 0,1,2,3"))
    assert done.returncode == 0, done.stderr
    assert "(shard 1/4 of matrix suite-matrix)" in done.stdout
    assert done.stdout.count("bridgetower-tiny-cpu-") == 1 and not (tmp_path / "m.db").exists()


def _matrix_of(client, uri):
    parents = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                 "tags.`suite.role` = 'matrix'")
    return parents, [rows_from_mlflow(MlflowGateway(uri), run_id=p.info.run_id) for p in parents]


@pytest.mark.e2e
def test_the_slurm_array_script_runs_shards_into_one_matrix(tmp_path):
    """The sbatch file's body, as two array tasks at once (SLURM_ARRAY_* set as Slurm sets them), into one store."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tasks = [subprocess.Popen(["bash", str(SCRIPTS / "slurm-matrix.sbatch")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=_shard_env(tmp_path, uri, SLURM_ARRAY_TASK_ID=str(task), SLURM_ARRAY_TASK_MIN="1",
                                             SLURM_ARRAY_TASK_COUNT="2", SLURM_ARRAY_JOB_ID="4242",
                                             SUITE_SCRIPTS=str(SCRIPTS), SUITE_ARGS=f"--workers 0,1,2 {TINY}"))
             for task in (1, 2)]
    outputs = [task.communicate(timeout=600)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs
    folders = sorted((tmp_path / "results").iterdir())
    assert [f.name for f in folders] == ["slurm-4242-shard0", "slurm-4242-shard1"]
    ran = [r["config"]["num_workers"] for folder in folders for r in runs_of(folder)]
    assert sorted(ran) == [0, 1, 2]  # every configuration once
    client = MlflowClient(uri)
    parents, views = _matrix_of(client, uri)
    assert sorted(p.data.tags["suite.shard"] for p in parents) == ["0/2", "1/2"]
    assert {p.data.tags["suite.matrix_id"] for p in parents} == {"slurm-4242"}
    for rows in views:  # compare / report of either shard's matrix run: the whole matrix
        assert sorted(r.config.num_workers for r in rows) == [0, 1, 2]
    assert main(["report", parents[0].info.run_id, "--tracking-uri", uri, "--output", str(tmp_path / "report"),
                 "--reference", "none"]) == 0
    assert (tmp_path / "report" / "report.md").read_text().count("| cpu | cpu |") == 3


# --- a shared tracking server on PostgreSQL ---------------------------------------------------------------------
def _postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


@pytest.fixture
def postgres(tmp_path):
    """A PostgreSQL server of its own on 127.0.0.1 (Debian's postgresql; .ci/run installs it), a database
    ``mlflow`` in it; its URI. As root, the cluster belongs to the ``postgres`` user."""
    binaries = _postgres_bin()
    if binaries is None:
        if os.environ.get("SUITE_REQUIRE_POSTGRES"):
            pytest.fail("SUITE_REQUIRE_POSTGRES is set (CI) but PostgreSQL's binaries are not installed")
        pytest.skip("no PostgreSQL server binaries (Debian's postgresql package) on this machine")
    pytest.importorskip("psycopg", reason="MLflow's PostgreSQL store needs psycopg (the test extra has it)")
    data = Path(tempfile.mkdtemp(prefix="suite-pgdata-"))  # outside pytest's 0700 folders: postgres must reach it
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(data, "postgres", "postgres")
    port = free_port()
    subprocess.run([*as_user, str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                    "--no-sync"], check=True, capture_output=True, timeout=120)
    subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(data), "-w", "-t", "60", "-l", str(data / "log"),
                    "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                   check=True, capture_output=True, timeout=120)
    try:
        subprocess.run([*as_user, str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                        "mlflow"], check=True, capture_output=True, timeout=60)
        yield f"postgresql://postgres@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
                       capture_output=True, timeout=120)
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.e2e
def test_four_shards_at_once_into_a_tracking_server_on_postgresql(tmp_path, postgres):
    port = free_port()
    server = start_mlflow_server(tmp_path, port, backend_uri=postgres)
    uri = f"http://127.0.0.1:{port}"
    try:
        shards = [subprocess.Popen([sys.executable, "-m", "suite", "run", "--workers", "0,1", "--loader",
                                    "cpu,cpu-fast", *TINY.split(), "--shard", f"{index}/4", "--matrix-id", "team-1",
                                    "--output", str(tmp_path / f"shard{index}"), "--tracking-uri", uri,
                                    "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                  for index in range(4)]
        outputs = [shard.communicate(timeout=600)[0] for shard in shards]
        assert [shard.returncode for shard in shards] == [0] * 4, outputs
        client = MlflowClient(uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        configuration_runs = client.search_runs(experiments, "tags.`suite.role` = 'configuration'")
        ids = [r.data.tags["suite.config_id"] for r in configuration_runs]
        assert len(ids) == 4 and len(set(ids)) == 4  # every run present once
        assert {r.info.status for r in configuration_runs} == {"FINISHED"}
        parents, views = _matrix_of(client, uri)
        assert len(parents) == 4 and {p.info.status for p in parents} == {"FINISHED"}
        assert all(sorted(r.config_id for r in rows) == sorted(ids) for rows in views)
        recorded = {r["mlflow_run_id"] for index in range(4) for r in runs_of(tmp_path / f"shard{index}")}
        assert recorded == {r.info.run_id for r in configuration_runs}
    finally:
        stop_server(server)
        time.sleep(0.5)
