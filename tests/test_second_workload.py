"""Issue 48 (4): the boundary holds. A second workload (tests/plugins: a line fitted by SGD, no published reference)
runs through run, report, compare, audit, export and score with nothing in suite/ changed for it, and its matrix is
never set beside another workload's published figures."""

import json
import subprocess
import sys

import pytest

from suite.cli import main

from conftest import runs_of

pytestmark = [pytest.mark.mechanics, pytest.mark.e2e]


@pytest.fixture
def regression_matrix(tmp_path, test_plugins):
    out = tmp_path / "out"
    code = main(["run", "--workload", "regression", "--workers", "0,1", "--steps", "6", "--warmup-steps", "1",
                 "--no-progress", "--report", "--system-metrics-interval", "0", "--output", str(out),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    assert code == 0
    return out


def test_a_second_workload_runs_through_every_command(regression_matrix, tmp_path, capsys):
    out = regression_matrix
    runs = runs_of(out)
    assert [r["status"] for r in runs] == ["FINISHED", "FINISHED"]
    assert {r["config"]["workload"] for r in runs} == {"regression"}
    assert all(0 <= r["metrics"]["eval_accuracy"] <= 1 and r["metrics"]["throughput_samples_per_s"] > 0 for r in runs)
    page = (out / "report.md").read_text()
    assert "regression" in page and "Published" not in page  # no reference of its own: no published section
    capsys.readouterr()

    assert main(["compare", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["config"]["num_workers"] for r in rows) == [0, 1]
    assert main(["audit", "--no-rerun", str(out), "--output", str(tmp_path / "audit"), "--no-progress",
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) in (0, 3)
    checks = json.loads((tmp_path / "audit" / "audit.json").read_text())["checks"]
    assert not [c for c in checks if c["verdict"] == "FAIL"], checks
    assert main(["export", str(out), "--output", str(tmp_path / "export")]) == 0
    import pandas as pd

    table = pd.read_parquet(tmp_path / "export" / "runs.parquet")
    assert set(table["config.workload"]) == {"regression"} and "eval_accuracy" in table.columns
    capsys.readouterr()
    assert main(["score", str(out)]) == 2  # throughput runs: nothing to score, said in one line
    assert "nothing to score" in capsys.readouterr().err
    assert main(["metrics", "--workload", "regression", "--json"]) == 0
    figures = {f["name"]: f for f in json.loads(capsys.readouterr().out)["figures"]}
    assert figures["eval_accuracy"]["description"] == "share of held-out points predicted within 0.1"


def test_its_matrix_is_never_set_beside_another_workloads_published_figures(regression_matrix, capsys):
    out = regression_matrix
    capsys.readouterr()
    assert main(["compare", str(out), "--reference", "bridgetower_hf_blog_2023"]) == 2
    err = capsys.readouterr().err
    assert "publishes figures of workload 'bridgetower', and these runs are of 'regression': not set side by " \
           "side" in err
    assert main(["report", str(out), "--reference", "bridgetower_hf_blog_2023"]) == 0
    page = (out / "report.md").read_text()
    assert "not set side by side" in page and "Gaudi2" not in page


def test_its_time_to_train_runs_need_a_quality_reference_of_its_own(tmp_path, test_plugins, capsys):
    out = tmp_path / "ttt"
    assert main(["run", "--workload", "regression", "--workers", "0", "--steps", "5", "--warmup-steps", "1",
                 "--target-quality", "0.5", "--eval-every", "5", "--max-steps", "200", "--no-progress",
                 "--system-metrics-interval", "0", "--output", str(out),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) in (0, 1)
    capsys.readouterr()
    assert main(["score", str(out)]) == 2
    assert "workload 'regression' publishes no quality reference (RCP): give --reference" in capsys.readouterr().err


def test_suite_list_names_it_beside_the_shipped_one(test_plugins):
    done = subprocess.run([sys.executable, "-m", "suite", "list"], capture_output=True, text=True, timeout=300)
    assert "regression/tiny" in done.stdout and "bridgetower/tiny (default)" in done.stdout
