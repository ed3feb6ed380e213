"""The configuration process: one configuration, warm-up steps then measured steps, in this process.

The runner starts it fresh per configuration (``python -m suite.run.process --run-folder runs/<name>``) so that
memory figures are clean and a crash cannot take the matrix down. It reads ``config.json`` and ``run.json`` from
its run folder and writes ``result.json``, ``manifest.json`` and ``mlperf.log`` there (through
:class:`suite.results.store.RunFiles`). Any failure becomes a FAILED result with a one-line reason; the traceback
and a readable account of the run (phases, steps, outcome) go to stderr, which the runner keeps as ``run.log``.
The result is also sent to the runner as the last event, before the files are written, so a full disk cannot
lose it; if the runner is gone (killed), the run goes on and its result.json waits for ``suite recover``.
"""

from __future__ import annotations

import time

#: When this process's own Python began (before its imports): the end of the interpreter's start.
STARTED_AT = time.time()

import argparse  # noqa: E402 - after STARTED_AT on purpose
import json  # noqa: E402
import os  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from mlperf_logging.mllog import constants  # noqa: E402

from suite.config import RunConfig  # noqa: E402
from suite.errors import RecordingError, SuiteError  # noqa: E402
from suite.events import LAUNCHED_AT_ENV, emit  # noqa: E402
from suite.meters.contention import ContentionMeter  # noqa: E402
from suite.meters.setup import SetupClock  # noqa: E402
from suite.registry import load_device, load_workload  # noqa: E402
from suite.results.environment import accelerator_environment  # noqa: E402
from suite.results.manifest import BEFORE_THE_RUN, build_manifest  # noqa: E402
from suite.results.mlperf_log import MlperfLog, log_disclosures  # noqa: E402
from suite.results.record import FAILED, FINISHED, RunResult  # noqa: E402
from suite.results.store import RunFiles  # noqa: E402
from suite.run.quality import QualityTracker  # noqa: E402
from suite.run.ranks import HostGroup, Rank, aggregate_ranks  # noqa: E402
from suite.run.steps import TrainingSteps, prepare_device  # noqa: E402
from suite.text import visible  # noqa: E402

EmitFn = Callable[..., None]


def _no_emit(**_: Any) -> None:
    pass


def _log_traceback() -> None:
    """The exception being handled, into the run's log (stderr), its control characters made visible: a file name
    quoted in it is data."""
    try:
        sys.stderr.write(visible(traceback.format_exc(), keep_newlines=True))
        sys.stderr.flush()
    except OSError:  # a log that cannot be written (full disk) must not end the run
        pass


