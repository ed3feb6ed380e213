"""Launch one configuration in a fresh process and collect its result.

The configuration process (:mod:`suite.run.process`) gets its own run folder in the results folder
(``runs/<name>/``, see :class:`suite.results.files.RunFiles`) with ``config.json`` and ``run.json`` (its run uid,
repeat and the command line, for its manifest). While it runs, this process samples its host RAM (the process
and its loader workers) and turns its events into progress; its stderr and any plain output become ``run.log``.
The result arrives as the child's last event (so a full disk cannot lose it), else from its result.json, else
it is a FAILED result saying how the process ended.
"""

from __future__ import annotations

import re
import signal
import socket
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
from suite.results.manifest import build_manifest
from suite.results.record import FAILED, FINISHED, WORKER_NODE, RunResult
from suite.results.store import ResultsStore
from suite.run.children import (
    PROCESS_MODULE,
    Standby,
    _address_space_limit,
    _child_environment,
    _kill_group,
    _signal_group,
    launcher_command,
)

LOG_TAIL_LINES = 20
#: Failure messages that mean the address space ran out (allocators, mmap of shared libraries).
_LOOKS_LIKE_OOM = re.compile(r"out of memory|MemoryError|can't allocate|cannot allocate memory|failed to map",
                             re.IGNORECASE)


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


