"""Issue 30, point 5: `suite score`, MLPerf's scoring of time-to-train runs and its RCP check. The arithmetic is
checked against MLCommons' own functions (mlperf-logging's result summarizer and RCP checker); the command on real
runs, from results folders and from MLflow, with a full set, too few runs and a partial set of logs."""

import dataclasses
import random
import statistics

import pytest
from mlperf_logging.rcp_checker.rcp_checker import RCP_Checker
from mlperf_logging.result_summarizer.result_summarizer import _compute_olympic_average

from suite.analysis.time_to_train import (
    REQUIRED_RUNS,
    RunScore,
    olympic_mean,
    rcp_of,
    score_runs,
    steps_band,
)
from suite.cli import main

from conftest import run_file, runs_of

#: MLPerf's score and the RCP check over recorded logs: the suite's machinery, whatever transformers line trained
#: the runs (the reference bands per line are tests/test_quality.py's)
pytestmark = pytest.mark.mechanics


# --- the arithmetic, against MLCommons' code ------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(20))
def test_the_olympic_average_is_the_result_summarizers(seed):
    rng = random.Random(seed)
    values = [rng.uniform(1, 100) for _ in range(rng.randint(3, 12))]
    for dropped in (0, 1):
        assert olympic_mean(values, dropped_already=dropped) == pytest.approx(
            _compute_olympic_average(list(values), dropped, 1))


@pytest.mark.parametrize("seed", range(10))
def test_the_smallest_acceptable_mean_is_the_rcp_checkers(seed):
    rng = random.Random(seed)
    steps = [float(rng.randint(100, 900)) for _ in range(rng.randint(5, 20))]
    ours = rcp_of(steps, "test")
    checker = object.__new__(RCP_Checker)  # its constructor needs a benchmark of MLPerf's own tables
    checker.alpha, checker.tolerance, checker.submission_runs = 0.05, 0.0001, REQUIRED_RUNS
    ordered = sorted(steps)
    mean = statistics.fmean(ordered[1:-1])
    theirs = checker._find_min_acceptable_mean(mean, statistics.pstdev(steps), len(steps) - 2)
    assert ours.mean == pytest.approx(mean) and ours.min_acceptable_mean == pytest.approx(theirs, abs=1e-3)


def _runs(minutes, steps, converged=None):
    converged = converged or [True] * len(minutes)
    return [RunScore(f"run{i}", i, ok, m, s if ok else None) for i, (m, s, ok) in
            enumerate(zip(minutes, steps, converged))]


def test_five_runs_score_and_fewer_do_not():
    score = score_runs(_runs([5.0, 1.0, 3.0, 2.0, 4.0], [500] * 5), None)
    assert score.minutes == pytest.approx(3.0) and not score.problems  # 1 and 5 dropped
    assert score.rcp_verdict.startswith("NOT CHECKED")
    short = score_runs(_runs([1.0, 2.0, 3.0, 4.0], [500] * 4), None)
    assert short.minutes is None and short.problems == ("4 scorable run(s) of the 5 the rules require",)


def test_runs_of_one_seed_are_not_five_runs():
    """Issue 49: five re-runs of seed 42 (distinct records, one seed) were scored as "olympic average of 5 runs".
    MLPerf's runs each have their own seed."""
    runs = [dataclasses.replace(run, seed=42) for run in _runs([5.0, 1.0, 3.0, 2.0, 4.0], [500] * 5)]
    score = score_runs(runs, None)
    assert score.minutes is None and score.problems == ("5 runs share seed(s) 42: MLPerf scores runs of distinct "
                                                         "seeds",)
    two = score_runs([*_runs([5.0, 1.0, 3.0, 2.0], [500] * 4), dataclasses.replace(_runs([4.0], [500])[0], seed=3)],
                     None)
    assert two.minutes is None and two.problems[0].startswith("2 runs share seed(s) 3")


def test_one_run_may_miss_the_target_two_may_not():
    one = score_runs(_runs([1.0, 2.0, 3.0, 4.0, 9.0], [500] * 5, [True, True, True, True, False]), None)
    assert one.minutes == pytest.approx(3.0)  # the fastest dropped; the missed run is the slowest dropped
    two = score_runs(_runs([1.0, 2.0, 3.0, 9.0, 9.0], [500] * 5, [True, True, True, False, False]), None)
    assert two.minutes is None and "2 run(s) did not reach the target" in two.problems[0]


