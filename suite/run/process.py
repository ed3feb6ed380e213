"""The configuration process: one configuration, warm-up steps then measured steps, in this process.

The runner starts it fresh per configuration (``python -m suite.run.process --run-folder runs/<name>``) so that
memory figures are clean and a crash cannot take the matrix down. It reads ``config.json`` and ``run.json`` from
its run folder and writes ``result.json``, ``manifest.json`` and ``mlperf.log`` there (through
:class:`suite.results.files.RunFiles`). Any failure becomes a FAILED result with a one-line reason; the traceback
and a readable account of the run (phases, steps, outcome) go to stderr, which the runner keeps as ``run.log``.
The result is also sent to the runner as the last event, before the files are written, so a full disk cannot
lose it; if the runner is gone (killed), the run goes on and its result.json waits for ``suite recover``.
"""

from __future__ import annotations

import time

#: When this process's own Python began (before its imports): the end of the interpreter's start.
STARTED_AT = time.time()

import argparse  # noqa: E402 - after STARTED_AT on purpose
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

from mlperf_logging.mllog import constants  # noqa: E402

from suite.config import RunConfig  # noqa: E402
from suite.devices.base import prepare_device, run_params  # noqa: E402
from suite.errors import RecordingError, SuiteError  # noqa: E402
from suite.events import LAUNCHED_AT_ENV, emit  # noqa: E402
from suite.figures import THROUGHPUT_SAMPLES_PER_S  # noqa: E402
from suite.meters.host_ram import kept_shared_with_forks  # noqa: E402
from suite.meters.setup import SetupClock  # noqa: E402
from suite.redact import redact_argv  # noqa: E402
from suite.registry import load_device, load_workload  # noqa: E402
from suite.results.environment import accelerator_environment  # noqa: E402
from suite.results.files import RunFiles  # noqa: E402
from suite.results.manifest import BEFORE_THE_RUN, build_manifest  # noqa: E402
from suite.results.mlperf_log import MlperfLog, log_disclosures, run_stop_metadata  # noqa: E402
from suite.results.record import FAILED, FINISHED, RunResult  # noqa: E402
from suite.run.quality import QualityTracker  # noqa: E402
from suite.run.ranks import HostGroup, Rank  # noqa: E402
from suite.run.runlog import RunLog  # noqa: E402
from suite.run.standby import preload, stderr_into, wait_for_turn  # noqa: E402
from suite.run.training import (  # noqa: E402
    EmitFn,
    clear_caches,
    log_hyperparameters,
    log_traceback,
    one_line,
    record_observed_loader,
    train,
    train_with_trainer,
)

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter
    from suite.workload import Workload


def _no_emit(**_: Any) -> None:
    pass


def execute(config: RunConfig, emit_event: EmitFn = _no_emit, mllog_path: str | None = None,
            rank: Rank | None = None, config_filename: str = "config.json", setup: SetupClock | None = None,
            started_at: float | None = None) -> RunResult:
    """Run ``config`` here and return its result; never raises for a failure of the run itself.

    With ``mllog_path``, an MLPerf-format log of the run is written there (see :mod:`suite.results.mlperf_log`).
    Under torchrun (``rank.world_size > 1``) every rank trains on its share of each global batch with the
    device's distributed backend, and the result aggregates the ranks: global throughput over the
    slowest rank's wall time, device peak memory as the maximum per rank, data-wait as the mean.

    Set-up phases are timed into ``setup`` (the caller may have timed the process start and imports into it) and
    recorded as ``setup_<phase>_s`` (:mod:`suite.meters.setup`), failed runs included; ``started_at`` (wall
    clock) is when the configuration was handed to this process, the start of its first-step latency.
    """
    if config.batch_size is None:
        raise ValueError("execute() needs a resolved batch_size (see suite.run.matrix.resolve)")
    run = _Execution(config, emit_event, MlperfLog(mllog_path), rank or Rank(), setup or SetupClock(),
                     started_at or time.time())
    try:
        run.mlperf.event(constants.SUBMISSION_BENCHMARK, config.workload)
        clear_caches(config, run.mlperf, run.facts)
        run.mlperf.start(constants.INIT_START)
        run.set_up_device()
        run.set_up_workload(config_filename)
        with kept_shared_with_forks() as frozen:  # before the loader workers fork, at the first batch
            run.facts["gc_frozen_objects"] = frozen
            run.train()
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, none lost
        run.failed(exc)
    finally:  # interrupted too (propagating): the MLPerf log's intervals closed as aborted, then torn down
        run.close()
    return run.result