def _exit_description(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (killed: out of memory?)" if -returncode == signal.SIGKILL else ""
        return f"run process died from {name}{hint}"
    return f"run process exited with status {returncode} without a result"


_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$")


def _torchrun_failure(tail: str) -> str | None:
    """What torchrun's own report says failed (the rank and its exit code, from its "Root Cause"), with the
    last error a process printed before it (e.g. gloo's "Connection closed by peer" when a node died)."""
    lines = tail.splitlines()
    errors = [m for line in lines if (m := _ERROR_LINE.match(line)) and m.group(1) != "ChildFailedError"]
    if "ChildFailedError" not in tail and not any("Rendezvous" in m.group(1) for m in errors):
        return None
    fields = {}
    for line in lines[max((i for i, line in enumerate(lines) if "Root Cause" in line), default=0):]:
        key, colon, value = line.strip().partition(":")
        if colon and key.strip() in ("rank", "exitcode") and key.strip() not in fields and value.split():
            fields[key.strip()] = value.split()[0]  # "1 (local_rank: 1)" -> "1"
    summary = "torchrun: " + (f"rank {fields['rank']} failed (exit code {fields.get('exitcode', '?')})"
                              if "rank" in fields else "the configuration failed")
    if errors:
        summary += f"; {errors[-1].group(1)}: {errors[-1].group(2).strip()[:400]}"
    return summary


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


def _read_result(files: RunFiles) -> RunResult | None:
    try:
        return files.read_result()
    except ResultsFolderError:
        return None


def _validated(received: dict[str, Any] | None, files: RunFiles) -> RunResult | None:

    if received is None:
        return None
    try:
        return validate_result(received, f"the result event of {files.relative_folder}")
    except ResultsFolderError:
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
    try:
        files = store.run_files(run_name or config.config_id)
        files.write(files.config, config.to_dict())
        run_info: dict[str, Any] = {"run_uid": run_uid, "repeat": repeat, "command": list(command),
                                    "matrix_uid": store.matrix_info.uid}
        files.write(files.run_info, run_info)
        try:
            log = open(files.log, "a", buffering=1)  # O_APPEND, shared with the child's stderr
        except OSError as exc:
            raise RecordingError(f"cannot write {files.log}: {exc.strerror or exc}") from exc
    except BaseException:
        if standby is not None:
            standby.cancel()
        raise
    cmd = [*launcher_command(config, run_name or config.config_id), "-m", PROCESS_MODULE,
           "--run-folder", str(files.folder.resolve())]
    started = time.time()
    received: dict[str, Any] | None = None
    sink = _LogSink(log)
    try:
        proc = standby.hand_over(files.folder.resolve()) if standby is not None else None
        if proc is None:
            limit = _address_space_limit(memory_limit_bytes) if memory_limit_bytes else None
            # its own process group: a time limit or an interrupt stops it together with its loader workers
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=limit,
                                    env={**_child_environment(config), LAUNCHED_AT_ENV: repr(started)},
                                    start_new_session=True)
        timeout_s = config.effective_timeout_s()
        timed_out = threading.Event()
        timer = threading.Timer(timeout_s, _kill_group, (proc, timed_out)) if timeout_s else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            files.write(files.run_info, {**run_info, "pid": proc.pid})
        except RecordingError as exc:
            sink.write(f"{exc}\n")
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
                    if event.get("compute_done") and compute_done is not None:
                        compute_done()
                    progress.event(config, event)
            returncode = proc.wait()
        except BaseException as exc:  # interrupted: stop the child and its workers, then propagate
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            sampler.stop()
            if isinstance(exc, KeyboardInterrupt):  # a result already sent is a finished run: never lost
                raise Interrupted(_validated(received, files)) from exc
            raise
        finally:
            if timer is not None:
                timer.cancel()
            ram = sampler.stop()
    finally:
        try:
            log.close()
        except OSError:  # its last buffered line could not be written: dropped
            pass
    result = _validated(received, files) or _read_result(files)
    if result is None and returncode == 0 and config.nnodes > 1:  # global rank 0 ran on another node
        result = RunResult(config=config, status=FINISHED, started_at=started, ended_at=time.time(),
                           facts={"node_role": WORKER_NODE, "recorded_by": "the node that held global rank 0"})
    if result is None and timed_out.is_set():
        result = RunResult(config=config, status=FAILED, started_at=started, ended_at=time.time(),
                           reason=f"timed out after {timeout_s:g} s (--timeout); the configuration and its loader "
                                  "workers were killed")
    if result is None:
        tail = files.read_log_tail(LOG_TAIL_LINES)
        last = tail.splitlines()[-1] if tail else ""
        reason = _exit_description(returncode) + (f"; last log line: {last}" if last else "")
        if config.nproc_per_node > 1 or config.nnodes > 1:
            reason = _torchrun_failure(files.read_log_tail(120)) or reason
        result = RunResult(config=config, status=FAILED, reason=reason, started_at=started,
                           ended_at=time.time())
    result.repeat, result.run_uid = repeat, run_uid
    if sink.error:
        result.facts.setdefault("recording_errors", []).append(sink.error)
    result.facts["timeout_s"] = timeout_s
    if memory_limit_bytes:
        result.facts["memory_limit_bytes"] = memory_limit_bytes
        if result.status == FAILED and (returncode < 0 or _LOOKS_LIKE_OOM.search(result.reason or "")):
            result.reason = f"{result.reason} (under a memory limit of {memory_limit_bytes / 2**30:.2f} GiB)"
    if config.nnodes > 1:
        result.facts["host_ram_scope"] = (f"this node only ({socket.gethostname()}, 1 of {config.nnodes} nodes): its "
                                          "torchrun, its ranks and their loader workers")
    if ram.samples:
        result.metrics["host_ram_peak_rss_bytes"] = float(ram.peak_rss_bytes)
        if ram.peak_pss_bytes is not None:
            result.metrics["host_ram_peak_pss_bytes"] = float(ram.peak_pss_bytes)
        result.facts["host_ram_max_processes"] = ram.max_processes
        result.facts["host_ram_samples"] = ram.samples
    try:
        if not files.manifest.is_file():  # the process died before writing it
            files.write(files.manifest, build_manifest(result, command))
        result.facts.update(files.facts())
        files.write(files.result, result.to_dict())  # the complete record, host RAM included
    except RecordingError as exc:  # the result is in memory; the results store reports the failure
        result.facts.update(files.facts())
        result.facts.setdefault("recording_errors", []).append(str(exc))
    return result