def _one_line(exc: BaseException) -> str:
    """A one-line reason; for an error re-raised from a DataLoader worker, the worker's original error."""
    message = str(exc)
    if "Original Traceback" in message:
        last = [line.strip() for line in message.splitlines() if line.strip()][-1]
        return f"in a loader worker: {last}"
    text = " ".join(message.split()) or repr(exc)
    if isinstance(exc, MemoryError):
        return f"out of memory (MemoryError{': ' + text if text != repr(exc) else ''})"
    return text if isinstance(exc, SuiteError) else f"{type(exc).__name__}: {text}"


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
    rank = rank or Rank()
    setup = setup or SetupClock()
    started_at = started_at or time.time()

    def first_step_done(timing: Any) -> None:
        setup.add("loader_start", timing.data_wait_s)
        setup.add("first_step", time.time() - started_at)

    if config.batch_size is None:
        raise ValueError("execute() needs a resolved batch_size (see suite.run.matrix.resolve)")
    result = RunResult(config=config, status=FAILED, started_at=time.time())
    facts = result.facts
    facts["warmup_steps_excluded"] = config.warmup_steps
    facts["batch_size_used"] = None
    adapter = workload = host = None
    mlperf = MlperfLog(mllog_path)
    try:
        mlperf.event(constants.SUBMISSION_BENCHMARK, config.workload)
        _clear_caches(config, mlperf, facts)
        mlperf.start(constants.INIT_START)
        if rank.world_size % config.nproc_per_node:
            raise SuiteError(f"nproc_per_node is {config.nproc_per_node} but {rank.world_size} process(es) run, "
                             "not a whole number of nodes")
        emit_event(phase="device setup")
        with setup.phase("device"):
            adapter = load_device(config.device)(local_rank=rank.local_rank)
            adapter.setup()
            if rank.world_size > 1:
                import torch.distributed as dist

                dist.init_process_group(backend=adapter.distributed_backend)
                host = HostGroup.create()  # host figures between ranks: NCCL/HCCL carry device tensors only
                facts["world_size"] = rank.world_size
                facts["nodes"] = rank.world_size // config.nproc_per_node
                facts["distributed_backend"] = adapter.distributed_backend
            facts["global_batch_size"] = config.batch_size * rank.world_size
            facts["device"] = adapter.device_info()
            facts["accelerator_environment"] = accelerator_environment(facts["device"])
            prepare_device(config, adapter)
        workload = load_workload(config.workload)(config, adapter)
        emit_event(phase="workload setup")
        try:
            workload.setup()
        finally:
            for phase, seconds in workload.setup_clock.seconds.items():
                setup.add(phase, seconds)
        facts["workload"] = workload.facts()
        facts["precision_used"] = config.precision
        facts["run_params"] = adapter.run_params()
        _log_hyperparameters(mlperf, config, workload, rank)
        facts["submission"] = log_disclosures(mlperf, config, facts["device"], adapter.numerics(config.precision),
                                              rank.world_size, config_filename,
                                              type(workload).recipe_deviations(config))
        mlperf.end(constants.INIT_STOP)
        mlperf.start(constants.RUN_START)
        quality = QualityTracker(config, workload, mlperf, emit_event, rank.rank, host, time.monotonic(),
                                 config.batch_size * rank.world_size)
        if config.engine == "hf-trainer":
            _train_with_trainer(config, adapter, workload, result, emit_event, mlperf, rank, quality, first_step_done)
        else:
            _train(config, adapter, workload, result, emit_event, mlperf, rank, quality, first_step_done, host)
        result.metrics.update(workload.metrics())
        facts["workload"] = workload.facts()  # with what the run itself learnt (e.g. images decoded on the host)
        _record_observed_loader(result, workload)
        mlperf.end(constants.RUN_STOP, metadata={"status": "success"})
        result.status = FINISHED
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, none lost
        result.status = FAILED
        result.reason = _one_line(exc)
        _log_traceback()
        if workload is not None:
            _record_observed_loader(result, workload)
        mlperf.abort()
    except BaseException:  # interrupted: close the MLPerf log's intervals, then let it propagate
        mlperf.abort()
        raise
    finally:
        result.metrics.update(setup.metrics())
        mlperf.close()
        if mlperf.write_error:
            facts.setdefault("recording_errors", []).append(mlperf.write_error)
        for closer in (workload, adapter):
            if closer is not None:
                try:
                    closer.teardown()
                except Exception:  # noqa: BLE001 - teardown must not mask the run's own outcome
                    _log_traceback()
        if rank.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                try:  # every rank done with its collectives before any closes its connections: a rank that
                    if host is not None:  # destroyed the group under another's last send aborted it (gloo, CI)
                        host.barrier()
                except Exception:  # noqa: BLE001 - a peer already gone: nothing left to wait for
                    _log_traceback()
                dist.destroy_process_group()
        result.ended_at = time.time()
    return result


def _record_observed_loader(result: RunResult, workload: Any) -> None:
    """What the workload's loader really was (the pipeline built, the DataLoader that ran), for the audit."""
    try:
        observed = workload.observed_loader()
    except Exception:  # noqa: BLE001 - a workload that cannot say leaves the facts absent (the audit fails)
        _log_traceback()
        return
    for key in ("loader", "num_workers", "prefetch_factor", "decoder"):
        if key in observed:
            result.facts[f"{key}_used"] = observed[key]


