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
