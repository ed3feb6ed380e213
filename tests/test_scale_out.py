"""Scale-out (issue 16): a matrix sharded over a cluster's scheduler (the shipped Slurm / Kubernetes scripts run
here with their variables set), every shard in one MLflow matrix; a shared tracking server on PostgreSQL."""

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

from suite.tracking.reading import rows_from_mlflow
from suite.cli import main
from suite.config import MatrixSpec, RunConfig
from suite.tracking.mlflow_gateway import MlflowGateway
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


def test_a_multi_node_configuration_is_its_own_and_needs_an_endpoint():
    from suite.errors import ConfigError
    from suite.run.children import launcher_command

    base = _configs((0,), ("cpu",))[0]
    two = dataclasses.replace(base, nnodes=2, rdzv_endpoint="10.0.0.1:29500")
    assert "-nn2-" in two.config_id and two.config_id != base.config_id and two.describe().endswith("nodes=2")
    assert dataclasses.replace(two, rdzv_endpoint="10.0.0.2:1").config_id == two.config_id  # a run control
    with pytest.raises(ConfigError, match="needs rdzv_endpoint HOST:PORT"):
        dataclasses.replace(base, nnodes=2)
    command = launcher_command(two, "run-a")
    assert command[1:3] == ["-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500", "--rdzv-id=run-a",
            "--max-restarts=0"} <= set(command)


def test_torchruns_own_failure_report_becomes_the_reason(tmp_path):
    """A real torchrun whose rank 1 raises: the reason names the rank, its exit code and its error."""
    from suite.run.outcome import _torchrun_failure

    script = tmp_path / "fails.py"
    script.write_text("import os\nif os.environ['RANK'] == '1':\n"
                      "    raise RuntimeError('Connection closed by peer [127.0.0.1]:4242')\n"
                      "import time\ntime.sleep(2)\n")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "--max-restarts=0", str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    reason = _torchrun_failure(done.stdout + done.stderr)
    assert reason == "torchrun: rank 1 failed (exit code 1); RuntimeError: Connection closed by peer [127.0.0.1]:4242"
    assert _torchrun_failure("Traceback ...\nValueError: something else") is None  # not torchrun's report


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