def _log_hyperparameters(mlperf: MlperfLog, config: RunConfig, workload: Any, rank: Rank) -> None:
    mlperf.event(constants.SEED, config.seed)
    mlperf.event(constants.GLOBAL_BATCH_SIZE, config.batch_size * rank.world_size)
    mlperf.event(constants.GRADIENT_ACCUMULATION_STEPS, 1)
    for key, value in workload.mlperf_hyperparameters().items():
        mlperf.event(key, value)
    for key in ("device", "num_workers", "loader", "precision", "warmup_steps", "steps"):
        mlperf.event(f"suite_{key}", getattr(config, key))


def _train(config: RunConfig, adapter: Any, workload: Any, result: RunResult, emit_event: EmitFn,
           mlperf: MlperfLog | None = None, rank: Rank | None = None, quality: QualityTracker | None = None,
           first_step_done: Callable[[Any], None] | None = None, host: HostGroup | None = None) -> None:
    """Warm-up then measured steps (up to ``config.most_steps``); evaluations between steps, off the clock."""
    rank = rank or Rank()
    mlperf = mlperf or MlperfLog(None)
    global_batch = config.batch_size * rank.world_size
    quality = quality or QualityTracker(config, workload, mlperf, emit_event, rank.rank, host, time.monotonic(),
                                        global_batch)
    total = config.total_steps
    steps = TrainingSteps(config, adapter, workload, losses=result.losses)
    emit_event(phase="training", total=total)
    adapter.reset_peak_memory()
    steps.start_clock()
    flops_per_step: float | None = None
    done = 0
    # contention of this configuration's own processes: under torchrun every local rank, so the launcher's tree
    own = ContentionMeter(os.getppid() if rank.world_size > 1 else None)
    block = _MeasuredBlock(config, mlperf, global_batch, own)
    for step in range(total):
        if step == config.warmup_steps:
            block.start()
        if step == 0 and config.warmup_steps > 0:  # count model FLOPs once, in an unmeasured step
            flops_per_step = _counted_step(steps)
        else:
            steps.step()
        done = step + 1
        if step == 0 and first_step_done is not None:
            first_step_done(steps.timings[0])
        emit_event(step=done, total=total, loss=result.losses[-1])
        if _evaluate_between_steps(quality, steps, done):
            break
    block.end(done, result)
    stats = steps.record(result)
    if stats is None:
        raise SuiteError(f"no measured step: the run stopped after {done} steps, within its {config.warmup_steps} "
                         "warm-up steps")
    if host is not None:
        aggregate_ranks(result, host)
    _record_flops(result, flops_per_step, rank)
    mlperf.event("throughput", result.metrics["throughput_samples_per_s"], metadata={"unit": "samples/s"})
    quality.finish(result, done)
    emit_event(phase="finishing", compute_done=True)  # the runner may start the next configuration's process now


def _train_with_trainer(config: RunConfig, adapter: Any, workload: Any, result: RunResult, emit_event: EmitFn,
                        mlperf: MlperfLog, rank: Rank, quality: QualityTracker,
                        first_step_done: Callable[[Any], None] | None = None) -> None:
    """Engine hf-trainer: the workload's trainer drives the steps; the suite's clock and accounting time them."""
    if rank.world_size > 1:
        raise SuiteError("engine hf-trainer runs on one device per configuration (use engine suite to scale out)")
    total = config.total_steps
    steps = TrainingSteps(config, adapter, workload, losses=result.losses)
    block = _MeasuredBlock(config, mlperf, config.batch_size, ContentionMeter())
    emit_event(phase="training (hf-trainer)", total=total)

    class Hooks:
        block_started = False

        def begin(self) -> None:
            adapter.reset_peak_memory()
            steps.start_clock()

        def batch_ready(self, batch: Any) -> None:
            if len(steps.timings) == config.warmup_steps and not self.block_started:
                block.start()
                self.block_started = True
            steps.batch_ready(batch)

        def step_end(self, loss: Any) -> bool:
            """After each optimizer step; True asks the trainer to stop (the quality target is met)."""
            steps.step_end(loss)
            done = len(steps.timings)
            if done == 1 and first_step_done is not None:
                first_step_done(steps.timings[0])
            emit_event(step=done, total=total, loss=result.losses[-1])
            return _evaluate_between_steps(quality, steps, done)

    trainer_figures = workload.train_with_trainer(Hooks())
    result.facts["workload"] = workload.facts()  # now including what the trainer built
    done = len(steps.timings)
    if done != total and quality.reached is None:
        raise SuiteError(f"the trainer ran {done} steps, not {total}")
    block.end(done, result)
    steps.record(result)
    for key, value in trainer_figures.items():
        result.metrics[f"trainer_{key}"] = float(value)
    result.facts["engine"] = ("transformers Trainer driving the steps; step times, data-wait and throughput by the "
                              "suite's clock over the measured steps; trainer_* metrics are the trainer's own "
                              "(all steps, warm-up and start-up included)")
    result.facts["mfu"] = "not measured with engine hf-trainer"
    mlperf.event("throughput", result.metrics["throughput_samples_per_s"], metadata={"unit": "samples/s"})
    quality.finish(result, done)
    emit_event(phase="finishing", compute_done=True)


