"""`suite tune` (worker auto-tuning) and `suite bench-overhead` (harness cost), and the RAM sampler's budget."""

import json
import subprocess
import sys
import time

import pytest
from conftest import runs_of
from mlflow.tracking import MlflowClient

from suite.analysis.tune import analyse, sweep_configs
from suite.cli import main
from suite.config import MatrixSpec, RunConfig
from suite.errors import ConfigError
from suite.meters.host_ram import HostRamSampler
from suite.results.record import FAILED, FINISHED, RunResult

pytestmark = pytest.mark.mechanics


def _result(workers, prefetch, throughput, pss=1e8, status=FINISHED, spread=0.01, low=None, high=None):
    """A run of 40 steps of batch 8 at ``throughput``, each step time off by up to ``spread`` (deterministic)."""
    step = 8 / throughput if throughput else 1.0
    steps = [step * (1 + spread * ((i * 7919) % 13 - 6) / 6) for i in range(40)]
    metrics = {"throughput_samples_per_s": throughput, "host_ram_peak_pss_bytes": pss}
    if low is not None:
        metrics.update(throughput_ci95_low=low, throughput_ci95_high=high)
    config = RunConfig(workload="bridgetower", preset="tiny", device="cpu", num_workers=workers, loader="cpu",
                       precision="fp32", prefetch_factor=prefetch)
    return RunResult(config=config, status=status, metrics=metrics,
                     facts={"step_times_s": steps})


def test_tune_recommends_a_smaller_setting_only_when_it_is_equivalent_to_the_best():
    results = [_result(0, None, 50.0), _result(1, 2, 96.0), _result(1, 4, 97.0), _result(2, 2, 100.0),
               _result(3, 2, 0.0, status=FAILED)]
    outcome = analyse(results, tolerance=0.05)
    assert (outcome.best.num_workers, outcome.best.prefetch_factor) == (2, 2)
    assert (outcome.recommended.num_workers, outcome.recommended.prefetch_factor) == (1, 2)
    assert outcome.recommended.vs_best.startswith("PASS: ratio 0.96")
    strict = analyse(results, tolerance=0.0)
    assert (strict.recommended.num_workers, strict.recommended.prefetch_factor) == (2, 2)
    assert len(outcome.to_dict()["points"]) == 5
    with pytest.raises(ConfigError, match="no configuration of the sweep finished"):
        analyse([_result(0, None, 0.0, status=FAILED)], 0.05)
    with pytest.raises(ConfigError, match="tolerance"):
        analyse(results, 1.5)


def test_tune_does_not_call_overlapping_intervals_equivalent():
    """Issue 26: "workers=1 (17.6 samples/s, [8.1, 44.7]: not significantly slower than the best)" was recommended
    beside a best of 44.3: wide intervals that overlap say nothing of equality."""
    best = _result(2, 2, 44.3, spread=0.05, low=40.0, high=48.0)
    noisy = _result(1, 2, 17.6, spread=0.9, low=8.1, high=44.7)
    outcome = analyse([noisy, best], tolerance=0.10)
    assert outcome.recommended.num_workers == 2
    assert not outcome.points[0].vs_best.startswith("PASS")


def test_tune_sweep_runs_workers_zero_once_and_every_prefetch_factor_above():
    spec = MatrixSpec(workload="bridgetower", preset="tiny", workers=(0, 1, 2))
    configs = sweep_configs(spec, (2, 4))
    assert [(c.num_workers, c.prefetch_factor) for c in configs] == [(0, None), (1, 2), (1, 4), (2, 2), (2, 4)]
    assert len({c.config_id for c in configs}) == 5
    with pytest.raises(ConfigError, match="one device, loader and precision"):
        sweep_configs(MatrixSpec(workload="w", preset="p", loaders=("cpu", "device")), (2,))


