"""Engine hf-trainer: transformers' Trainer runs the configuration, the suite's accounting times it."""

import json

import pytest
from mlflow.tracking import MlflowClient

from suite.cli import main
from suite.config import MatrixSpec
from suite.errors import ConfigError

pytestmark = pytest.mark.e2e


def test_both_engines_run_side_by_side_with_the_trainers_own_figure(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    code = main(["run", "--engine", "suite,hf-trainer", "--workers", "0", "--steps", "3", "--warmup-steps", "1",
                 "--output", str(tmp_path / "out"), "--tracking-uri", uri, "--no-progress"])
    assert code == 0
    suite_run, trainer_run = json.loads((tmp_path / "out" / "results.json").read_text())
    assert suite_run["config"]["engine"] == "suite" and trainer_run["config"]["engine"] == "hf-trainer"
    for run in (suite_run, trainer_run):
        assert run["status"] == "FINISHED" and len(run["losses"]) == 4
        assert run["metrics"]["measured_steps"] == 3 and run["metrics"]["throughput_samples_per_s"] > 0
    m = trainer_run["metrics"]
    assert m["trainer_train_samples_per_second"] > 0 and m["trainer_train_runtime"] > 0
    assert "trainer_train_samples_per_second" not in suite_run["metrics"]
    assert trainer_run["facts"]["workload"]["trainer"] == "transformers.trainer.Trainer"
    assert trainer_run["facts"]["workload"]["optimizer"].startswith("AdamW")
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs(client.search_experiments()[0].experiment_id, "tags.`suite.role` = 'configuration'")
    engines = {r.data.params["engine"]: r.data.metrics for r in runs}
    assert set(engines) == {"suite", "hf-trainer"}
    assert "trainer_train_samples_per_second" in engines["hf-trainer"]


def test_hf_trainer_with_an_unsupported_loader_fails_with_the_reason(tmp_path):
    code = main(["run", "--engine", "hf-trainer", "--loader", "device", "--workers", "0", "--steps", "1",
                 "--warmup-steps", "0", "--output", str(tmp_path / "out"), "--tracking-uri",
                 f"sqlite:///{tmp_path}/m.db", "--no-progress"])
    assert code == 1
    (run,) = json.loads((tmp_path / "out" / "results.json").read_text())
    assert run["status"] == "FAILED"
    assert run["reason"] == "engine hf-trainer runs the published method's loader only (cpu), not 'device'"


def test_engine_is_a_validated_matrix_axis():
    configs = MatrixSpec(workload="w", preset="p", workers=(0,), engines=("suite", "hf-trainer")).expand()
    assert [c.config_id for c in configs] == ["w-p-cpu-nw0-cpu-fp32", "w-p-cpu-nw0-cpu-fp32-hf-trainer"]
    with pytest.raises(ConfigError, match="engine must be one of suite, hf-trainer"):
        MatrixSpec(workload="w", preset="p", engines=("keras",)).expand()