class _MeasuredBlock:
    """The measured window of both engines: MLPerf's block_start/block_stop around the measured steps, and how busy
    the machine was with other work meanwhile (see suite.meters.contention)."""

    def __init__(self, config: RunConfig, mlperf: MlperfLog, global_batch: int, contention: ContentionMeter) -> None:
        self.config, self.mlperf, self.global_batch, self.contention = config, mlperf, global_batch, contention

    def start(self) -> None:
        first = self.config.warmup_steps
        self.mlperf.start(constants.BLOCK_START, metadata={"first_step": first, "step_count": self.config.most_steps,
                                                           "samples_count": first * self.global_batch})
        self.contention.start()

    def end(self, done: int, result: RunResult) -> None:
        """After ``done`` steps in all (warm-up included)."""
        first = self.config.warmup_steps
        self.mlperf.end(constants.BLOCK_STOP, metadata={"first_step": first, "step_count": done - first,
                                                        "samples_count": done * self.global_batch})
        reading = self.contention.stop()
        if reading is not None:
            result.metrics.update(reading.metrics())
            result.facts["contention"] = reading.facts()


def _evaluate_between_steps(quality: QualityTracker, steps: TrainingSteps, done: int) -> bool:
    """Evaluate when due after ``done`` steps; the step clock restarts after it, so the evaluation is in no step's
    time. True: the quality target is met (stop training)."""
    if not quality.due(done):
        return False
    stop = quality.evaluate(done)
    steps.start_clock()
    return stop


def _clear_caches(config: RunConfig, mlperf: MlperfLog, facts: dict[str, Any]) -> None:
    """MLPerf's cache_clear: with --clear-caches, drop the OS page cache (root only) and say whether it happened."""
    cleared, how = False, "not requested (--clear-caches)"
    if config.clear_caches:
        try:
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            cleared, how = True, "page cache, dentries and inodes dropped (/proc/sys/vm/drop_caches)"
        except OSError as exc:
            how = f"could not drop the page cache: {exc.strerror or exc} (needs root)"
    facts["cache_clear"] = {"cleared": cleared, "how": how}
    mlperf.event(constants.CACHE_CLEAR, cleared, metadata={"how": how})


def _counted_step(steps: "TrainingSteps") -> float:
    """One training step under ``torch.utils.flop_counter``; its FLOPs (forward + backward, this rank)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        steps.step()
    return float(counter.get_total_flops())


def _record_flops(result: RunResult, flops_per_step: float | None, rank: Rank) -> None:
    """Model FLOP/s achieved over the measured steps, and MFU against the device's dense bf16 peak."""
    facts = result.facts
    if flops_per_step is None:
        facts["mfu"] = "not measured: FLOPs are counted in the first warm-up step and there was none"
        return
    m = result.metrics
    achieved = flops_per_step * m["measured_steps"] / m["measured_wall_s"]  # per device
    m["model_flops_per_step"] = flops_per_step
    m["model_flops_per_s"] = achieved
    peak = (facts.get("device") or {}).get("peak_bf16_flops")
    if peak:
        m["mfu_bf16_peak"] = achieved / float(peak)
        facts["mfu"] = (f"model FLOPs per step (torch.utils.flop_counter, forward+backward, counted once on rank "
                        f"{rank.rank}) x measured steps / measured wall time / dense bf16 peak {peak:.4g} FLOP/s")
    else:
        facts["mfu"] = "not computed: no peak FLOP/s is known for this device"