@pytest.mark.e2e
def test_suite_tune_records_the_sweep_the_pick_and_the_plot(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = main(["tune", "--max-workers", "1", "--prefetch-factors", "1,2", "--steps", "2", "--warmup-steps", "1",
                 "--output", str(tmp_path / "out"), "--tracking-uri", uri, "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "recommended: workers=" in out
    # each point with its interval and host flag (the best/recommended lines after the table name a setting too)
    table = out.split("every setting, with its spread", 1)[1].split("\nbest: ", 1)[0]
    assert table.count("workers=1, prefetch=") == 2 and "recommended" in table
    assert table.count("quiet") + table.count("BUSY") == 3
    summary = json.loads((tmp_path / "out" / "tune.json").read_text())
    assert [(p["num_workers"], p["prefetch_factor"]) for p in summary["points"]] == [(0, None), (1, 1), (1, 2)]
    assert (tmp_path / "out" / "tune.png").stat().st_size > 10_000
    results = runs_of(tmp_path / "out")
    assert [r["config"]["prefetch_factor"] for r in results] == [None, 1, 2]
    client = MlflowClient(tracking_uri=uri)
    (parent,) = client.search_runs(client.search_experiments()[0].experiment_id, "tags.`suite.kind` = 'tune' and tags.`suite.role` = 'matrix'")
    pick = summary["recommended"]
    assert parent.data.tags["suite.tune.recommended_num_workers"] == str(pick["num_workers"])
    history = client.get_metric_history(parent.info.run_id, "tune.throughput_samples_per_s.pf2")
    assert [m.step for m in history] == [1]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "tune")}
    assert artifacts == {"tune/tune.png", "tune/tune.json"}


@pytest.mark.e2e
def test_bench_overhead_json_compares_the_suite_loop_with_a_bare_loop():
    proc = subprocess.run([sys.executable, "-m", "suite", "bench-overhead", "--steps", "2", "--blocks", "2",
                           "--warmup-steps", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert isinstance(figures["overhead_fraction"], float)
    low, high = figures["overhead_ci95"]
    assert low <= figures["overhead_fraction"] <= high
    parts = figures["decomposition"]
    from suite.run.overhead import SECTIONS

    assert set(parts) == {*SECTIONS, "tracker_process"}
    assert all(parts[name]["wall_s_per_step"] >= 0 and parts[name]["cpu_s_per_step"] >= 0 for name in SECTIONS)
    assert parts["progress_event"]["wall_s_per_step"] > 0  # a JSON line per step is written and timed
    # the estimate is the sum of its parts: harness seconds per step over the bare step, plus the tracker share
    estimates = [h / b for h, b in zip(figures["harness_s_per_step_blocks"], figures["bare_step_time_s_blocks"])]
    assert figures["overhead_fraction"] == pytest.approx(
        sum(estimates) / len(estimates) + parts["tracker_process"]["fraction_of_step"])
    paired_low, paired_high = figures["paired_overhead_ci95"]
    assert paired_low <= figures["paired_overhead_fraction"] <= paired_high
    assert len(figures["bare_step_time_s_blocks"]) == len(figures["suite_step_time_s_blocks"]) == 2
    sampler = figures["ram_sampler"]
    assert 0 < sampler["rss_sample_cpu_s"] < sampler["pss_sample_cpu_s"]
    assert all(n >= 1 for n in sampler["samples_per_suite_block"])
    assert 0 < figures["tracker_process_cpu_fraction_of_one_core"] < 1


def test_ram_sampler_spaces_out_pss_readings_to_its_cpu_budget():
    child = subprocess.Popen([sys.executable, "-c", "import time; b = b'x' * (200 * 2**20); time.sleep(30)"])
    try:
        time.sleep(0.5)
        sampler = HostRamSampler(child.pid, interval_s=0.01, pss_cpu_budget=0.001).start()
        time.sleep(1.0)
        peak = sampler.stop()
    finally:
        child.kill()
        child.wait()
    # RSS every 10 ms; PSS only at the start, when its budget allows (cost / 0.1 % >> 1 s here), and at stop
    assert peak.samples > 30
    assert 2 <= sampler.pss_samples <= 3
    assert peak.peak_pss_bytes is not None and peak.peak_pss_bytes > 150 * 2**20
    assert peak.peak_rss_bytes > 150 * 2**20


def test_ram_sampler_reads_pss_while_memory_grows_so_the_peak_is_not_missed():
    script = ("import time; time.sleep(0.4); b = b'x' * (300 * 2**20); time.sleep(0.6); del b; time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        sampler = HostRamSampler(child.pid, interval_s=0.01, pss_cpu_budget=0.001).start()
        time.sleep(1.6)  # the 300 MB came and went; the budget alone would allow no PSS reading in between
        peak = sampler.stop()
    finally:
        child.kill()
        child.wait()
    assert peak.peak_pss_bytes is not None and peak.peak_pss_bytes > 250 * 2**20
    assert sampler.pss_samples >= 3
