"""The pytest-benchmark plugin: the repository's benchmark module run as pytest-benchmark users run it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from suite.run.pytest_plugin import pytest_benchmark_update_machine_info

pytestmark = [pytest.mark.e2e, pytest.mark.mechanics]
ROOT = Path(__file__).resolve().parents[1]
METRICS = ("throughput_samples_per_s", "step_time_p50_s", "step_time_p90_s", "step_time_p99_s",
           "data_wait_fraction", "device_peak_memory_bytes", "host_ram_peak_rss_bytes", "host_ram_peak_pss_bytes")


def _pytest_benchmarks(tmp_path, *extra):
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "benchmarks"), "-q", "-p", "no:cacheprovider", "-k", "workers-0",
         "--suite-steps", "3", "--suite-warmup-steps", "1", "--benchmark-storage", f"file://{tmp_path}/storage",
         *extra], cwd=tmp_path, capture_output=True, text=True)


def test_benchmark_json_carries_every_suite_metric_and_compare_works(tmp_path):
    first = _pytest_benchmarks(tmp_path, "--benchmark-json", str(tmp_path / "out.json"), "--benchmark-autosave")
    assert first.returncode == 0, first.stdout + first.stderr
    data = json.loads((tmp_path / "out.json").read_text())
    [bench] = data["benchmarks"]
    assert bench["stats"]["rounds"] == 3  # one round per measured step; the warm-up step is a warm-up round
    info = bench["extra_info"]
    assert info["config"]["num_workers"] == 0 and info["config"]["batch_size"] == 8
    assert set(METRICS) <= set(info) and len(info["loss_digest"]) == 64
    assert info["measured_steps"] == 3 and 0 <= info["data_wait_fraction"] <= 1
    cpu = data["machine_info"]["suite"]["devices"]["cpu"]
    assert cpu["available"] is True and cpu["device_name"] and cpu["memory_total_bytes"] > 0
    second = _pytest_benchmarks(tmp_path, "--benchmark-compare", "--benchmark-compare-fail=mean:1000%")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "0001_" in second.stdout  # compared against the saved run


def test_machine_info_hook_lists_devices_and_packages():
    info = {}
    pytest_benchmark_update_machine_info(None, info)
    assert info["suite"]["devices"]["cpu"]["available"] and info["suite"]["packages"]["torch"] != "absent"