# --- a shared tracking server on PostgreSQL (the `postgres` fixture: conftest) ------------------------------------
@pytest.mark.e2e
def test_four_slurm_array_tasks_at_once_into_one_matrix_on_a_postgresql_server(tmp_path, postgres):
    """The sbatch file's body as four array tasks at once (SLURM_ARRAY_* set as Slurm sets them, the array starting
    at 1), every shard into one `mlflow server` on PostgreSQL: every run present once, statuses right, one matrix."""
    port = free_port()
    server = start_mlflow_server(tmp_path, port, backend_uri=postgres)
    uri = f"http://127.0.0.1:{port}"
    try:
        tasks = [subprocess.Popen(["bash", str(SCRIPTS / "slurm-matrix.sbatch")], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  env=_shard_env(tmp_path, uri, SLURM_ARRAY_TASK_ID=str(task), SLURM_ARRAY_TASK_MIN="1",
                                                 SLURM_ARRAY_TASK_COUNT="4", SLURM_ARRAY_JOB_ID="4242",
                                                 SUITE_SCRIPTS=str(SCRIPTS),
                                                 SUITE_ARGS=f"--workers 0,1 --loader cpu,cpu-fast {TINY}"))
                 for task in (1, 2, 3, 4)]
        outputs = [task.communicate(timeout=600)[0] for task in tasks]
        assert [task.returncode for task in tasks] == [0] * 4, outputs
        folders = sorted((tmp_path / "results").iterdir())
        assert [f.name for f in folders] == [f"slurm-4242-shard{index}" for index in range(4)]
        ran = [RunConfig.from_dict(r["config"]).config_id for folder in folders for r in runs_of(folder)]
        assert len(ran) == 4 and len(set(ran)) == 4  # the 2 x 2 matrix, every configuration once
        client = MlflowClient(uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        configuration_runs = client.search_runs(experiments, "tags.`suite.role` = 'configuration'")
        assert sorted(r.data.tags["suite.config_id"] for r in configuration_runs) == sorted(ran)  # each once
        assert {r.info.status for r in configuration_runs} == {"FINISHED"}
        recorded = {r["mlflow_run_id"] for folder in folders for r in runs_of(folder)}
        assert recorded == {r.info.run_id for r in configuration_runs}
        parents, views = _matrix_of(client, uri)
        assert sorted(p.data.tags["suite.shard"] for p in parents) == [f"{index}/4" for index in range(4)]
        assert {p.data.tags["suite.matrix_id"] for p in parents} == {"slurm-4242"}
        assert {p.info.status for p in parents} == {"FINISHED"}
        for rows in views:  # compare / report of any shard's matrix run: the whole matrix
            assert sorted(r.config_id for r in rows) == sorted(ran)
        assert main(["report", parents[0].info.run_id, "--tracking-uri", uri, "--output",
                     str(tmp_path / "report"), "--reference", "none"]) == 0
        assert (tmp_path / "report" / "report.md").read_text().count("| cpu | cpu") == 4
    finally:
        stop_server(server)


# --- one configuration over two nodes (two torchrun agents on this machine, c10d rendezvous, gloo) -----------
def _node(tmp_path, node_rank, port, uri, steps):
    """`suite run` as a user types it on one node of two; its own process group (a node to kill whole)."""
    return subprocess.Popen([sys.executable, "-m", "suite", "run", "--nnodes", "2", "--node-rank", str(node_rank),
                             "--rdzv-endpoint", f"127.0.0.1:{port}", "--workers", "0,1", "--steps", str(steps),
                             "--warmup-steps", "1", "--system-metrics-interval", "0", "--no-progress",
                             "--output", str(tmp_path / f"node{node_rank}"), "--tracking-uri", uri],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.e2e
def test_two_nodes_record_each_configuration_once_and_a_node_that_dies_fails_it_with_torchruns_reason(tmp_path):
    """Two `suite run --nnodes 2` on this machine (torchrun c10d rendezvous, gloo): the first configuration is
    recorded once, by the node that held global rank 0; node 1 is killed (kill -9 of its whole process group)
    while the second trains, and node 0 records that configuration FAILED with torchrun's report, promptly."""
    uri, port, steps = f"sqlite:///{tmp_path}/mlflow.db", free_port(), 20
    nodes = [_node(tmp_path, rank, port, uri, steps) for rank in (0, 1)]
    deadline = time.time() + 400
    while time.time() < deadline:  # the second configuration training: a step logged by global rank 0's node
        logs = " ".join(p.read_text(errors="replace") for p in tmp_path.glob("node*/runs/*-nw1-*/run.log"))
        if "step 3/" in logs:
            break
        assert all(node.poll() is None for node in nodes), [node.communicate()[0] for node in nodes]
        time.sleep(0.2)
    else:
        pytest.fail("the second configuration never started training on both nodes")
    killed_at = time.time()
    node1 = psutil.Process(nodes[1].pid)  # node 1 dies: its runner, torchrun agent, rank and workers at once
    for process in [node1, *node1.children(recursive=True)]:
        process.kill()
    nodes[1].wait()
    output = nodes[0].communicate(timeout=300)[0]
    assert time.time() - killed_at < 60, "the surviving node hung"  # torchrun's exit barrier alone waits 300 s
    assert nodes[0].returncode == 1, output  # a configuration failed; the runner ended
    first, second = runs_of(tmp_path / "node0")
    # the reason: the surviving rank's own error if it held global rank 0 (gloo: "Connection closed by peer"), else
    # torchrun's own report: its failed rank, or its lost rendezvous store when the dead node hosted it
    assert second["status"] == "FAILED", second
    reason = second["reason"]
    dead_peer = ("Connection closed by peer", "Connection reset by peer")  # gloo's words, FIN or RST from the dead node
    assert any(words in reason for words in dead_peer) or reason.startswith(
        ("torchrun: rank ", "torchrun: the configuration failed; Rendezvous")), reason

    # the first configuration: measured on both nodes, recorded by the one that held global rank 0
    killed_node = runs_of(tmp_path / "node1") if (tmp_path / "node1" / "results.json").is_file() else []
    candidates = [first, *killed_node[:1]]
    [result] = [r for r in candidates if not r["facts"].get("node_role")]
    assert "-nn2-" in RunConfig.from_dict(result["config"]).config_id  # two nodes: a configuration of its own
    facts, m = result["facts"], result["metrics"]
    assert result["status"] == "FINISHED", result["reason"]
    assert (facts["world_size"], facts["nodes"], facts["global_batch_size"]) == (2, 2, 16)  # batch 8 x 2 nodes
    assert m["throughput_samples_per_s"] == pytest.approx(steps * 16 / m["measured_wall_s"])  # slowest rank
    assert "slowest rank" in facts["aggregation"]
    assert "this node only" in facts["host_ram_scope"] and m["host_ram_peak_rss_bytes"] > 0  # per node, said
    if first is not result:
        assert first["facts"]["node_role"] == "worker" and "throughput_samples_per_s" not in first["metrics"]
    client = MlflowClient(uri)
    configuration_runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                            "tags.`suite.role` = 'configuration'")
    assert len(configuration_runs) == 1 + (second["mlflow_run_id"] is not None)
    assert result["mlflow_run_id"] in {r.info.run_id for r in configuration_runs}  # once, from one node


@pytest.mark.e2e
def test_a_stopped_database_server_is_one_line_within_seconds(tmp_path, postgres, capsys, monkeypatch):
    """Issue 27, point 9: a hung (stopped) tracking store stalled a run for 69 s before anything was said. The
    server is stopped with SIGSTOP (it still accepts TCP connections: the kernel queues them)."""
    import psutil

    from suite.cli import main
    from suite.tracking import stores

    monkeypatch.setattr(stores, "DATABASE_ANSWER_S", 3.0)
    port = int(postgres.rsplit(":", 1)[1].split("/")[0])
    [server] = [p for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "postgres"
                and any(f"-p {port}" in arg or arg == str(port) for arg in p.info["cmdline"] or [])][:1] or [None]
    assert server is not None, "the test's own postgres server"
    monkeypatch.chdir(tmp_path)
    server.suspend()
    try:
        started = time.monotonic()
        code = main(["run", "--workers", "0", "--steps", "1", "--no-progress", "--tracking-uri", postgres])
        elapsed = time.monotonic() - started
    finally:
        server.resume()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "does not answer within 3 s (stopped or overloaded)" in err[0], err
    assert elapsed < 30 and list(tmp_path.iterdir()) == []
    assert main(["run", "--workers", "0", "--steps", "1", "--warmup-steps", "0", "--no-progress",
                 "--system-metrics-interval", "0", "--tracking-uri", postgres, "--output", str(tmp_path / "out")]) == 0
