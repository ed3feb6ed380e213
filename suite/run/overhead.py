"""``suite bench-overhead``: what the harness costs, measured against a bare hand-written loop.

One configuration is built once in this process; then blocks of training steps alternate between

* a *bare* loop: ``for _ in range(n): loss = workload.train_step(next(batches))`` with one device
  synchronization at the end of the block (what a user would write by hand), and
* the *suite* loop: the runner's own :class:`~suite.run.steps.TrainingSteps` (synchronized step clock,
  data-wait accounting, batch-size check, loss read back every step), the per-step progress event and
  the MLPerf log, while a separate tracker process samples this process tree's host RAM every 50 ms
  (as the runner's parent does) and runs MLflow's system-metrics monitor into a temporary store.

The overhead is measured by *decomposition*, not by difference: every piece of the suite's own per-step code (the
clock and batch check when the batch arrives, the step end with its device step boundary, synchronization and loss
read-back, the progress event, the MLPerf log per block) is timed where it runs (wall time and this thread's CPU
time), and the tracker process's CPU use is turned into the share of the machine it takes from training (its
cores over the logical cores). Per suite block, ``harness seconds per step / bare step time + tracker share`` is
one estimate; ``overhead_fraction`` is their mean with a 95 % t-interval over the blocks. Differencing two noisy
wall times cannot resolve 1 % on a shared machine (blocks of the same loop vary by ~10 % here), so the paired
bare-vs-suite comparison is kept as a cross-check only (``paired_overhead_fraction`` and its interval): both
loops continue the same training run on the same batch stream, alternating blocks (bare, suite, bare, ...), each
suite block against the bare block before it. The tracker process also reports the RAM sampler's cost per sample.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

from mlperf_logging.mllog import constants

from suite.config import RunConfig
from suite.devices.base import prepare_device
from suite.events import emit
from suite.meters.host_ram import PSS_CPU_BUDGET, HostRamSampler
from suite.registry import load_device, load_workload
from suite.results.mlperf_log import MlperfLog
from suite.run.steps import TrainingSteps

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter
    from suite.workload import Workload


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


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % Student-t interval of the mean of ``values`` (a single value: no width)."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def run_overhead(config: RunConfig, blocks: int, progress: Callable[[str], None] = lambda _: None
                 ) -> dict[str, Any]:
    """Alternate bare and suite blocks of ``config.steps`` steps, ``blocks`` of each; JSON-ready figures."""
    adapter = load_device(config.device)()
    adapter.setup()
    prepare_device(config, adapter)
    workload = load_workload(config.workload)(config, adapter)
    progress("setting up the workload")
    workload.setup()
    run = _Blocks(config, adapter, workload)
    with tempfile.TemporaryDirectory(prefix="suite-overhead-") as store, open(os.devnull, "w") as devnull:
        trackers = _Trackers(os.getpid(), store)
        try:
            progress("warm-up")
            for _ in range(config.warmup_steps):
                workload.train_step(next(run.batches))
            adapter.synchronize()
            mlperf = MlperfLog(Path(store) / "mlperf.log")
            for block in range(blocks):
                progress(f"block {block + 1}/{blocks}: bare loop")
                run.bare_block()
                progress(f"block {block + 1}/{blocks}: suite loop with trackers")
                with trackers.on() as stats:
                    run.suite_block(mlperf, devnull, blocks)
                run.tracker_samples.append(stats["samples"])
                run.tracker_cpu.append(stats["tracker_cpu_fraction"])
            mlperf.close()
        finally:
            cost = trackers.close()
            workload.teardown()
            adapter.teardown()
    if not cost:
        raise RuntimeError("the tracker process ended early; see its traceback above")
    return _figures(config, blocks, run.bare, run.suite, run.sections, run.tracker_cpu, run.tracker_samples,
                    run.bare_cpu_cores, cost)


class _Blocks:
    """The two loops over one batch stream, and what each block measured."""

    def __init__(self, config: RunConfig, adapter: DeviceAdapter, workload: Workload) -> None:
        self.config, self.adapter, self.workload = config, adapter, workload
        self.losses: list[float] = []
        self.block_sections = _Sections()
        timed = cast("DeviceAdapter", _TimedAdapter(adapter, lambda: self.block_sections))  # forwards the rest
        self.steps = TrainingSteps(config, timed, workload, losses=self.losses)
        self.batches = self.steps.batches  # one batch stream for both loops
        self.bare: list[float] = []
        self.suite: list[float] = []
        self.sections: list[_Sections] = []
        self.tracker_samples: list[int] = []
        self.tracker_cpu: list[float] = []
        self.bare_cpu_cores: list[float] = []  # cores the training step keeps busy (process CPU / wall, bare loop)

    def bare_block(self) -> None:
        """``steps`` steps of a hand-written loop: the workload's step and a synchronize, timed as a whole."""
        config, adapter = self.config, self.adapter
        adapter.synchronize()
        start, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(config.steps):
            self.workload.train_step(next(self.batches))
        adapter.synchronize()
        wall = time.perf_counter() - start
        self.bare.append(wall / config.steps)
        self.bare_cpu_cores.append((time.process_time() - cpu0) / wall)

    def suite_block(self, mlperf: MlperfLog, devnull: Any, blocks: int) -> None:
        """``steps`` steps of the suite's own loop with its MLPerf log and progress events, each section timed."""
        config, steps = self.config, self.steps
        self.block_sections = _Sections()
        first = len(steps.timings)
        with self.block_sections.timed("mlperf_log"):
            mlperf.start(constants.BLOCK_START, metadata={"first_step": first, "step_count": config.steps})
        mlperf_start = self.block_sections.wall["mlperf_log"], self.block_sections.cpu["mlperf_log"]
        steps.start_clock()
        sections = self.block_sections = _Sections()  # start_clock's one synchronize is the bare loop's too
        sections.wall["mlperf_log"], sections.cpu["mlperf_log"] = mlperf_start
        for _ in range(config.steps):
            batch = next(self.batches)
            with sections.timed("batch_ready"):
                steps.batch_ready(batch)
            loss = self.workload.train_step(batch)
            with sections.timed("step_end"):
                steps.step_end(loss)
            with sections.timed("progress_event"):
                emit(devnull, step=len(steps.timings), total=config.steps * blocks, loss=self.losses[-1])
        with sections.timed("mlperf_log"):
            mlperf.end(constants.BLOCK_STOP, metadata={"first_step": first, "step_count": config.steps})
        self.suite.append(sum(t.step_time_s for t in steps.timings[first:]) / config.steps)
        for name in ("synchronize", "step_boundary"):  # timed inside step_end: counted once, on their own
            sections.wall["step_end"] -= sections.wall[name]
            sections.cpu["step_end"] -= sections.cpu[name]
        self.sections.append(sections)


