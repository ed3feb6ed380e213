"""Contract test of the HPU system-metrics monitor against a stand-in `pyhlml` module (no Gaudi here)."""

import types

from suite.recorders.system_metrics import HPUMonitor, hpu_monitor

import pytest

pytestmark = pytest.mark.mechanics


def stand_in_pyhlml(calls):
    def record(name, value):
        def fn(*args):
            calls.append((name, args))
            return value(*args) if callable(value) else value
        return fn

    return types.SimpleNamespace(
        hlmlInit=record("hlmlInit", None),
        hlmlShutdown=record("hlmlShutdown", None),
        hlmlDeviceGetCount=record("hlmlDeviceGetCount", 2),
        hlmlDeviceGetHandleByIndex=record("hlmlDeviceGetHandleByIndex", lambda i: f"handle{i}"),
        # newer pyhlml returns a struct with .aip, older an int: device 0 struct, device 1 int
        hlmlDeviceGetUtilizationRates=record(
            "hlmlDeviceGetUtilizationRates",
            lambda h: types.SimpleNamespace(aip=80) if h == "handle0" else 40),
        hlmlDeviceGetMemoryInfo=record("hlmlDeviceGetMemoryInfo",
                                       types.SimpleNamespace(total=96 * 2**30, used=24 * 2**30, free=72 * 2**30)),
        hlmlDeviceGetPowerUsage=record("hlmlDeviceGetPowerUsage", 350_000),  # mW
    )


def test_contract_hpu_monitor_reads_hlml_per_device():
    calls = []
    monitor = HPUMonitor(hlml=stand_in_pyhlml(calls))
    monitor.collect_metrics()
    monitor.collect_metrics()
    metrics = monitor.aggregate_metrics()
    assert metrics["hpu_0_utilization_percentage"] == 80.0 and metrics["hpu_1_utilization_percentage"] == 40.0
    assert metrics["hpu_0_memory_usage_megabytes"] == 24 * 1024.0
    assert metrics["hpu_1_memory_usage_percentage"] == 25.0
    assert metrics["hpu_0_power_watts"] == 350.0
    assert calls[0] == ("hlmlInit", ()) and ("hlmlDeviceGetHandleByIndex", (1,)) in calls
    monitor.shutdown()
    assert calls[-1] == ("hlmlShutdown", ())


def test_without_pyhlml_there_is_no_hpu_monitor():
    assert hpu_monitor() is None  # pyhlml is not installed here
