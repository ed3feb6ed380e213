"""pytest-benchmark runs of the default CPU matrix (tiny BridgeTower, synthetic data).

    pytest benchmarks --benchmark-json out.json
    pytest benchmarks --benchmark-autosave            # then, later:
    pytest benchmarks --benchmark-compare --benchmark-compare-fail=median:10%

Each benchmark round is one training step; `--suite-steps` / `--suite-warmup-steps` set the rounds.
Outside the unit-test run (testpaths = tests).
"""

import pytest


@pytest.mark.parametrize("workers", [0, 1, 2], ids=lambda n: f"workers-{n}")
def test_bridgetower_tiny_cpu(suite_benchmark, workers):
    result = suite_benchmark(workload="bridgetower", preset="tiny", device="cpu", num_workers=workers, loader="cpu",
                             precision="fp32")
    assert result.status == "FINISHED"
    assert result.metrics["throughput_samples_per_s"] > 0


def test_default_matrix_set_up_and_wall_time(benchmark, tmp_path):
    """The default matrix through `suite run` once: its wall time (the benchmark's figure, which
    `--benchmark-compare-fail` gates), the share inside warm-up + measured windows (goal >= 0.6; 0.31-0.35 on the
    2-core CI machine, 2026-12-06) and each configuration's first-step latency (goal <= 3 s after the first
    configuration), both recorded in the benchmark's extra_info, never asserted: a slow or busy host is not a
    failure of the code, a regression against a saved run is."""
    import json

    from suite.cli import main

    def run() -> int:
        return main(["run", "--no-progress", "--no-report", "--output", str(tmp_path / "out"),
                     "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"])

    assert benchmark.pedantic(run, rounds=1, iterations=1) == 0
    timing = json.loads((tmp_path / "out" / "matrix.json").read_text())["timing"]
    runs = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    firsts = [r["metrics"]["setup_first_step_s"] for r in runs]
    benchmark.extra_info.update(timing, in_window_goal=0.6, first_step_s=firsts, first_step_goal_s=3.0,
                                first_step_goal_met=max(firsts[1:], default=0.0) <= 3.0)
