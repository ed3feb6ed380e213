"""Engine hf-trainer: transformers' Trainer runs the configuration, the suite's accounting times it."""

import json

import pytest
from mlflow.tracking import MlflowClient

from suite.cli import main
from suite.config import MatrixSpec
from suite.errors import ConfigError
from suite.tracking.metric_names import suite_metrics

from conftest import run_file, runs_of

pytestmark = pytest.mark.e2e


def test_both_engines_run_side_by_side_with_the_trainers_own_figure(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/m.db"
    code = main(["run", "--engine", "suite,hf-trainer", "--workers", "0", "--steps", "3", "--warmup-steps", "1",
                 "--output", str(tmp_path / "out"), "--tracking-uri", uri, "--no-progress"])
    assert code == 0
    # issue 47 (10): accelerate's one-batch prefetch shifts hf-trainer's per-step data wait: said where it is shown
    assert "per-step waits are shifted by one step" in capsys.readouterr().out
    suite_run, trainer_run = runs_of(tmp_path / "out")
    assert suite_run["config"]["engine"] == "suite" and trainer_run["config"]["engine"] == "hf-trainer"
    for run in (suite_run, trainer_run):
        assert run["status"] == "FINISHED" and len(run["losses"]) == 4
        assert run["metrics"]["measured_steps"] == 3 and run["metrics"]["throughput_samples_per_s"] > 0
    m = trainer_run["metrics"]
    assert m["trainer_train_samples_per_second"] > 0 and m["trainer_train_runtime"] > 0
    assert "trainer_train_samples_per_second" not in suite_run["metrics"]
    assert trainer_run["facts"]["workload"]["trainer"] == "transformers.trainer.Trainer"
    assert "shifted by one step" in trainer_run["facts"]["engine"]
    assert trainer_run["facts"]["workload"]["optimizer"].startswith("AdamW")
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs(client.search_experiments()[0].experiment_id, "tags.`suite.role` = 'configuration'")
    engines = {r.data.params["engine"]: suite_metrics(r.data.metrics) for r in runs}
    assert set(engines) == {"suite", "hf-trainer"}
    assert "trainer_train_samples_per_second" in engines["hf-trainer"]
    # what ran, observed: the trainer's own DataLoader and the reference pipeline that made its batches
    facts = trainer_run["facts"]
    assert (facts["loader_used"], facts["num_workers_used"], facts["prefetch_factor_used"]) == ("cpu", 0, None)
    from suite.results.mlperf_log import check_stock_common

    for run in (suite_run, trainer_run):  # MLCommons' stock common.yaml, for both engines (issue 13)
        stock = check_stock_common(run_file(tmp_path / "out", run, "mlperf.log"))
        assert stock.passed, stock.problems
        assert run["metrics"]["eval_samples"] > 0 and 0 <= run["metrics"]["eval_accuracy"] <= 1
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "out"), "--json"]) == 0  # issue 18, defect 1: two engines, two rows
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["config"]["engine"] for r in rows) == ["hf-trainer", "suite"]


def test_hf_trainer_with_an_unsupported_loader_fails_with_the_reason(tmp_path):
    code = main(["run", "--engine", "hf-trainer", "--loader", "device", "--workers", "0", "--steps", "1",
                 "--warmup-steps", "0", "--output", str(tmp_path / "out"), "--tracking-uri",
                 f"sqlite:///{tmp_path}/m.db", "--no-progress"])
    assert code == 1
    (run,) = runs_of(tmp_path / "out")
    assert run["status"] == "FAILED"
    assert run["reason"] == "engine hf-trainer runs the published method's loader only (cpu), not 'device'"


def test_engine_is_a_validated_matrix_axis():
    configs = MatrixSpec(workload="w", preset="p", workers=(0,), engines=("suite", "hf-trainer")).expand()
    assert [c.engine for c in configs] == ["suite", "hf-trainer"]
    assert configs[0].config_id.startswith("w-p-cpu-nw0-cpu-fp32-suite-")
    assert configs[1].config_id.startswith("w-p-cpu-nw0-cpu-fp32-hf-trainer-")
    with pytest.raises(ConfigError, match="engine must be one of suite, hf-trainer"):
        MatrixSpec(workload="w", preset="p", engines=("keras",)).expand()


def test_the_precision_each_engine_ran_is_read_inside_the_forward_pass(tmp_path):
    """Issue 48 (2): `precision_used` is observed, never the request copied. accelerate enters bf16 autocast inside the
    model's forward (it wraps forward itself), after the model's own pre-hooks: read there, the trainer's bf16 run
    looked like fp32. It is read where the layers run, for both engines."""
    code = main(["run", "--engine", "suite,hf-trainer", "--precision", "bf16,fp32", "--workers", "0", "--steps", "1",
                 "--warmup-steps", "0", "--output", str(tmp_path / "out"), "--tracking-uri",
                 f"sqlite:///{tmp_path}/m.db", "--no-progress", "--no-report", "--system-metrics-interval", "0"])
    assert code == 0
    ran = {(r["config"]["engine"], r["config"]["precision"]): r["facts"]["precision_used"]
           for r in runs_of(tmp_path / "out")}
    assert ran == {("suite", "bf16"): "bf16", ("suite", "fp32"): "fp32", ("hf-trainer", "bf16"): "bf16",
                   ("hf-trainer", "fp32"): "fp32"}, ran
    for run in runs_of(tmp_path / "out"):  # the manifest keeps both, the request and what ran
        manifest = json.loads(run_file(tmp_path / "out", run, "manifest.json").read_text())
        assert manifest["precision"] == {"requested": run["config"]["precision"],
                                         "ran": run["facts"]["precision_used"]}