class _Execution:
    """One :func:`execute` call: its device, workload, MLPerf log and the result being filled."""

    def __init__(self, config: RunConfig, emit_event: EmitFn, mlperf: MlperfLog, rank: Rank, setup: SetupClock,
                 started_at: float) -> None:
        self.config, self.emit_event, self.mlperf, self.rank = config, emit_event, mlperf, rank
        self.setup, self.started_at = setup, started_at
        self.result = RunResult(config=config, status=FAILED, started_at=time.time())
        self.facts = self.result.facts
        self.facts["warmup_steps_excluded"] = config.warmup_steps
        self.facts["batch_size_used"] = None
        self.facts["precision_used"] = None
        self.adapter: DeviceAdapter | None = None
        self.workload: Workload | None = None
        self.host: HostGroup | None = None

    @property
    def ready_device(self) -> DeviceAdapter:
        """The device adapter, once :meth:`set_up_device` has made it."""
        if self.adapter is None:
            raise RuntimeError("the device is not set up yet")
        return self.adapter

    @property
    def ready_workload(self) -> Workload:
        """The workload, once :meth:`set_up_workload` has made it."""
        if self.workload is None:
            raise RuntimeError("the workload is not set up yet")
        return self.workload

    def first_step_done(self, timing: Any) -> None:
        self.setup.add("loader_start", timing.data_wait_s)
        self.setup.add("first_step", time.time() - self.started_at)

    def set_up_device(self) -> None:
        config, rank, facts = self.config, self.rank, self.facts
        if rank.world_size % config.nproc_per_node:
            raise SuiteError(f"nproc_per_node is {config.nproc_per_node} but {rank.world_size} process(es) run, "
                             "not a whole number of nodes")
        self.emit_event(phase="device setup")
        with self.setup.phase("device"):
            adapter = self.adapter = load_device(config.device)(local_rank=rank.local_rank)
            adapter.setup()
            if rank.world_size > 1:
                import torch.distributed as dist

                dist.init_process_group(backend=adapter.traits.distributed_backend)
                self.host = HostGroup.create()  # host figures between ranks: NCCL/HCCL carry device tensors only
                facts["world_size"] = rank.world_size
                facts["nodes"] = rank.world_size // config.nproc_per_node
                facts["distributed_backend"] = adapter.traits.distributed_backend
            facts["global_batch_size"] = config.batch * rank.world_size
            facts["device"] = adapter.facts()
            facts["accelerator_environment"] = accelerator_environment(facts["device"])
            prepare_device(config, adapter)

    def set_up_workload(self, config_filename: str) -> None:
        config, facts, adapter, mlperf = self.config, self.facts, self.ready_device, self.mlperf
        workload = self.workload = load_workload(config.workload)(config, adapter)
        self.emit_event(phase="workload setup")
        try:
            workload.setup()
        finally:
            for phase, seconds in workload.setup_clock.seconds.items():
                self.setup.add(phase, seconds)
        facts["workload"] = workload.facts()
        facts["run_params"] = run_params(adapter)
        facts["method_deviations"] = type(workload).method_deviations(config, facts["run_params"])
        log_hyperparameters(mlperf, config, workload, self.rank)
        lowest = adapter.numerics().lowest_precisions(config.precision)
        facts["submission"] = log_disclosures(mlperf, config, facts["device"], lowest, self.rank.world_size,
                                              config_filename, type(workload).recipe_deviations(config))
        mlperf.end(constants.INIT_STOP)

    def train(self) -> None:
        config, rank, mlperf, workload, result = self.config, self.rank, self.mlperf, self.ready_workload, self.result
        adapter = self.ready_device
        mlperf.start(constants.RUN_START)
        quality = QualityTracker(config, workload, mlperf, self.emit_event, rank.rank, self.host, time.monotonic(),
                                 config.batch * rank.world_size)
        if config.engine == "hf-trainer":
            train_with_trainer(config, adapter, workload, result, self.emit_event, mlperf, rank, quality,
                               self.first_step_done)
        else:
            train(config, adapter, workload, result, self.emit_event, mlperf, rank, quality,
                  self.first_step_done, self.host)
        result.metrics.update(workload.metrics())
        self.facts["workload"] = workload.facts()  # with what the run itself learnt (e.g. images decoded on the host)
        self.facts["precision_used"] = workload.precision_ran()  # observed in the forward pass, never the request
        record_observed_loader(result, workload)
        mlperf.end(constants.RUN_STOP, metadata=run_stop_metadata(config))
        result.status = FINISHED

    def failed(self, exc: Exception) -> None:
        """The run failed with ``exc``: its reason kept. A second error while its traceback and loader are logged (an
        exception from a signal handler can be raised anywhere) is logged too, never put in its place."""
        self.result.status = FAILED
        self.result.reason = one_line(exc)
        try:
            log_traceback()
            if self.workload is not None:
                self.facts["precision_used"] = self.workload.precision_ran()
                record_observed_loader(self.result, self.workload)
        except Exception:  # noqa: BLE001 - the run's own failure is what the result says
            log_traceback()

    def close(self) -> None:
        """Set-up figures into the result, the MLPerf log closed, workload and device torn down, the process group
        left once every rank is done."""
        result, mlperf = self.result, self.mlperf
        result.metrics.update(self.setup.metrics())
        if result.status != FINISHED:  # every open interval ends, aborted with the reason (MLPerf asks why)
            mlperf.abort(result.reason or "interrupted")
        mlperf.close()  # raises on an interval a finished run left open: a defect of the suite's own
        if mlperf.write_error:
            self.facts.setdefault("recording_errors", []).append(mlperf.write_error)
        for closer in (self.workload, self.adapter):
            if closer is not None:
                try:
                    closer.teardown()
                except Exception:  # noqa: BLE001 - teardown must not mask the run's own outcome
                    log_traceback()
        if self.rank.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                try:  # every rank done with its collectives before any closes its connections: a rank that
                    if self.host is not None:  # destroyed the group under another's last send aborted it (gloo, CI)
                        self.host.barrier()
                except Exception:  # noqa: BLE001 - a peer already gone: nothing left to wait for
                    log_traceback()
                dist.destroy_process_group()
        result.ended_at = time.time()


