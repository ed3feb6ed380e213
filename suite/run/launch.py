"""Launch one configuration in a fresh process and collect its result.

The configuration process (:mod:`suite.run.process`) gets its own run folder in the results folder
(``runs/<name>/``, see :class:`suite.results.files.RunFiles`) with ``config.json`` and ``run.json`` (its run uid,
repeat and the command line, for its manifest). While it runs, this process samples its host RAM (the process
and its loader workers) and turns its events into progress; its stderr and any plain output become ``run.log``.
The result arrives as the child's last event (so a full disk cannot lose it), else from its result.json, else
it is a FAILED result saying how the process ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Protocol, Sequence

from suite.config import RunConfig
from suite.errors import RecordingError, ResultsFolderError
from suite.events import LAUNCHED_AT_ENV
from suite.events import parse as parse_event
from suite.meters.host_ram import HostRamSampler
from suite.results.files import RunFiles, validate_result
from suite.results.record import RunResult
from suite.results.store import ResultsStore
from suite.run.children import (
    PROCESS_MODULE,
    Standby,
    address_space_limit,
    configuration_environment,
    kill_group,
    launcher_command,
    signal_group,
)
from suite.run.outcome import Watched, complete_record, unreported


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while a configuration ran; ``result`` is its result when the process had already sent
    it (it finished), else ``None`` (it was stopped)."""

    def __init__(self, result: RunResult | None) -> None:
        super().__init__()
        self.result = result


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


class _LogSink:
    """``run.log`` as the runner writes it (the child's plain output, notes): a write that fails (full disk) is
    dropped, never fatal; the first failure is kept for the run's facts."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.error: str | None = None

    def write(self, text: str) -> None:
        if self.error is not None:
            return
        try:
            self.handle.write(text)
        except OSError as exc:
            self.error = f"cannot write {self.handle.name}: {exc.strerror or exc}"


def _read_result(files: RunFiles, refused: list[str] | None = None) -> RunResult | None:
    """The run's result.json, or ``None``; why a result.json there was refused is added to ``refused``."""
    try:
        return files.read_result()
    except ResultsFolderError as exc:
        if refused is not None:
            refused.append(str(exc))
        return None


def _validated(received: dict[str, Any] | None, files: RunFiles, refused: list[str] | None = None
               ) -> RunResult | None:
    """The result the process sent, validated, or ``None``; why it was refused is added to ``refused`` (the record
    of the run says it: a refused result is never silently a run "without a result")."""
    if received is None:
        return None
    try:
        return validate_result(received, f"the result event of {files.relative_folder}")
    except ResultsFolderError as exc:
        if refused is not None:
            refused.append(str(exc))
        return None


