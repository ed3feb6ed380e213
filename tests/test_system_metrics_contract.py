"""The HPU system-metrics monitor against the REAL habana-pyhlml (installed with the test extra), with only
``libhlml.so`` (the driver library pyhlml opens with ctypes, ``pyhlml/hlml_lib.py``) replaced: the stand-in fills
the very ctypes structures pyhlml passes (``c_hlml_memory``: free/total/used in bytes; ``c_hlml_utilization.aip``;
power in milliwatts, per pyhlml's docstrings) and returns HLML status codes, so pyhlml's own error handling runs."""

import logging

import pytest

from suite.tracking.system_metrics import HPUMonitor, hpu_monitor

from standins import libhlml as libhlml_standin

pytestmark = pytest.mark.mechanics
GiB = 2**30


@pytest.fixture
def libhlml(monkeypatch):
    return libhlml_standin.install(monkeypatch, libhlml_standin.FakeLibHLML())


def test_hpu_monitor_reads_real_pyhlml_in_mlflows_units(libhlml):
    monitor = HPUMonitor()
    monitor.collect_metrics()
    monitor.collect_metrics()
    metrics = monitor.aggregate_metrics()
    assert metrics["hpu_0_utilization_percentage"] == 80.0 and metrics["hpu_1_utilization_percentage"] == 40.0
    # bytes / 1e6, as MLflow's GPU monitor fills gpu_<i>_memory_usage_megabytes (not / 2**20: 4.9 % apart)
    assert metrics["hpu_0_memory_usage_megabytes"] == round(24 * GiB / 1e6, 1) == 25769.8
    assert metrics["hpu_1_memory_usage_percentage"] == 25.0
    assert metrics["hpu_0_power_usage_watts"] == 350.0
    assert libhlml.calls[0] == "hlml_init"
    monitor.shutdown()
    assert libhlml.calls[-1] == "hlml_shutdown"


def test_the_unit_is_mlflows():
    import inspect

    from mlflow.system_metrics.metrics import gpu_monitor

    source = inspect.getsource(gpu_monitor.GPUMonitor.collect_metrics)
    assert 'memory_usage_megabytes"].append(memory.used / 1e6)' in source  # the installed MLflow's own unit


def test_an_hlml_error_loses_one_figure_not_the_monitor(libhlml, caplog):
    """Defect 9: one HLML error used to kill the monitor thread; MLflow's GPU monitor catches per figure."""
    monitor = HPUMonitor()
    libhlml.failing = {"hlml_device_get_memory_info"}
    with caplog.at_level(logging.WARNING):
        monitor.collect_metrics()
    libhlml.failing = set()
    monitor.collect_metrics()
    metrics = monitor.aggregate_metrics()
    assert monitor.errors == 2  # memory of both devices in the first sample
    assert metrics["hpu_0_power_usage_watts"] == 350.0 and metrics["hpu_0_memory_usage_megabytes"] == 25769.8
    assert len(monitor._metrics["hpu_0_utilization_percentage"]) == 2
    assert len(monitor._metrics["hpu_0_memory_usage_megabytes"]) == 1
    assert "cannot read memory" in caplog.text and "HLML Error" in caplog.text


def test_without_a_driver_there_is_no_hpu_monitor_and_nothing_on_stdout(capfd):
    assert hpu_monitor() is None
    # pyhlml prints "Failed to load libhlml" on stdout; it broke `suite bench-overhead --json` in CI
    assert capfd.readouterr().out == ""  # pyhlml is installed, libhlml.so is not: no monitor, and no crash


def test_the_system_metrics_loop_reads_no_run_back_and_writes_every_sample(tmp_path, monkeypatch):
    """Against the real MLflow (sqlite store): MLflow's own loop reads the run back after every sample (5 ms of CPU
    each here); ours does not, and every sample still lands, in order, in batches every FLUSH_EVERY_S."""
    import time

    from mlflow.tracking import MlflowClient

    from suite.tracking import system_metrics
    from suite.tracking.mlflow_gateway import MlflowGateway

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    gateway = MlflowGateway(uri)
    run_id = gateway.create_run(gateway.experiment_id("system") or "", "system", {}, {})
    reads = []
    real_get_run = MlflowClient.get_run
    monkeypatch.setattr(MlflowClient, "get_run", lambda self, rid: reads.append(rid) or real_get_run(self, rid))
    monkeypatch.setattr(system_metrics, "FLUSH_EVERY_S", 0.3)
    monitor = system_metrics.start_system_metrics(gateway, run_id, 0.05)
    time.sleep(1.5)
    monitor.finish()
    assert reads == []
    assert monitor.flushes >= 2  # written while running, not only at the end
    history = MlflowClient(uri).get_metric_history(run_id, "system/cpu_utilization_percentage")
    assert [m.step for m in history] == list(range(monitor.samples))
    assert monitor.samples >= 10
    stamps = [m.timestamp for m in history]
    assert stamps == sorted(stamps) and stamps[-1] - stamps[0] >= 1000
