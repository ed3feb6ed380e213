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

_log = logging.getLogger(__name__)
MiB = 2**20


class HPUMonitor(BaseMetricsMonitor):
    """Utilization, memory and power of every Gaudi device, read with habana-pyhlml (HLML)."""

    def __init__(self, hlml: Any = None) -> None:
        super().__init__()
        self._hlml = hlml or importlib.import_module("pyhlml")
        self._hlml.hlmlInit()
        count = self._hlml.hlmlDeviceGetCount()
        self._handles = [self._hlml.hlmlDeviceGetHandleByIndex(index) for index in range(count)]

    def collect_metrics(self) -> None:
        for index, handle in enumerate(self._handles):
            utilization = self._hlml.hlmlDeviceGetUtilizationRates(handle)
            utilization = getattr(utilization, "aip", utilization)  # a struct in newer pyhlml, an int before
            memory = self._hlml.hlmlDeviceGetMemoryInfo(handle)
            self._metrics[f"hpu_{index}_utilization_percentage"].append(float(utilization))
            self._metrics[f"hpu_{index}_memory_usage_megabytes"].append(memory.used / MiB)
            self._metrics[f"hpu_{index}_memory_usage_percentage"].append(100.0 * memory.used / memory.total)
            self._metrics[f"hpu_{index}_power_watts"].append(self._hlml.hlmlDeviceGetPowerUsage(handle) / 1000.0)

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
