"""Issue 30, point 1: our ruleset (suite/results/mlperf_rules/common.yaml, chaining the workload's own
workloads/bridgetower/mlperf_rules/, MLCommons' format) through MLCommons' own
command line, on logs of real runs: the README's command as printed, from another directory; and each rule shown to
bite by a log edited the way a wrong run or a hand edit would be."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_file, runs_of

from suite.cli import main
from suite.results.mlperf_log import RULESET, check_compliance

from workloads.bridgetower.presets import LARGE, PUBLISHED_RECIPE

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--workers", "0", "--warmup-steps", "1", "--system-metrics-interval", "0", "--no-progress"]


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """Three real runs: time-to-train (a target over 16 evaluated pairs, evaluated every 2 steps), throughput, and one
    that missed its target (FAILED, its log aborted with the reason)."""
    tmp = tmp_path_factory.mktemp("rules")
    uri = f"sqlite:///{tmp}/mlflow.db"
    paths = {}
    for name, extra in (("time_to_train", ["--target-quality", "0.05", "--eval-every", "2", "--max-steps", "200",
                                           "--eval-samples", "16", "--steps", "4"]),
                        ("throughput", ["--steps", "3"]),
                        ("missed", ["--target-quality", "0.99", "--eval-every", "2", "--max-steps", "5",
                                    "--eval-samples", "16", "--steps", "4"])):
        code = main(["run", *COMMON, *extra, "--output", str(tmp / name), "--tracking-uri", uri])
        [run] = runs_of(tmp / name)
        assert (code, run["status"]) == ((1, "FAILED") if name == "missed" else (0, "FINISHED")), run["reason"]
        paths[name] = run_file(tmp / name, run, "mlperf.log")
    return paths


def _readme_command() -> str:
    """The checker command exactly as the README prints it (one line in a code block)."""
    [line] = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()
              if line.strip().startswith("python -m mlperf_logging.compliance_checker")]
    return line


def _run_as_printed(log: Path, cwd: Path) -> subprocess.CompletedProcess:
    command = _readme_command().replace("RESULTS/runs/<id>/", f"{log.parent}/")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_readme_command_passes_a_time_to_train_run_from_any_directory(logs, tmp_path):
    proc = _run_as_printed(logs["time_to_train"], tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "SUCCESS" in output, output
    assert "open_bridgetower.yaml" in output  # the benchmark's file was chained
    assert '"status": "success"' in logs["time_to_train"].read_text()
    # the checker's own log goes beside the run's, not into whatever directory the user stood in (issue 51.10)
    assert list(tmp_path.iterdir()) == [] and (logs["time_to_train"].parent / "compliance_checker.log").is_file()


def test_a_throughput_run_is_compliant_and_never_a_success(logs, tmp_path):
    text = logs["throughput"].read_text()
    assert '"success"' not in text and '"status": "aborted"' in text
    assert '"key": "quality_target", "value": null' in text
    proc = _run_as_printed(logs["throughput"], tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_a_run_that_missed_its_target_is_compliant_and_says_why(logs, tmp_path):
    [stop] = [json.loads(line.split(" ", 1)[1]) for line in logs["missed"].read_text().splitlines()
              if '"key": "run_stop"' in line]
    assert stop["metadata"]["status"] == "aborted" and "not reached" in stop["metadata"]["reason"]
    proc = _run_as_printed(logs["missed"], tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_suite_mlperf_rules_path_prints_the_shipped_entry_file(capsys):
    assert main(["mlperf", "rules-path"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.is_absolute() and printed == RULESET.resolve() and printed.is_file()
    assert {p.name for p in printed.parent.glob("*.yaml")} == {"common.yaml"}  # the suite's: no workload's
    import workloads.bridgetower

    rules = Path(workloads.bridgetower.__file__).parent / "mlperf_rules"  # the workload's own, which common chains
    assert {p.name for p in rules.glob("*.yaml")} == {"open_bridgetower.yaml", "closed_bridgetower.yaml"}


# --- each rule bites: real logs, edited ----------------------------------------------------------------------
def _edit(source: Path, target: Path, change) -> Path:
    """``source`` with each event passed through ``change`` (returns the event, a list of events, or None)."""
    lines = []
    for line in source.read_text().splitlines():
        event = json.loads(line.split(" ", 1)[1])
        out = change(event)
        for e in (out if isinstance(out, list) else [out] if out is not None else []):
            lines.append(":::MLLOG " + json.dumps(e))
    target.write_text("\n".join(lines) + "\n")
    return target


def _set(key, value=None, metadata=None):
    def change(event):
        if event["key"] == key:
            if value is not None:
                event["value"] = value
            if metadata is not None:
                event["metadata"] = {**event["metadata"], **metadata}
        return event
    return change


def _drop(key):
    return lambda event: None if event["key"] == key else event


def _accuracy_after_its_evaluation():
    held = []

    def change(event):
        if event["key"] == "eval_accuracy" and not held:
            held.append(event)
            return None
        if event["key"] == "eval_stop" and held and len(held) == 1:
            held.append(True)
            return [event, held[0]]
        return event
    return change


EDITS = {
    # a success whose declared target no evaluation reached
    "target not reached": ("time_to_train", _set("quality_target", 0.99), "first_reach"),
    # a success claimed by a run that declared no target
    "throughput claimed as success": ("throughput", _set("run_stop", metadata={"status": "success"}), "first_reach"),
    # evaluations off the logged cadence
    "cadence": ("missed", _set("eval_frequency_steps", 3), "off_cadence"),  # evaluated after 2 and 4 measured steps
    # the schedule decays over another number of steps than the cap
    "decay steps": ("time_to_train", _set("opt_learning_rate_decay_steps", 7), "decay_steps"),
    # a required optimizer hyperparameter missing
    "beta 2 missing": ("time_to_train", _drop("opt_adamw_beta_2"), "opt_adamw_beta_2"),
    # an eval_accuracy outside its evaluation (the benchmark file takes eval_accuracy over: END still judges order)
    "accuracy outside evaluation": ("time_to_train", _accuracy_after_its_evaluation(), "accuracy_outside_eval"),
    # an aborted run must say why
    "aborted without reason": ("throughput", _set("run_stop", metadata={"reason": ""}), "reason"),
    # closed: the published recipe (batch 48 x 8, seed 42, bf16...), which a tiny CPU run is not
    "closed division": ("throughput", _set("submission_division", "closed"), "== 384"),
    # no throughput, no measured block, a status MLPerf does not know
    "no throughput": ("throughput", _drop("throughput"), "throughput"),
    "no measured block": ("throughput", lambda e: None if e["key"] in ("block_start", "block_stop") else e,
                          "block_start"),
    "unknown status": ("throughput", _set("run_stop", metadata={"status": "done"}), "run_stop"),
    # a benchmark the ruleset does not know: refused, no crash looking for its file
    "unknown benchmark": ("throughput", _set("submission_benchmark", "resnet"), "submission_benchmark"),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_each_rule_fails_a_log_edited_against_it(logs, tmp_path, name):
    which, change, message = EDITS[name]
    edited = _edit(logs[which], tmp_path / "mlperf.log", change)
    passed, output = check_compliance(edited)
    assert not passed, output
    assert message in output and "Traceback" not in output, output
    passed, output = check_compliance(_edit(logs[which], tmp_path / "unchanged.log", lambda event: event))
    assert passed, output  # the round trip itself changes nothing


def test_the_closed_rules_are_the_published_recipe():
    """closed_bridgetower.yaml's values against the workload's PUBLISHED_RECIPE and the large preset."""
    rules = yaml.safe_load((ROOT / "workloads" / "bridgetower" / "mlperf_rules" / "closed_bridgetower.yaml").read_text())
    checks = {r["KEY"]["NAME"]: r["KEY"]["CHECK"] for r in rules if "KEY" in r}

    def value(key):
        return ast.literal_eval(re.fullmatch(r"\s*v\[.value.\] == (.+?)\s*", checks[key]).group(1))

    assert value("global_batch_size") == PUBLISHED_RECIPE["batch_size"] * PUBLISHED_RECIPE["nproc_per_node"]
    assert value("micro_batch_size") == PUBLISHED_RECIPE["batch_size"]
    assert value("seed") == PUBLISHED_RECIPE["seed"]
    assert value("suite_warmup_steps") == PUBLISHED_RECIPE["warmup_steps"]
    assert value("opt_base_learning_rate") == LARGE.learning_rate
    assert PUBLISHED_RECIPE["precision"] == "bf16" and value("lowest_numerical_precision_in_linear") == "bfloat16"
