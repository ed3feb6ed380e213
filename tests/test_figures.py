"""The catalogue of figures (suite/figures.py, issue 48): every metric a real run records is declared there, with a
unit and a meaning, its recorded value one its figure can take; `suite metrics --json` lists them; MLflow logs each
under its figure's section and carries the catalogue as an artifact; a value a figure cannot take is refused with the
reason; the facts readers rely on are declared with their types."""

import json
import math

import pytest
from mlflow.tracking import MlflowClient

from suite.cli import main
from suite.figures import CORE, FACTS, Catalogue, Figure, check_value, misfit_fact
from suite.workload import catalogue_of
from suite.tracking.metric_names import mlflow_name, suite_name

from conftest import runs_of

pytestmark = pytest.mark.mechanics


def test_every_metric_a_run_records_is_declared_with_a_unit_and_a_meaning(recorded_matrix):
    catalogue = catalogue_of("bridgetower")
    runs = runs_of(recorded_matrix)
    recorded = {name: value for run in runs for name, value in run["metrics"].items()}
    assert len(recorded) > 40
    undeclared = [name for name in recorded if catalogue.get(name) is None]
    assert undeclared == []
    for name, value in recorded.items():
        figure = catalogue.get(name)
        assert figure.unit is not None and figure.description, name
        assert figure.check(value) is None, (name, value, figure.check(value))


def test_suite_metrics_json_lists_every_figure_and_fact(capsys, recorded_matrix):
    assert main(["metrics", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    names = {f["name"] for f in listing["figures"] if f["pattern"] is None}
    patterns = [f["pattern"] for f in listing["figures"] if f["pattern"]]
    import re

    for run in runs_of(recorded_matrix):
        for name in run["metrics"]:
            assert name in names or any(re.fullmatch(p, name) for p in patterns), name
    assert all(f["unit"] is not None and f["description"] for f in listing["figures"])
    assert {"eval_accuracy", "throughput_samples_per_s", "host_ram_peak_pss_anon_bytes"} <= names
    assert [f["path"] for f in listing["facts"]] == [f.path for f in FACTS]
    assert main(["metrics"]) == 0 and "throughput_samples_per_s" in capsys.readouterr().out


def test_mlflow_logs_every_figure_in_its_section_and_holds_the_catalogue(recorded_matrix):
    uri = f"sqlite:///{recorded_matrix.parent}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("bridgetower").experiment_id
    runs = client.search_runs([experiment])
    [matrix] = [r for r in runs if r.data.tags.get("suite.role") == "matrix"]
    configurations = [r for r in runs if r.data.tags.get("suite.role") == "configuration"]
    plain = {key for r in configurations for key in r.data.metrics if "/" not in key}
    assert plain == {"loss"}  # every other metric in a section (issue 51: some lacked their group)
    local = client.download_artifacts(matrix.info.run_id, "figures.json")
    with open(local) as handle:
        logged = json.load(handle)
    assert logged["workload"] == "bridgetower"
    assert {f["name"] for f in logged["figures"]} >= {"throughput_samples_per_s", "eval_accuracy"}


@pytest.mark.parametrize("name", ["throughput_samples_per_s", "host_cpu_cores_trainer", "eval_accuracy",
                                  "setup_imports_s", "device_reserved_peak_bytes", "memory_growth_bytes_per_step"])
def test_a_name_goes_to_mlflow_and_back(name):
    catalogue = catalogue_of("bridgetower")
    key = mlflow_name(name, catalogue)
    assert "/" in key and suite_name(key, catalogue) == name
    assert suite_name(name, catalogue) == name  # a run logged before its figure had a section


@pytest.mark.parametrize("name,value,reason", [
    ("throughput_samples_per_s", 0.0, "0 is not above 0 samples/s"),
    ("throughput_samples_per_s", math.nan, "nan is not a finite number"),
    ("data_wait_fraction", 1.5, "1.5 is above 1"),
    ("measured_steps", 2.5, "2.5 is not a whole number"),
    ("host_ram_peak_rss_bytes", -1.0, "-1 is below 0 B"),
    ("memory_growth_bytes_per_step", -5e6, None),  # a shrinking series: any finite number
    ("a_metric_nobody_declared", math.inf, "inf is not a finite number"),
    ("a_metric_nobody_declared", -3.0, None),
    ("eval_accuracy", True, "True is not a number"),
])
def test_a_value_its_figure_cannot_take_is_refused_with_the_reason(name, value, reason):
    assert check_value(name, value) == reason


def test_a_workloads_figure_takes_its_familys_place_and_is_declared_once():
    precise = Figure("eval_accuracy", "1", "mean recall@1", "quality", 0.0, 1.0)
    catalogue = Catalogue([precise])
    assert catalogue.get("eval_accuracy") is precise and CORE.get("eval_accuracy").maximum == math.inf
    assert catalogue.check("eval_accuracy", 1.5) == "1.5 is above 1"
    with pytest.raises(ValueError, match="declared twice"):
        Catalogue([precise, Figure("eval_accuracy", "%", "other", "quality")])


def test_the_facts_readers_look_into_are_typed():
    assert misfit_fact({"contention": {"contended": True, "others_share": 0.2}, "step_times_s": [0.1, 0.2]}) is None
    assert misfit_fact({"contention": []}) == "facts.contention is an array, not object"
    assert misfit_fact({"step_times_s": [0.1, "slow"]}) == "facts.step_times_s[1] is 'slow', not a finite number"
    assert misfit_fact({"batch_size_used": None}) is None  # a run that failed before it knew it
