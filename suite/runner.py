"""The matrix runner: validate everything, then run each configuration in its own fresh process.

Flow: :func:`resolve` checks the workload, preset and device names and fixes the batch size from the
preset (before anything runs); the workload prepares shared inputs once; each configuration runs as
``python -m suite.execute`` while this process samples the child's host RAM (child + loader workers);
recorders persist every result as soon as it ends. A failed configuration is recorded with its reason
and the matrix goes on.
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from suite.config import MatrixSpec, RunConfig
from suite.errors import ConfigError, UnknownPluginError
from suite.events import parse as parse_event
from suite.fileio import write_json_atomic
from suite.manifest import build_manifest, write_manifest
from suite.recorders.base import MatrixInfo, Recorder
from suite.registry import device_names, load_workload
from suite.results import FAILED, FINISHED, KILLED, RunResult
from suite.scoring import ConfigScore, score_repeats
from suite.trackers.host_ram import HostRamSampler

LOG_TAIL_LINES = 20
#: Failure messages that mean the address space ran out (allocators, mmap of shared libraries).
_LOOKS_LIKE_OOM = re.compile(r"out of memory|MemoryError|can't allocate|cannot allocate memory|failed to map",
                             re.IGNORECASE)


class Progress(Protocol):
    """What the runner tells a progress display (the CLI's is a rich progress bar)."""

    def config_started(self, config: RunConfig, index: int, count: int) -> None: ...
    def event(self, config: RunConfig, event: dict[str, Any]) -> None: ...
    def config_ended(self, result: RunResult) -> None: ...


class NoProgress:
    def config_started(self, config: RunConfig, index: int, count: int) -> None:
        pass

    def event(self, config: RunConfig, event: dict[str, Any]) -> None:
        pass

    def config_ended(self, result: RunResult) -> None:
        pass


def resolve(spec: MatrixSpec) -> tuple[type, list[RunConfig]]:
    """Validate names against the registries and expand the matrix with the preset's batch size.

    Raises :class:`UnknownPluginError` / :class:`ConfigError` naming what is valid, before anything runs.
    """
    workload_cls = load_workload(spec.workload)
    if spec.preset not in workload_cls.presets:
        raise UnknownPluginError(
            f"unknown preset {spec.preset!r} for workload {spec.workload}; "
            f"valid presets: {', '.join(workload_cls.presets)}"
        )
    known_devices = device_names()
    for device in spec.devices:
        if device not in known_devices:
            raise UnknownPluginError(f"unknown device {device!r}; valid devices: {', '.join(known_devices)}")
    batch_size = spec.batch_size or workload_cls.presets[spec.preset].batch_size
    configs = [dataclasses.replace(c, batch_size=batch_size) for c in spec.expand()]
    return workload_cls, configs


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines)).strip()
    except OSError:
        return ""