class RunLog:
    """A readable account of the run on stderr (the runner keeps it as ``run.log``): phases, the first steps
    and then about 50 more spread over the run, and the outcome."""

    def __init__(self, stream: Any = None) -> None:
        self._stream = stream or sys.stderr
        self._started = time.monotonic()

    def line(self, text: str) -> None:
        try:
            self._stream.write(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - self._started:7.1f}s] "
                               f"{visible(text)}\n")
            self._stream.flush()
        except OSError:  # a log that cannot be written (full disk) must not end the run
            pass

    def event(self, event: dict[str, Any]) -> None:
        if "eval_accuracy" in event:
            self.line(f"evaluation after step {event['step']}: eval_accuracy {event['eval_accuracy']:.4g}")
        elif "phase" in event:
            self.line(f"phase: {event['phase']}")
        elif "step" in event:
            step, total = event["step"], event["total"]
            if step <= 5 or step == total or step % max(1, total // 50) == 0:
                self.line(f"step {step}/{total}: loss {event['loss']:.6g}")


def preload(workload: str, device: str) -> None:
    """Import the modules a configuration of ``workload`` on ``device`` needs (see ``Workload.preload``). An error
    is left for the run itself to meet and record, with its reason."""
    try:
        load_device(device)
        load_workload(workload).preload()
    except Exception:  # noqa: BLE001 - the run's set-up raises it again, where it is recorded
        pass


def _wait_for_turn() -> Path | None:
    """Standby: block until the runner writes the run folder on stdin; ``None`` when it closes stdin instead."""
    line = sys.stdin.readline()
    return Path(line.strip()) if line.strip() else None


def _stderr_into(path: Path) -> None:
    """Standby: from now on stderr is the run's log; what was written before (import warnings) goes first."""
    sys.stderr.flush()
    early = b""
    try:
        if stat.S_ISREG(os.fstat(2).st_mode):
            os.lseek(2, 0, os.SEEK_SET)
            while chunk := os.read(2, 1 << 16):
                early += chunk
    except OSError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if early:
            os.write(fd, early)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
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
        run_folder = _wait_for_turn()
        if run_folder is None:
            return 0  # not needed after all (the matrix ended or changed course), or the runner is gone
        started_at = time.time()
        _stderr_into(RunFiles(run_folder.resolve().parent.parent, run_folder.resolve().name).log)
    files = RunFiles(run_folder.resolve().parent.parent, run_folder.resolve().name)
    with open(files.config) as fh:
        config = RunConfig.from_dict(json.load(fh))
    info = json.loads(files.run_info.read_text()) if files.run_info.is_file() else {}
    if not args.standby:
        preload(config.workload, config.device)
        clock.add("imports", time.time() - STARTED_AT)
        started_at = launched_at
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
                                                       info.get("command") or sys.argv, BEFORE_THE_RUN))
        except RecordingError as exc:
            log.line(f"could not write the manifest before the run ({exc}); the runner keeps one in its rescue")
    result = execute(config, emit_event=report, mllog_path=str(files.mllog) if leader else None, rank=rank,
                     config_filename=f"{files.relative_folder}/config.json", setup=clock, started_at=started_at)
    result.facts["started_ahead"] = bool(args.standby)
    result.run_uid, result.repeat = info.get("run_uid"), int(info.get("repeat", 0))
    log.line(f"{result.status}" + (f": {result.reason}" if result.reason else "")
             + (f"; {result.metrics['throughput_samples_per_s']:.2f} samples/s"
                if "throughput_samples_per_s" in result.metrics else ""))
    if not leader:
        return 0 if result.status == FINISHED else 1
    result.facts.update(files.facts())
    emit(result=result.to_dict())  # the runner holds it now, whatever happens to the files below
    try:
        files.write(files.manifest, build_manifest(result, info.get("command") or sys.argv))
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
