"""System metrics on MLflow runs: MLflow's own monitor (CPU, RAM, disk, network, NVIDIA GPU through
pynvml where installed), plus an HPU monitor of ours through habana-pyhlml (MLflow has none).

The monitors run in the runner's process while a configuration runs, sampling the whole machine, and
log under ``system/`` on that configuration's MLflow run.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor

from suite.devices.gaudi2 import hlml_init

_log = logging.getLogger(__name__)
#: MLflow's GPU monitor logs ``gpu_<i>_memory_usage_megabytes`` as bytes / 1e6 (mlflow/system_metrics/metrics/
#: gpu_monitor.py); the HPU figures use the same unit, so that GPU and HPU rows compare.
MEGABYTE = 1e6


class HPUMonitor(BaseMetricsMonitor):
    """Utilization, memory and power of every Gaudi device, read with habana-pyhlml (HLML), under the names and units
    of MLflow's GPU monitor with ``hpu`` for ``gpu``. As that monitor does, an error reading one figure is logged and
    skips that figure for that sample; the monitor goes on."""

    def __init__(self, hlml: Any = None) -> None:
        super().__init__()
        self._hlml = hlml or importlib.import_module("pyhlml")
        hlml_init(self._hlml)
        count = self._hlml.hlmlDeviceGetCount()
        self._handles = [self._hlml.hlmlDeviceGetHandleByIndex(index) for index in range(count)]
        self.errors = 0

    def _memory(self, prefix: str, handle: Any) -> None:
        info = self._hlml.hlmlDeviceGetMemoryInfo(handle)
        self._metrics[f"{prefix}_memory_usage_percentage"].append(round(100.0 * info.used / info.total, 1))
        self._metrics[f"{prefix}_memory_usage_megabytes"].append(info.used / MEGABYTE)

    def _utilization(self, prefix: str, handle: Any) -> None:
        rates = self._hlml.hlmlDeviceGetUtilizationRates(handle)
        self._metrics[f"{prefix}_utilization_percentage"].append(float(getattr(rates, "aip", rates)))

    def _power(self, prefix: str, handle: Any) -> None:  # HLML reports milliwatts
        self._metrics[f"{prefix}_power_usage_watts"].append(self._hlml.hlmlDeviceGetPowerUsage(handle) / 1000)

    def collect_metrics(self) -> None:
        for index, handle in enumerate(self._handles):
            for what, read in (("memory", self._memory), ("utilization", self._utilization), ("power", self._power)):
                try:
                    read(f"hpu_{index}", handle)
                except Exception as exc:  # noqa: BLE001 - HLMLError and friends: one figure lost, not the monitor
                    self.errors += 1
                    _log.warning("HPU %d: cannot read %s: %s", index, what, exc)

    def aggregate_metrics(self) -> dict[str, float]:
        return {name: round(sum(values) / len(values), 1) for name, values in self._metrics.items() if values}

    def shutdown(self) -> None:
        self._hlml.hlmlShutdown()


def hpu_monitor() -> HPUMonitor | None:
    """An HPU monitor where habana-pyhlml and the Habana driver are present, else None (logged why)."""
    try:
        return HPUMonitor()
    except Exception as exc:  # noqa: BLE001 - no pyhlml, no driver, no device: simply no HPU metrics
        _log.debug("no HPU system metrics: %s", exc)
        return None


def start_system_metrics(run_id: str, tracking_uri: str, interval_s: float) -> Any:
    """Start MLflow's system metrics monitor (plus HPU where present) on ``run_id``; call ``finish()``."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, samples_before_logging=1,
                                   tracking_uri=tracking_uri)
    hpu = hpu_monitor()
    if hpu is not None:
        monitor.monitors.append(hpu)
    monitor.start()
    return monitor
