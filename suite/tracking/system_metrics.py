"""System metrics on MLflow runs: MLflow's own monitor (CPU, RAM, disk, network, NVIDIA GPU through
pynvml where installed), plus an HPU monitor of ours through habana-pyhlml (MLflow has none).

The monitors run in the runner's process while a configuration runs, sampling the whole machine, and
log under ``system/`` on that configuration's MLflow run. The sampling loop is ours (:class:`RunSystemMetrics`), the
monitors, names and batch logger MLflow's: MLflow's own loop reads the run back from the store after every sample
to see whether it ended (5 ms of CPU per read on sqlite here, half a percent of a core at one sample a second, taken
from the benchmark it watches), and writes each sample as it comes; the runner owns the run's lifetime and stops the
monitor itself, and the samples are written in batches every :data:`FLUSH_EVERY_S` seconds.
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any

from mlflow.entities import Metric
from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

from suite.devices.gaudi2 import hlml_init

_log = logging.getLogger(__name__)
#: MLflow's GPU monitor logs ``gpu_<i>_memory_usage_megabytes`` as bytes / 1e6 (mlflow/system_metrics/metrics/
#: gpu_monitor.py); the HPU figures use the same unit, so that GPU and HPU rows compare.
MEGABYTE = 1e6
#: How often the samples are written to the store (each keeps its own time stamp and step); also at the end.
FLUSH_EVERY_S = 10.0


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


class RunSystemMetrics(SystemMetricsMonitor):
    """MLflow's system metrics monitor (mlflow/system_metrics/system_metrics_monitor.py, MLflow 3.x) on a run whose
    end the caller signals with ``finish()``: the loop samples every ``sampling_interval`` seconds and aggregates
    ``samples_before_logging`` samples per point as MLflow's does, without reading the run back after each sample,
    and hands the points to MLflow's batch logger every :data:`FLUSH_EVERY_S` seconds (``finish()`` writes the rest).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._flushed_at = time.monotonic()
        self.flushes = 0
        self.samples = 0

    def monitor(self) -> None:
        while not self._shutdown_event.is_set():
            for _ in range(self.samples_before_logging):
                self.collect_metrics()
                self.samples += 1
                if self._shutdown_event.wait(self.sampling_interval):
                    break
            try:
                self.publish_metrics(self.aggregate_metrics())
            except Exception as exc:  # noqa: BLE001 - a store that fails costs the system metrics, not the run
                _log.warning("system metrics stopped: cannot write them to MLflow: %s", exc)
                return

    def publish_metrics(self, metrics: dict[str, float]) -> None:
        """Queue one point per metric (``system/`` prefix, node id as MLflow's); write the queue every
        :data:`FLUSH_EVERY_S` seconds."""
        prefix = self._metrics_prefix + (self.node_id + "/" if self.node_id else "")
        stamp = int(time.time() * 1000)
        self.mlflow_logger.data += [Metric(prefix + key, value, stamp, self._logging_step)
                                    for key, value in metrics.items()]
        self._logging_step += 1
        for monitor in self.monitors:
            monitor.clear_metrics()
        if time.monotonic() - self._flushed_at >= FLUSH_EVERY_S:
            self.mlflow_logger.flush()
            self._flushed_at = time.monotonic()
            self.flushes += 1


def start_system_metrics(run_id: str, tracking_uri: str, interval_s: float) -> RunSystemMetrics:
    """Start the system metrics monitor (plus HPU where present) on ``run_id``; call ``finish()`` when the run
    ends."""
    monitor = RunSystemMetrics(run_id, sampling_interval=interval_s, samples_before_logging=1,
                               tracking_uri=tracking_uri)
    hpu = hpu_monitor()
    if hpu is not None:
        monitor.monitors.append(hpu)
    monitor.start()
    return monitor
