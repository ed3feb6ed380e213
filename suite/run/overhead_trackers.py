"""What ``suite bench-overhead`` runs beside the loop it times: the RAM sampler and MLflow system metrics in a
process of their own, and a timed adapter that splits a step into its sections."""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from suite.meters.host_ram import HostRamSampler

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter

#: The pieces of the suite's per-step code that bench-overhead times, with what each is.
SECTIONS = {
    "batch_ready": "clock read when the batch is in hand, batch-size check",
    "step_boundary": "the device's step boundary (HPU mark_step; nothing on CPU and CUDA)",
    "synchronize": "device synchronization before the clock is read (a bare loop needs one per block; on an "
                   "accelerator this also waits for the step's own queued work, so it is an upper bound)",
    "step_end": "loss read-back, clock read, step bookkeeping (less the two above)",
    "progress_event": "the per-step progress event (JSON line on a pipe)",
    "mlperf_log": "MLPerf block_start/block_stop, per step",
}


class _Sections:
    """Wall and thread-CPU seconds per named section (:data:`SECTIONS`), for the current block."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = dict.fromkeys(SECTIONS, 0.0)
        self.cpu: dict[str, float] = dict.fromkeys(SECTIONS, 0.0)

    @contextlib.contextmanager
    def timed(self, name: str) -> Any:
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.wall[name] += time.perf_counter() - wall0
            self.cpu[name] += time.thread_time() - cpu0


class _TimedTraining:
    """The device's training ops with the step boundary timed into ``sections``."""

    def __init__(self, ops: Any, sections: Callable[[], _Sections]) -> None:
        self._ops, self._sections = ops, sections

    def step_boundary(self) -> None:
        with self._sections().timed("step_boundary"):
            self._ops.step_boundary()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)


class _TimedAdapter:
    """The device adapter with its synchronize and step boundary timed into ``sections``."""

    def __init__(self, adapter: DeviceAdapter, sections: Callable[[], _Sections]) -> None:
        self._adapter, self._sections = adapter, sections
        self._training = _TimedTraining(adapter.training(), sections)

    def synchronize(self) -> None:
        with self._sections().timed("synchronize"):
            self._adapter.synchronize()

    def training(self) -> Any:
        return self._training

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adapter, name)


RAM_SAMPLE_INTERVAL_S = 0.05  # the runner's
SYSTEM_METRICS_INTERVAL_S = 1.0  # `suite run`'s default


def _tracker_process(pid: int, connection: Any, store: str) -> None:
    """Runs in a spawned process: on "start" sample ``pid``'s tree (and MLflow system metrics) until "stop"."""
    import logging

    from suite.tracking.mlflow_gateway import MlflowGateway
    from suite.tracking.system_metrics import start_system_metrics

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines would drown the output
    uri = f"sqlite:///{Path(store) / 'mlflow.db'}"
    gateway = MlflowGateway(uri)
    run_id = gateway.create_run(gateway.experiment_id("overhead") or "", "overhead", {}, {})
    connection.send("ready")
    while connection.recv() == "start":
        monitor = start_system_metrics(gateway, run_id, SYSTEM_METRICS_INTERVAL_S)
        sampler = HostRamSampler(pid, RAM_SAMPLE_INTERVAL_S).start()
        while sampler.pss_samples == 0:  # steady state, as in a run: the first (PSS) sample is behind us
            time.sleep(0.005)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        connection.send("started")
        connection.recv()  # "stop"
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        peak = sampler.stop()
        monitor.finish()
        connection.send({"samples": peak.samples, "peak_pss_bytes": peak.peak_pss_bytes,
                         "peak_rss_bytes": peak.peak_rss_bytes, "tracker_cpu_fraction": cpu / wall})
    # the RAM sampler's own cost: CPU time per sample of this process tree, RSS only and with PSS
    sampler = HostRamSampler(pid, RAM_SAMPLE_INTERVAL_S)
    cost = {}
    for kind, with_pss, count in (("rss", False, 200), ("pss", True, 20)):
        cpu0 = time.thread_time()
        for _ in range(count):
            sampler.sample_now(with_pss)
        cost[kind] = (time.thread_time() - cpu0) / count
    connection.send(cost)
    gateway.terminate(run_id, "FINISHED")


class _Trackers:
    def __init__(self, pid: int, store: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_tracker_process, args=(pid, child, store), daemon=True)
        self._process.start()
        if self._connection.recv() != "ready":
            raise RuntimeError("tracker process did not start")

    @contextlib.contextmanager
    def on(self) -> Any:
        self._connection.send("start")
        self._connection.recv()
        stats: dict[str, Any] = {}
        try:
            yield stats
        finally:
            self._connection.send("stop")
            stats.update(self._connection.recv())

    def close(self) -> dict[str, float]:
        """Stop the tracker process; returns the RAM sampler's cost (empty if the process had died)."""
        try:
            self._connection.send("done")
            return self._connection.recv()
        except (BrokenPipeError, EOFError):
            return {}
        finally:
            self._process.join(timeout=30)