def _take_run(argv: list[str] | None) -> tuple[Any, RunFiles, RunConfig, dict[str, Any], SetupClock, float] | None:
    """The command line read, the imports done and timed, the run folder taken (in standby: once the runner hands it
    over); ``None`` when a standby process is not needed after all."""
    parser = argparse.ArgumentParser(prog="python -m suite.run.process", description=__doc__)
    parser.add_argument("--run-folder", type=Path,
                        help="the run's folder (runs/<name>) holding config.json and, from the runner, run.json")
    parser.add_argument("--standby", metavar="WORKLOAD,DEVICE",
                        help="started ahead of its turn: import what WORKLOAD on DEVICE needs, then wait for the run "
                             "folder on stdin (exit quietly at end of input)")
    args = parser.parse_args(argv)
    if (args.run_folder is None) == (args.standby is None):
        parser.error("give exactly one of --run-folder and --standby")
    clock = SetupClock()
    launched_at = float(os.environ.get(LAUNCHED_AT_ENV) or STARTED_AT)
    clock.add("process_start", STARTED_AT - launched_at)
    run_folder = args.run_folder
    if args.standby:
        workload_name, _, device_name = args.standby.partition(",")
        preload(workload_name, device_name)
        clock.add("imports", time.time() - STARTED_AT)
        run_folder = wait_for_turn()
        if run_folder is None:
            return None  # not needed after all (the matrix ended or changed course), or the runner is gone
        started_at = time.time()
        stderr_into(RunFiles(run_folder.resolve().parent.parent, run_folder.resolve().name).log)
    files = RunFiles(run_folder.resolve().parent.parent, run_folder.resolve().name)
    config = files.read_config()
    info = files.read_run_info()
    if not args.standby:
        preload(config.workload, config.device)
        clock.add("imports", time.time() - STARTED_AT)
        started_at = launched_at
    return args, files, config, info, clock, started_at


def main(argv: list[str] | None = None) -> int:
    taken = _take_run(argv)
    if taken is None:
        return 0
    args, files, config, info, clock, started_at = taken
    rank = Rank.from_environment()
    leader = rank.rank == 0  # only rank 0 reports progress and writes the result and the MLPerf log
    log = RunLog()
    log.line(f"configuration {config.config_id} ({config.describe()}), rank {rank.rank} of {rank.world_size}")

    def report(**event: Any) -> None:
        log.event(event)
        if leader:
            emit(**event)

    if args.standby:
        log.line(f"started ahead of its turn: imports took {clock.seconds['imports']:.1f} s before the hand-over")
    if leader:  # a manifest before the run: a disk that fills during it cannot take away what a re-run needs
        try:
            files.write(files.manifest, build_manifest(RunResult(config=config, status="RUNNING"),
                                                       info.get("command") or redact_argv(sys.argv), BEFORE_THE_RUN))
        except RecordingError as exc:
            log.line(f"could not write the manifest before the run ({exc}); the runner keeps one in its rescue")
    result = execute(config, emit_event=report, mllog_path=str(files.mllog) if leader else None, rank=rank,
                     config_filename=f"{files.relative_folder}/config.json", setup=clock, started_at=started_at)
    result.facts["started_ahead"] = bool(args.standby)
    result.run_uid, result.repeat = info.get("run_uid"), int(info.get("repeat", 0))
    log.line(f"{result.status}" + (f": {result.reason}" if result.reason else "")
             + (f"; {result.metrics['throughput_samples_per_s']:.2f} samples/s"
                if THROUGHPUT_SAMPLES_PER_S in result.metrics else ""))
    if not leader:
        return 0 if result.status == FINISHED else 1
    result.facts.update(files.facts())
    emit(result=result.to_dict())  # the runner holds it now, whatever happens to the files below
    try:
        files.write(files.manifest, build_manifest(result, info.get("command") or redact_argv(sys.argv)))
        result.facts.update(files.facts())
        files.write(files.result, result.to_dict())
    except RecordingError as exc:
        log.line(f"could not write the run's files ({exc}); the runner received the result")
        return 1
    # a failed rank 0 under torchrun exits 1 too (its result is sent): torchrun then stops its peers at once instead
    # of waiting at its exit barrier (300 s) for a node that may be gone
    return 1 if rank.world_size > 1 and result.status != FINISHED else 0


if __name__ == "__main__":
    code = main()
    # The result files are written (fsync'ed) and the loader workers stopped: skip the interpreter's finalization of
    # torch and transformers (over a second here), which would only delay the next configuration.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
