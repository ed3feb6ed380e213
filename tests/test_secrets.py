"""Issue 46, secrets: a credential is used to connect and nowhere else. A password in the tracking URI and token-bearing
environment variables are planted; no byte of them may reach the terminal, the results folder, the MLflow store or its
artifacts. The store is MLflow's own basic-auth server, which refuses every call without the credentials: the suite
must connect as MLflow does (issue 46 (3): its health check put the user-info in the host name)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from suite.cli import main
from suite.redact import REDACTED, SET_NOT_RECORDED, is_secret_name, redact_argv, redact_environment, redact_uri
from suite.results.environment import accelerator_environment
from suite.tracking.stores import check_reachable

from conftest import free_port, start_mlflow_server, stop_server

pytestmark = pytest.mark.mechanics

PASSWORD = "S3cret-Pa55word!x"  # 12+ characters: MLflow's basic-auth app refuses shorter admin passwords
TOKENS = {"NVIDIA_API_KEY": "nvapi-TOKEN-one", "NCCL_IB_AUTH_TOKEN": "TOKEN-two-ib", "CUDA_MPS_TOKEN": "TOKEN-three-mps",
          "HABANA_TOKEN": "TOKEN-four-hab"}
SECRETS = [PASSWORD, *TOKENS.values()]


@pytest.mark.parametrize("uri,shown", [
    ("postgresql://u:SECRET@db.example:5432/mlflow", "postgresql://u:***@db.example:5432/mlflow"),
    ("postgresql://u:p@ss@word@db/mlflow", "postgresql://u:***@db/mlflow"),  # an unescaped @ in the password
    ("mysql+pymysql://root:SECRET@127.0.0.1/m?charset=utf8", "mysql+pymysql://root:***@127.0.0.1/m?charset=utf8"),
    ("http://admin:SECRET@127.0.0.1:5000", "http://admin:***@127.0.0.1:5000"),
    ("postgresql://db/mlflow?user=u&password=SECRET&sslmode=require",
     "postgresql://db/mlflow?user=u&password=***&sslmode=require"),
    ("mssql+pyodbc://u@dsn?odbc_connect=Driver%3Dx;Pwd=SECRET", "mssql+pyodbc://u@dsn?odbc_connect=Driver%3Dx;Pwd=***"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),  # nothing to hide: as it was
    ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db"),
])
def test_a_uri_is_shown_with_its_user_and_without_its_password(uri, shown):
    assert redact_uri(uri) == shown


def test_a_command_line_is_recorded_without_its_credentials():
    argv = ["run", "--tracking-uri", "postgresql://u:SECRET@h/d", "--tracking-uri=mysql://r:SECRET@h/d",
            "--password", "SECRET", "--workers", "0,1"]
    recorded = redact_argv(argv)
    assert "SECRET" not in " ".join(recorded)
    assert recorded == ["run", "--tracking-uri", "postgresql://u:***@h/d", "--tracking-uri=mysql://r:***@h/d",
                        "--password", REDACTED, "--workers", "0,1"]


def test_variables_that_look_like_credentials_are_recorded_as_set_without_their_value():
    settings = {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", "PT_HPU_LAZY_MODE": "1", "HLS_MODULE_ID": "3",
                "NCCL_SOCKET_IFNAME": "eth0", "HABANA_VISIBLE_MODULES": "0,1"}
    assert not any(is_secret_name(name) for name in settings)
    assert all(is_secret_name(name) for name in [*TOKENS, "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD",
                                                 "hf_token", "dbPassword"])
    recorded = accelerator_environment({}, {**settings, **TOKENS})
    assert recorded["variables"] == {**settings, **{name: SET_NOT_RECORDED for name in TOKENS}}
    assert redact_environment({"NCCL_IB_HCA": "mlx5"}) == {"NCCL_IB_HCA": "mlx5"}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


@pytest.mark.parametrize("scheme", ["postgresql", "mysql", "http"])
def test_refusing_a_store_never_shows_its_password(scheme, capsys, tmp_path):
    uri = f"{scheme}://u:{PASSWORD}@127.0.0.1:{_closed_port()}" + ("/mlflow" if scheme != "http" else "")
    assert main(["run", "--tracking-uri", uri, "--output", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "u:***@127.0.0.1" in err[0] and PASSWORD not in err[0], err
    assert not (tmp_path / "out").exists()


def test_the_dry_run_with_an_unreachable_database_is_one_line_without_the_password(capsys, tmp_path):
    """It ended in a sqlalchemy traceback, with the URI printed as given."""
    uri = f"postgresql://u:{PASSWORD}@127.0.0.1:{_closed_port()}/mlflow"
    assert main(["run", "--dry-run", "--tracking-uri", uri, "--output", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err and "Traceback" not in out + err
    store = [line for line in out.splitlines() if line.startswith("store: ")]
    assert store == [line for line in store if "postgresql://u:***@127.0.0.1" in line and "would refuse it" in line]
    assert len(store) == 1


@pytest.fixture
def auth_server(tmp_path):
    """MLflow's basic-auth server: user admin, password PASSWORD; an anonymous call is refused (401)."""
    port = free_port()
    workdir = tmp_path / "server"
    workdir.mkdir()
    server = start_mlflow_server(workdir, port, admin_password=PASSWORD)
    yield workdir, f"http://admin:{PASSWORD}@127.0.0.1:{port}", f"http://127.0.0.1:{port}"
    stop_server(server)


def _no_secret_in_files(folder: Path) -> list[str]:
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}: {secret}" for secret in SECRETS if secret.encode() in data]
    return found


def _suite(args, env, cwd):
    done = subprocess.run([sys.executable, "-m", "suite", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.e2e
def test_planted_secrets_reach_no_terminal_no_record_no_store(auth_server, tmp_path):
    workdir, uri, anonymous = auth_server
    check_reachable(uri)  # the health check as MLflow connects: basic authentication, not a host named "admin:..."
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, **TOKENS}
    out = tmp_path / "out"
    shown = []
    code, text = _suite(["run", "--workers", "0", "--steps", "2", "--warmup-steps", "0", "--no-progress", "--report",
                         "--system-metrics-interval", "0", "--tracking-uri", uri, "--output", str(out)], env, tmp_path)
    shown.append(text)
    assert code == 0, text
    assert "tracking_uri: http://admin:***@127.0.0.1" in text
    code, text = _suite(["upload", str(out), "--tracking-uri", uri], env, tmp_path)
    shown.append(text)
    assert code == 0, text
    # the matrix's own store, recorded without its password, cannot be reached again without being given it
    code, text = _suite(["upload", str(out)], env, tmp_path)
    shown.append(text)
    assert code == 2 and "credentials are never recorded: pass --tracking-uri" in text, text
    assert [s for s in SECRETS for text in shown if s in text] == []
    assert (out / "report.html").is_file() and (out / "report.md").is_file()  # the command to reproduce is in both
    assert _no_secret_in_files(out) == [] and _no_secret_in_files(workdir) == []
    # and the store holds the runs: the server took them, with the credentials
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = "admin", PASSWORD
    try:
        client = MlflowClient(tracking_uri=anonymous)
        runs = client.search_runs([client.get_experiment_by_name("bridgetower").experiment_id])
    finally:
        del os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]
    matrix = [r for r in runs if r.data.tags.get("suite.role") == "matrix"]
    assert len(matrix) == 1 and "admin:***@" in matrix[0].data.tags["suite.command"]