def test_the_rcp_check_fails_fast_convergence_and_scales_a_faster_mean():
    rcp = rcp_of([400, 450, 500, 500, 550, 600, 600, 650], "test")
    slow = score_runs(_runs([1.0] * 5, [600] * 5), rcp)
    assert slow.rcp_verdict == "PASS" and slow.normalization == 1.0 and slow.minutes == pytest.approx(1.0)
    faster = (rcp.mean + rcp.min_acceptable_mean) / 2
    scaled = score_runs(_runs([1.0] * 5, [faster] * 5), rcp)
    assert scaled.rcp_verdict.startswith("PASS: faster") and scaled.minutes == pytest.approx(rcp.mean / faster)
    too_fast = score_runs(_runs([1.0] * 5, [rcp.min_acceptable_mean - 20] * 5), rcp)
    assert too_fast.rcp_verdict.startswith("FAIL") and too_fast.minutes is None


def test_the_band_is_a_95_percent_prediction_interval():
    """Drawn from the reference's own distribution, about 5 % of new runs fall outside the band."""
    rng = random.Random(7)
    outside = 0
    trials = 4000
    for _ in range(trials):
        reference = [rng.gauss(500, 60) for _ in range(8)]
        low, high = steps_band(rcp_of(reference, "t"))
        outside += not low <= rng.gauss(500, 60) <= high
    assert 0.035 < outside / trials < 0.065


# --- the command, on real runs ----------------------------------------------------------------------------------
TIME_TO_TRAIN = ["--workers", "0", "--warmup-steps", "1", "--steps", "4", "--target-quality", "0.05",
                 "--eval-every", "2", "--max-steps", "200", "--eval-samples", "16", "--system-metrics-interval", "0",
                 "--no-progress"]


@pytest.fixture(scope="module")
def five(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("score")
    uri = f"sqlite:///{tmp}/mlflow.db"
    folders = []
    for seed in range(1, 6):
        folder = tmp / f"seed{seed}"
        assert main(["run", *TIME_TO_TRAIN, "--seed", str(seed), "--output", str(folder), "--tracking-uri", uri]) == 0
        folders.append(folder)
    return folders, uri


def test_suite_score_scores_five_runs_and_refuses_four_with_one_line(five, capsys):
    folders, _ = five
    assert main(["score", *map(str, folders)]) == 0
    out = capsys.readouterr().out
    assert "5 time-to-train run(s)" in out and "score:" in out
    assert "RCP check: NOT CHECKED" in out  # the reference is for another configuration, and it says which
    for seed in range(1, 6):
        assert f"seed {seed}: " in out
    assert main(["score", *map(str, folders[:4])]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "4 scorable run(s) of the 5 the rules require" in captured.err


def test_a_partial_set_of_logs_gives_per_run_figures_and_says_what_is_missing(five, tmp_path, capsys):
    import shutil

    folders, _ = five
    copy = tmp_path / "seed5"
    shutil.copytree(folders[4], copy)
    [run] = runs_of(copy)
    run_file(copy, run, "mlperf.log").unlink()
    assert main(["score", *map(str, folders[:4]), str(copy)]) == 2
    captured = capsys.readouterr()
    assert "seed 5: not scored (no mlperf.log at" in captured.out
    assert captured.out.count(" min, ") == 4  # the four others keep their figures
    assert "no mlperf.log" in captured.err and "4 scorable run(s) of the 5" in captured.err


def test_suite_score_reads_mlflow_runs_like_folders(five, capsys):
    folders, uri = five
    assert main(["score", *map(str, folders), "--json"]) == 0
    from_folders = capsys.readouterr().out
    run_ids = [runs_of(folder)[0]["mlflow_run_id"] for folder in folders]
    assert main(["score", *run_ids, "--tracking-uri", uri, "--json"]) == 0
    import json

    [a], [b] = json.loads(from_folders), json.loads(capsys.readouterr().out)
    assert a["minutes"] == pytest.approx(b["minutes"]) and a["rcp_verdict"] == b["rcp_verdict"]
    assert sorted(r["seed"] for r in b["runs"]) == [1, 2, 3, 4, 5]


def test_throughput_runs_are_not_scored(tmp_path):
    from suite.errors import SuiteError

    assert main(["run", "--workers", "0", "--steps", "2", "--warmup-steps", "1", "--system-metrics-interval", "0",
                 "--no-progress", "--output", str(tmp_path / "out"), "--tracking-uri",
                 f"sqlite:///{tmp_path}/m.db"]) == 0
    with pytest.raises(SuiteError, match="is a time-to-train run"):
        from suite.cli.score import cmd_score
        import argparse

        cmd_score(argparse.Namespace(results=[str(tmp_path / "out")], reference="tiny_quality_reference",
                                     json=False, tracking_uri=None), [])
