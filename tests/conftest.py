import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory):
    """Synthetic data goes to a per-session cache, never the user's ~/.cache. And `suite run` writes its end-of-run
    report only where a test asks for it (--report; the report's tests do): ~3 s per matrix otherwise."""
    cache = os.environ.get("SUITE_TEST_CACHE_DIR") or str(tmp_path_factory.mktemp("suite-cache"))
    saved = {name: os.environ.get(name) for name in ("SUITE_CACHE_DIR", "SUITE_REPORT")}
    os.environ["SUITE_CACHE_DIR"] = cache
    os.environ["SUITE_REPORT"] = "0"
    yield Path(cache)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def test_plugins(monkeypatch):
    """Make the stand-in plugins of tests/plugins visible here and in spawned run processes."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    import importlib

    importlib.invalidate_caches()
    yield
    sys.modules.pop("suite_test_plugins", None)


def require(module: str):
    """A library the test extra or tox env installs: missing is a failure in CI, a skip elsewhere."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{module} not installed ({exc})")


def cpu_adapter():
    """The CPU device adapter, set up."""
    from suite.devices.cpu import CPUAdapter

    device = CPUAdapter()
    device.setup()
    return device


def runs_of(folder):
    """The run records of a results folder's results.json (schema 2: {"schema_version", "matrix_uid", "runs"})."""
    import json

    data = json.loads((Path(folder) / "results.json").read_text())
    assert data["schema_version"] == 2
    return data["runs"]


def run_file(folder, run, name):
    """A file of one run, found as every reader finds it: relative to the results folder."""
    return Path(folder) / run["facts"]["run_dir"] / name


def run_configuration_process(tmp_path, config):
    """Run ``config`` (a RunConfig) through the configuration process alone (no runner), as a user running
    `python -m suite.run.process --run-folder DIR` by hand does; its result.json."""
    import json

    folder = Path(tmp_path) / "direct" / "runs" / "run"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    subprocess.run([sys.executable, "-m", "suite.run.process", "--run-folder", str(folder)], check=True,
                   capture_output=True)
    return json.loads((folder / "result.json").read_text())


# --- a recorded matrix, shared by the tests that only read it (each copies it before changing anything) ---------
@pytest.fixture(scope="session")
def recorded_matrix(tmp_path_factory, isolated_cache):
    """A real results folder of two configurations (workers 0 and 1, 4 measured steps after 1 warm-up) with its
    report, recorded once per session into its own sqlite store. Read it, or ``shutil.copytree`` it and change the
    copy: never change it in place."""
    from suite.cli import main

    root = tmp_path_factory.mktemp("recorded-matrix")
    assert main(["run", "--workers", "0,1", "--steps", "4", "--warmup-steps", "1", "--no-progress", "--report",
                 "--system-metrics-interval", "0", "--output", str(root / "matrix"),
                 "--tracking-uri", f"sqlite:///{root}/mlflow.db"]) == 0
    return root / "matrix"


# --- a real MLflow tracking server (test_tracking_server.py, test_scale_out.py) ----------------------------
MLFLOW = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or "mlflow"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mlflow_server(workdir: Path, port: int, backend_uri: str | None = None, admin_password: str | None = None
                        ) -> subprocess.Popen:
    """`mlflow server` on 127.0.0.1:port (its own process group) over ``backend_uri`` (default: a sqlite file in
    ``workdir``), artifacts served from ``workdir``; waits for /health. With ``admin_password``, MLflow's own
    basic-auth app (``--app-name basic-auth``, user ``admin``): every API call without those credentials is refused."""
    auth, env = [], dict(os.environ)
    if admin_password is not None:
        auth = ["--app-name", "basic-auth"]
        env.update(MLFLOW_AUTH_ADMIN_PASSWORD=admin_password, MLFLOW_FLASK_SERVER_SECRET_KEY="suite-tests")
    proc = subprocess.Popen([MLFLOW, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", backend_uri or f"sqlite:///{workdir}/server.db",
                             "--artifacts-destination", str(workdir / "artifacts"), *auth],
                            cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=env)
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    stop_server(proc)
    raise AssertionError("mlflow server did not answer /health within 90 s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)  # the server and its worker processes
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def _postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


@pytest.fixture
def postgres_server(tmp_path):
    """A PostgreSQL server of its own on 127.0.0.1 (Debian's postgresql; .ci/run installs it), a database
    ``mlflow`` in it: ``(its URI, its data folder)``. As root, the cluster belongs to the ``postgres`` user."""
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
        yield f"postgresql://postgres@127.0.0.1:{port}/mlflow", data
    finally:
        subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
                       capture_output=True, timeout=120)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def postgres(postgres_server):
    """The URI of :func:`postgres_server`."""
    return postgres_server[0]
