"""``suite bench-overhead``: what the harness costs, measured against a bare hand-written loop.

One configuration is built once in this process; then blocks of training steps alternate between

* a *bare* loop: ``for _ in range(n): loss = workload.train_step(next(batches))`` with one device
  synchronization at the end of the block (what a user would write by hand), and
* the *suite* loop: the runner's own :class:`~suite.run.steps.TrainingSteps` (synchronized step clock,
  data-wait accounting, batch-size check, loss read back every step), the per-step progress event and
  the MLPerf log, while a separate tracker process samples this process tree's host RAM every 50 ms
  (as the runner's parent does) and runs MLflow's system-metrics monitor into a temporary store.

Both continue the same training run on the same batch stream, and alternating blocks (bare, suite, bare,
...) exposes both to the same slow spells of a shared machine; the overhead is the ratio of the median
per-step times of each suite block and the bare block before it (median over the pairs). The tracker
process also reports its own CPU use and the RAM sampler's cost per sample.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from mlperf_logging.mllog import constants

from suite.config import RunConfig
from suite.trackers.host_ram import PSS_CPU_BUDGET

RAM_SAMPLE_INTERVAL_S = 0.05  # the runner's
SYSTEM_METRICS_INTERVAL_S = 1.0  # `suite run`'s default


def _tracker_process(pid: int, connection: Any, store: str) -> None:
    """Runs in a spawned process: on "start" sample ``pid``'s tree (and MLflow system metrics) until "stop"."""
    import logging

    from suite.recorders.mlflow_gateway import MlflowGateway
    from suite.recorders.system_metrics import start_system_metrics
    from suite.trackers.host_ram import HostRamSampler

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines would drown the output
    uri = f"sqlite:///{Path(store) / 'mlflow.db'}"
    gateway = MlflowGateway(uri)
    run_id = gateway.create_run(gateway.experiment_id("overhead") or "", "overhead", {}, {})
    connection.send("ready")
    while connection.recv() == "start":
        monitor = start_system_metrics(run_id, uri, SYSTEM_METRICS_INTERVAL_S)
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


def run_overhead(config: RunConfig, blocks: int, progress: Callable[[str], None] = lambda _: None
                 ) -> dict[str, Any]:
    """Alternate bare and suite blocks of ``config.steps`` steps, ``blocks`` of each; JSON-ready figures."""
    import torch

    from suite.events import emit
    from suite.records.mlperf_log import MlperfLog
    from suite.run.steps import TrainingSteps, prepare_device
    from suite.registry import load_device, load_workload

    adapter = load_device(config.device)()
    adapter.setup()
    prepare_device(config, adapter)
    workload = load_workload(config.workload)(config, adapter)
    progress("setting up the workload")
    workload.setup()
    losses: list[float] = []
    steps = TrainingSteps(config, adapter, workload, losses=losses)
    batches = steps.batches  # one batch stream for both loops
    bare: list[float] = []
    suite: list[float] = []
    tracker_samples: list[int] = []
    tracker_cpu: list[float] = []
    with tempfile.TemporaryDirectory(prefix="suite-overhead-") as store, open(os.devnull, "w") as devnull:
        trackers = _Trackers(os.getpid(), store)
        try:
            progress("warm-up")
            for _ in range(config.warmup_steps):
                workload.train_step(next(batches))
            adapter.synchronize()
            mlperf = MlperfLog(Path(store) / "mlperf.log")
            for block in range(blocks):
                progress(f"block {block + 1}/{blocks}: bare loop")
                adapter.synchronize()
                start = time.perf_counter()
                for _ in range(config.steps):
                    workload.train_step(next(batches))
                adapter.synchronize()
                bare.append((time.perf_counter() - start) / config.steps)

                progress(f"block {block + 1}/{blocks}: suite loop with trackers")
                with trackers.on() as stats:
                    first = len(steps.timings)
                    mlperf.start(constants.BLOCK_START, metadata={"first_step": first, "step_count": config.steps})
                    steps.start_clock()
                    for _ in range(config.steps):
                        steps.step()
                        emit(devnull, step=len(steps.timings), total=config.steps * blocks, loss=losses[-1])
                    mlperf.end(constants.BLOCK_STOP, metadata={"first_step": first, "step_count": config.steps})
                    suite.append(sum(t.step_time_s for t in steps.timings[first:]) / config.steps)
                tracker_samples.append(stats["samples"])
                tracker_cpu.append(stats["tracker_cpu_fraction"])
            mlperf.close()
        finally:
            cost = trackers.close()
            workload.teardown()
            adapter.teardown()
    if not cost:
        raise RuntimeError("the tracker process ended early; see its traceback above")
    bare_median, suite_median = statistics.median(bare), statistics.median(suite)
    return {
        # each suite block against the bare block just before it, then the median: drift cancels out
        "overhead_fraction": statistics.median(s / b for s, b in zip(suite, bare, strict=True)) - 1.0,
        "bare_step_time_s": bare_median,
        "suite_step_time_s": suite_median,
        "bare_step_time_s_blocks": bare,
        "suite_step_time_s_blocks": suite,
        "ram_sampler": {
            "interval_s": RAM_SAMPLE_INTERVAL_S,
            "rss_sample_cpu_s": cost["rss"],
            "pss_sample_cpu_s": cost["pss"],
            "pss_interval_s": max(RAM_SAMPLE_INTERVAL_S, cost["pss"] / PSS_CPU_BUDGET),
            "cpu_fraction_of_one_core": (cost["rss"] / RAM_SAMPLE_INTERVAL_S
                                         + min(cost["pss"] / RAM_SAMPLE_INTERVAL_S, PSS_CPU_BUDGET)),
            "cpu_fraction_of_one_core_if_pss_every_sample": cost["pss"] / RAM_SAMPLE_INTERVAL_S,
            "samples_per_suite_block": tracker_samples,
        },
        "tracker_process_cpu_fraction_of_one_core": statistics.median(tracker_cpu),
        "trackers": ["StepTimer (device-synchronized, data-wait)", "batch-size check", "loss read back per step",
                     "progress event per step", "MLPerf log",
                     f"host RAM sampler (separate process, every {RAM_SAMPLE_INTERVAL_S * 1000:.0f} ms)",
                     f"MLflow system metrics (every {SYSTEM_METRICS_INTERVAL_S:.0f} s)"],
        "settings": {"config": config.to_dict(), "steps_per_block": config.steps, "blocks": blocks,
                     "torch": torch.__version__, "logical_cores": os.cpu_count()},
    }