def _exit_description(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (killed: out of memory?)" if -returncode == signal.SIGKILL else ""
        return f"run process died from {name}{hint}"
    return f"run process exited with status {returncode} without a result"


def _address_space_limit(limit_bytes: int) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec; loader workers inherit it
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


def run_isolated(config: RunConfig, output_dir: Path, progress: Progress | None = None,
                 command: Sequence[str] = (), repeat: int = 0, run_name: str | None = None,
                 memory_limit_bytes: int | None = None, run_uid: str | None = None,
                 sample_interval_s: float = 0.05) -> RunResult:
    """Run one configuration in a fresh Python process and return its result.

    Host RAM (RSS and PSS, summed over the child and its loader workers) is sampled from this
    process for the child's whole lifetime. ``memory_limit_bytes`` caps the address space of the
    child and its loader workers (``RLIMIT_AS``), so one configuration cannot exhaust the machine; going
    over it fails that configuration only. The run's folder ends up holding ``config.json``,
    ``result.json`` (complete), ``manifest.json`` (see :mod:`suite.manifest`) and ``run.log``.
    """
    progress = progress or NoProgress()
    run_dir = output_dir / "runs" / (run_name or config.config_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path, result_path, log_path = run_dir / "config.json", run_dir / "result.json", run_dir / "run.log"
    mllog_path = run_dir / "mlperf.log"
    write_json_atomic(config_path, config.to_dict())
    result_path.unlink(missing_ok=True)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    launcher = [sys.executable]
    if config.nproc_per_node > 1:  # one process per device, through torch.distributed's own launcher
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={config.nproc_per_node}"]
    cmd = [*launcher, "-m", "suite.execute", "--config", str(config_path), "--result", str(result_path),
           "--mllog", str(mllog_path)]
    started = time.time()
    with open(log_path, "w") as log:
        limit = _address_space_limit(memory_limit_bytes) if memory_limit_bytes else None
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, preexec_fn=limit)
        sampler = HostRamSampler(proc.pid, interval_s=sample_interval_s).start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                event = parse_event(line)
                if event is None:
                    log.write(line)
                else:
                    progress.event(config, event)
            returncode = proc.wait()
        except BaseException:  # interrupted: stop the child and its workers, then propagate
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            ram = sampler.stop()
    if result_path.exists():
        import json

        with open(result_path) as fh:
            result = RunResult.from_dict(json.load(fh))
    else:
        tail = _log_tail(log_path)
        last = tail.splitlines()[-1] if tail else ""
        reason = _exit_description(returncode) + (f"; last log line: {last}" if last else "")
        result = RunResult(config=config.to_dict(), status=FAILED, reason=reason, started_at=started,
                           ended_at=time.time())
    result.repeat, result.run_uid = repeat, run_uid
    if memory_limit_bytes:
        result.facts["memory_limit_bytes"] = memory_limit_bytes
        if result.status == FAILED and (returncode < 0 or _LOOKS_LIKE_OOM.search(result.reason or "")):
            result.reason = f"{result.reason} (under a memory limit of {memory_limit_bytes / 2**30:.2f} GiB)"
    if ram.samples:
        result.metrics["host_ram_peak_rss_bytes"] = float(ram.peak_rss_bytes)
        if ram.peak_pss_bytes is not None:
            result.metrics["host_ram_peak_pss_bytes"] = float(ram.peak_pss_bytes)
        result.facts["host_ram_max_processes"] = ram.max_processes
        result.facts["host_ram_samples"] = ram.samples
    result.facts["log"] = str(log_path)
    result.facts["run_dir"] = str(run_dir)
    if mllog_path.exists():
        result.facts["mlperf_log"] = str(mllog_path)
    result.facts["manifest"] = str(write_manifest(run_dir, build_manifest(result, command)))
    write_json_atomic(result_path, result.to_dict())  # the complete record, host RAM included
    return result


class RecorderSet:
    """Calls every recorder in order (MLflow before results.json, so the JSON holds the MLflow run id).

    An essential recorder's failure (results.json) propagates. Any other recorder that fails (an
    unreachable MLflow server) is switched off for the rest of the matrix; the failure is kept in
    :attr:`errors` and noted in the run's facts, and results.json still records every run.
    """

    def __init__(self, recorders: Sequence[Recorder]) -> None:
        self._active = list(recorders)
        self.errors: list[str] = []

    def _call(self, stage: str, call: Callable[[Recorder], None], result: RunResult | None = None) -> None:
        for recorder in list(self._active):
            try:
                call(recorder)
            except Exception as exc:  # noqa: BLE001 - essential recorders re-raise below
                if recorder.essential:
                    raise
                self._active.remove(recorder)
                message = f"{type(recorder).__name__} failed at {stage} and is off for the rest of the matrix: " \
                          f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
                self.errors.append(message)
                if result is not None:
                    result.facts.setdefault("recorder_errors", []).append(message)

    def open(self, info: MatrixInfo) -> None:
        self._call("open", lambda r: r.open(info))

    def begin(self, config: RunConfig, repeat: int, run_uid: str) -> None:
        self._call(f"the start of {config.config_id}", lambda r: r.begin(config, repeat, run_uid))

    def end(self, result: RunResult) -> None:
        config_id = RunConfig.from_dict(result.config).config_id
        self._call(f"the end of {config_id}", lambda r: r.end(result), result)

    def score(self, score: ConfigScore) -> None:
        self._call(f"the score of {score.config_id}", lambda r: r.score(score))

    def close(self, status: str) -> None:
        self._call("close", lambda r: r.close(status))


@dataclass
class MatrixOutcome:
    """Every run (repeats included), one score per configuration, and recorder failures."""

    results: list[RunResult]
    scores: list[ConfigScore]
    status: str
    recorder_errors: list[str] = dataclasses.field(default_factory=list)


def run_matrix(
    configs: Sequence[RunConfig],
    output_dir: Path,
    recorders: Sequence[Recorder],
    info: MatrixInfo,
    progress: Progress | None = None,
) -> MatrixOutcome:
    """Run every configuration ``info.repeats`` times, recording each run as it ends and each
    configuration's score (see :mod:`suite.scoring`) after its last repeat.

    On an interrupt (Ctrl-C, SIGTERM), the running configuration is recorded as KILLED, the recorders
    are closed with status KILLED and the interrupt propagates.
    """
    if not configs:
        raise ConfigError("the matrix has no configuration to run")
    progress = progress or NoProgress()
    output_dir.mkdir(parents=True, exist_ok=True)
    recorder_set = RecorderSet(recorders)
    recorder_set.open(info)
    outcome = MatrixOutcome([], [], FINISHED, recorder_set.errors)
    total = len(configs) * info.repeats
    try:
        for index, config in enumerate(configs):
            repeats: list[RunResult] = []
            for repeat in range(info.repeats):
                run_uid = uuid.uuid4().hex
                recorder_set.begin(config, repeat, run_uid)
                progress.config_started(config, index * info.repeats + repeat, total)
                run_name = config.config_id if info.repeats == 1 else f"{config.config_id}-r{repeat}"
                try:
                    result = run_isolated(config, output_dir, progress, command=info.command, repeat=repeat,
                                          run_name=run_name, memory_limit_bytes=info.memory_limit_bytes,
                                          run_uid=run_uid)
                except KeyboardInterrupt:
                    outcome.status = KILLED
                    killed = RunResult(config=config.to_dict(), status=KILLED, reason="interrupted by the user",
                                       ended_at=time.time(), repeat=repeat, run_uid=run_uid)
                    outcome.results.append(killed)
                    recorder_set.end(killed)
                    raise
                repeats.append(result)
                outcome.results.append(result)
                recorder_set.end(result)
                progress.config_ended(result)
            score = score_repeats(repeats)
            outcome.scores.append(score)
            recorder_set.score(score)
    finally:
        if outcome.status == FINISHED and any(r.status != FINISHED for r in outcome.results):
            outcome.status = FAILED
        recorder_set.close(outcome.status)
    return outcome