def _figures(config: RunConfig, blocks: int, bare: list[float], suite: list[float], sections: list[_Sections],
             tracker_cpu: list[float], tracker_samples: list[int], bare_cpu_cores: list[float],
             cost: dict[str, float]) -> dict[str, Any]:
    import psutil
    import torch

    cores = psutil.cpu_count() or 1
    steps = config.steps
    # per block: the harness's own seconds per step over the bare step time, plus the share of the machine the
    # tracker process takes (its cores over all logical cores: what a step that keeps every core busy loses)
    harness = [sum(s.wall.values()) / steps for s in sections]
    tracker_share = [f / cores for f in tracker_cpu]
    estimates = [h / b + t for h, b, t in zip(harness, bare, tracker_share, strict=True)]
    overhead, low, high = mean_interval(estimates)
    paired = [s / b - 1.0 for s, b in zip(suite, bare, strict=True)]
    paired_mean, paired_low, paired_high = mean_interval(paired)
    decomposition = {}
    for name, meaning in SECTIONS.items():
        wall = [s.wall[name] / steps for s in sections]
        decomposition[name] = {"wall_s_per_step": statistics.fmean(wall),
                               "cpu_s_per_step": statistics.fmean(s.cpu[name] / steps for s in sections),
                               "fraction_of_step": statistics.fmean(w / b for w, b in zip(wall, bare, strict=True)),
                               "what": meaning}
    decomposition["tracker_process"] = {
        "cpu_cores": statistics.fmean(tracker_cpu), "fraction_of_step": statistics.fmean(tracker_share),
        "what": f"host RAM sampler and MLflow system metrics in their own process: its CPU over {cores} logical "
                "cores (an upper bound: what it takes from a step that keeps every core busy)"}
    return {
        "overhead_fraction": overhead,
        "overhead_ci95": [low, high],
        "method": "decomposition: suite's per-step sections timed in place (wall) / bare step time + tracker "
                  "process CPU / logical cores; mean and 95 % t-interval over the blocks",
        "decomposition": decomposition,
        "harness_s_per_step_blocks": harness,
        "paired_overhead_fraction": paired_mean,
        "paired_overhead_ci95": [paired_low, paired_high],
        "paired_method": "cross-check: suite block step time / the bare block's before it - 1; mean and 95 % "
                         "t-interval over the pairs (noise of the machine included)",
        "bare_step_time_s": statistics.median(bare),
        "suite_step_time_s": statistics.median(suite),
        "bare_step_time_s_blocks": bare,
        "suite_step_time_s_blocks": suite,
        "training_cpu_cores": statistics.fmean(bare_cpu_cores),
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
        "settings": {"config": config.to_dict(), "steps_per_block": steps, "blocks": blocks,
                     "torch": torch.__version__, "logical_cores": cores},
    }
