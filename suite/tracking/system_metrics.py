"""System metrics on MLflow runs: MLflow's own monitor (CPU, RAM, disk, network, NVIDIA GPU through
pynvml where installed), plus an HPU monitor of ours through habana-pyhlml (MLflow has none).

The monitors run in the runner's process while a configuration runs, sampling the whole machine, and
log under ``system/`` on that configuration's MLflow run. The sampling loop is ours (:class:`RunSystemMetrics`), the
monitors and metric names MLflow's (its public monitor classes: ``collect_metrics``, ``aggregate_metrics``,
``clear_metrics``; its environment variables for the interval, the samples per point and the node id), the writes go
through the suite's gateway. MLflow's own loop (``SystemMetricsMonitor``) reads the run back from the store after
every sample to see whether it ended (5 ms of CPU per read on sqlite here, half a percent of a core at one sample a
second, taken from the benchmark it watches); the runner owns the run's lifetime and stops the monitor itself, and
the samples are written in batches every :data:`FLUSH_EVERY_S` seconds.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from mlflow.environment_variables import (
    MLFLOW_SYSTEM_METRICS_NODE_ID,
    MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING,
    MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL,
)
from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor
from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor
from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor
from mlflow.system_metrics.metrics.rocm_monitor import ROCMMonitor

from suite.devices.gaudi2 import hlml_init

if TYPE_CHECKING:
    from suite.tracking.mlflow_gateway import MlflowGateway

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


def default_monitors() -> list[BaseMetricsMonitor]:
    """MLflow's monitors as its ``SystemMetricsMonitor`` builds them: CPU, disk, network, and an NVIDIA (else AMD)
    GPU where its library finds one; plus Habana's HPUs where habana-pyhlml finds them."""
    monitors: list[BaseMetricsMonitor] = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    for gpu in (GPUMonitor, ROCMMonitor):
        try:
            monitors.append(gpu())
            break
        except Exception as exc:  # noqa: BLE001 - no library, no driver, no device: no GPU metrics
            _log.debug("no %s system metrics: %s", gpu.__name__, exc)
    hpu = hpu_monitor()
    if hpu is not None:
        monitors.append(hpu)
    return monitors


class RunSystemMetrics:
    """System metrics on a run whose end the caller signals with :meth:`finish`: every ``sampling_interval``
    seconds each monitor samples; every ``samples_before_logging`` samples the aggregates become one point per metric
    (``system/[node/]name``, steps 0, 1, 2...), queued and written through the gateway every :data:`FLUSH_EVERY_S`
    seconds and at the end. A store that fails costs the system metrics, never the run."""

    def __init__(self, gateway: MlflowGateway, run_id: str, sampling_interval: float, samples_before_logging: int = 1,
                 monitors: list[BaseMetricsMonitor] | None = None) -> None:
        self.gateway, self.run_id = gateway, run_id
        self.monitors = default_monitors() if monitors is None else monitors
        self.sampling_interval = MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL.get() or sampling_interval
        self.samples_before_logging = MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING.get() or samples_before_logging
        node_id = MLFLOW_SYSTEM_METRICS_NODE_ID.get()
        self.prefix = "system/" + (f"{node_id}/" if node_id else "")
        self.step = self.samples = self.flushes = 0
        self._queued: list[tuple[str, float, int, int]] = []
        self._flushed_at = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "RunSystemMetrics":
        self._thread = threading.Thread(target=self._loop, name="suite-system-metrics", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            for _ in range(self.samples_before_logging):
                for monitor in self.monitors:
                    monitor.collect_metrics()
                self.samples += 1
                if self._stop.wait(self.sampling_interval):
                    break
            try:
                self._publish()
            except Exception as exc:  # noqa: BLE001 - a store that fails costs the system metrics, not the run
                _log.warning("system metrics stopped: cannot write them to MLflow: %s", exc)
                return

    def _publish(self) -> None:
        """One point per metric from the samples so far; the queue written every :data:`FLUSH_EVERY_S` seconds."""
        stamp = int(time.time() * 1000)
        for monitor in self.monitors:
            self._queued += [(self.prefix + key, value, stamp, self.step)
                             for key, value in monitor.aggregate_metrics().items()]
            monitor.clear_metrics()
        self.step += 1
        if time.monotonic() - self._flushed_at >= FLUSH_EVERY_S:
            self._flush()

    def _flush(self) -> None:
        queued, self._queued = self._queued, []
        if queued:
            self.gateway.log(self.run_id, metrics=queued)
        self._flushed_at = time.monotonic()
        self.flushes += 1

    def finish(self) -> None:
        """Stop sampling and write what is queued."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            self._flush()
        except Exception as exc:  # noqa: BLE001 - a store that fails costs the system metrics, not the run
            _log.warning("system metrics: the last points are not written to MLflow: %s", exc)


def start_system_metrics(gateway: MlflowGateway, run_id: str, interval_s: float) -> RunSystemMetrics:
    """Start the system metrics monitors (MLflow's, plus HPU where present) on ``run_id``, written through
    ``gateway``; call ``finish()`` when the run ends."""
    return RunSystemMetrics(gateway, run_id, interval_s).start()