def launch(config: RunConfig, store: ResultsStore, progress: Progress | None = None, command: Sequence[str] = (),
           repeat: int = 0, run_name: str | None = None, memory_limit_bytes: int | None = None,
           run_uid: str | None = None, sample_interval_s: float = 0.05, standby: Standby | None = None,
           compute_done: Callable[[], None] | None = None) -> RunResult:
    """Run one configuration in a fresh Python process (through torchrun when ``nproc_per_node > 1``) and return
    its complete result (host RAM included); the run's files are in ``store``'s ``runs/<run_name>/``.

    ``memory_limit_bytes`` caps the address space of the child and its loader workers (``RLIMIT_AS``); going
    over it fails that configuration only. A configuration that runs longer than its time limit
    (:meth:`RunConfig.effective_timeout_s`) is killed with its loader workers (its own process group) and
    recorded FAILED "timed out". Raises :class:`RecordingError` when the run folder cannot be written (nothing
    ran then); an interrupt stops the child and its workers and propagates.

    ``standby``: a process started ahead for this configuration (:class:`Standby`); it runs the configuration if it
    fits (else it is cancelled and a fresh one starts); this call owns it either way. ``compute_done`` is called
    once the configuration has done its measured steps and final evaluation (the moment to start the next one's
    standby: what remains is writing and exiting, which contend little with the next one's imports).
    """
    progress = progress or NoProgress()
    if standby is not None and not standby.fits(config, memory_limit_bytes):
        standby.cancel()
        standby = None
    name = run_name or config.config_id
    try:
        files, run_info, log = _open_run_folder(store, name, config, {"run_uid": run_uid, "repeat": repeat,
                                                                      "command": list(command)})
    except BaseException:
        if standby is not None:
            standby.cancel()
        raise
    started = time.time()
    sink = _LogSink(log)
    try:
        proc = standby.hand_over(files.folder.resolve()) if standby is not None else None
        if proc is None:
            cmd = [*launcher_command(config, name), "-m", PROCESS_MODULE, "--run-folder", str(files.folder.resolve())]
            limit = address_space_limit(memory_limit_bytes) if memory_limit_bytes else None
            # its own process group: a time limit or an interrupt stops it together with its loader workers
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=limit,
                                    env={**configuration_environment(config), LAUNCHED_AT_ENV: repr(started)},
                                    start_new_session=True)
        try:
            files.write(files.run_info, {**run_info, "pid": proc.pid})
        except RecordingError as exc:
            sink.write(f"{exc}\n")
        watched = _watch(proc, config, files, sink, progress, compute_done, sample_interval_s)
    finally:
        try:
            log.close()
        except OSError:  # its last buffered line could not be written: dropped
            pass
    refused: list[str] = []
    result = _validated(watched.received, files, refused) or _read_result(files, refused)
    if result is None:
        result = unreported(config, files, watched, started)
        if refused:
            result.reason = f"{result.reason}; the result it sent was refused: {refused[0]}"
    result.repeat, result.run_uid = repeat, run_uid
    if sink.error:
        result.facts.setdefault("recording_errors", []).append(sink.error)
    complete_record(result, files, watched, memory_limit_bytes, command)
    return result


def _open_run_folder(store: ResultsStore, name: str, config: RunConfig,
                     run_info: dict[str, Any]) -> tuple[RunFiles, dict[str, Any], Any]:
    """The run's folder with config.json and run.json written, and its log opened for appending (shared with the
    child's stderr); :class:`RecordingError` where any of it cannot be written."""
    files = store.run_files(name)
    files.write(files.config, config.to_dict())
    run_info = {**run_info, "matrix_uid": store.matrix_info.uid}
    files.write(files.run_info, run_info)
    try:
        # O_APPEND, shared with the child's stderr; never through a link
        log = open(files.log, "a", buffering=1, opener=lambda path, flags: os.open(path, flags | os.O_NOFOLLOW, 0o666))
    except OSError as exc:
        raise RecordingError(f"cannot write {files.log}: {exc.strerror or exc}") from exc
    return files, run_info, log


def _watch(proc: subprocess.Popen, config: RunConfig, files: RunFiles, sink: _LogSink, progress: Progress,
           compute_done: Callable[[], None] | None, sample_interval_s: float) -> Watched:
    """Follow the process to its end under its time limit: its events to ``progress``, other lines to its log, its
    host RAM sampled; an interrupt stops it and its workers and propagates (with a result it already sent)."""
    received: dict[str, Any] | None = None
    timeout_s = config.effective_timeout_s()
    timed_out = threading.Event()
    timer = threading.Timer(timeout_s, kill_group, (proc, timed_out)) if timeout_s else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    sampler = HostRamSampler(proc.pid, interval_s=sample_interval_s).start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = parse_event(line)
            if event is None:
                sink.write(line)
            elif "result" in event:
                received = event["result"]
            else:
                if event.get("step") == config.warmup_steps:  # the measured window starts now
                    sampler.relist_tree()
                if event.get("compute_done") and compute_done is not None:
                    compute_done()
                progress.event(config, event)
        returncode = proc.wait()
    except BaseException as exc:  # interrupted: stop the child and its workers, then propagate
        signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()
        sampler.stop()
        if isinstance(exc, KeyboardInterrupt):  # a result already sent is a finished run: never lost
            raise Interrupted(_validated(received, files)) from exc
        raise
    finally:
        if timer is not None:
            timer.cancel()
        ram = sampler.stop()
    return Watched(received, returncode, timeout_s, timed_out.is_set(), ram)
