"""What the runner makes of a configuration process that ended: the record of one that sent no result (another
node's share, timed out, failed with the reason its exit and its log give), and what only the runner knows
(limits, host RAM, where the files are) added before the record is written."""

from __future__ import annotations

import re
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any, Sequence

from suite.analysis import memory_trend
from suite.config import RunConfig
from suite.errors import RecordingError
from suite.figures import HOST_RAM_PEAK_PSS_ANON_BYTES, HOST_RAM_PEAK_PSS_BYTES, HOST_RAM_PEAK_RSS_BYTES, MEASURED_STEPS
from suite.results.files import RunFiles
from suite.results.manifest import build_manifest
from suite.results.record import FAILED, FINISHED, WORKER_NODE, RunResult

#: Failure messages that mean the address space ran out (allocators, mmap of shared libraries).
_LOOKS_LIKE_OOM = re.compile(r"out of memory|MemoryError|can't allocate|cannot allocate memory|failed to map",
                             re.IGNORECASE)

LOG_TAIL_LINES = 20


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


@dataclass
class Watched:
    """What watching a configuration process saw: the result it sent (if any), its exit status, whether its time
    limit killed it, and its host RAM."""

    received: dict[str, Any] | None
    returncode: int
    timeout_s: float | None
    timed_out: bool
    ram: Any


def unreported(config: RunConfig, files: RunFiles, watched: Watched, started: float) -> RunResult:
    """The record of a run that left no result: another node's share, killed at its time limit, or failed."""
    if watched.returncode == 0 and config.nnodes > 1:  # global rank 0 ran on another node
        return RunResult(config=config, status=FINISHED, started_at=started, ended_at=time.time(),
                         facts={"node_role": WORKER_NODE, "recorded_by": "the node that held global rank 0"})
    if watched.timed_out:
        return RunResult(config=config, status=FAILED, started_at=started, ended_at=time.time(),
                         reason=f"timed out after {watched.timeout_s:g} s (--timeout); the configuration and its "
                                "loader workers were killed")
    tail = files.read_log_tail(LOG_TAIL_LINES)
    last = tail.splitlines()[-1] if tail else ""
    reason = _exit_description(watched.returncode) + (f"; last log line: {last}" if last else "")
    if config.nproc_per_node > 1 or config.nnodes > 1:
        reason = _torchrun_failure(files.read_log_tail(120)) or reason
    return RunResult(config=config, status=FAILED, reason=reason, started_at=started, ended_at=time.time())


def record_memory_trend(result: RunResult, rss_series: Sequence[tuple[float, float]]) -> None:
    """A finished run's memory trend over its measured window: the host RSS series the runner sampled (metrics
    ``memory_growth_bytes_per_step``...), with the device's the process fitted (``device_memory_...``), and the
    verdict of both together as the fact ``memory_trend`` (see :mod:`suite.analysis.memory_trend`)."""
    window = result.facts.get("measured_window_monotonic_s")
    steps = int(result.metrics.get(MEASURED_STEPS, 0))
    if result.status != FINISHED or not window or steps < 1:
        return
    host = memory_trend.fit_timed(rss_series, (float(window[0]), float(window[1])), steps,
                                  "host RSS of the configuration's processes, sampled by the runner")
    memory_trend.record(host, "memory", result.metrics, result.facts)
    device = result.facts.get("device_memory_trend")
    result.facts["memory_trend"] = memory_trend.worst([host.verdict, device and device.get("verdict")])


def complete_record(result: RunResult, files: RunFiles, watched: Watched, memory_limit_bytes: int | None,
              command: Sequence[str]) -> None:
    """What only the runner knows, into the record (limits, host RAM, where the files are), then the complete
    record into the run folder (a manifest too where the process died before writing one)."""
    config = result.config
    result.facts["timeout_s"] = watched.timeout_s
    if memory_limit_bytes:
        result.facts["memory_limit_bytes"] = memory_limit_bytes
        if result.status == FAILED and (watched.returncode < 0 or _LOOKS_LIKE_OOM.search(result.reason or "")):
            result.reason = f"{result.reason} (under a memory limit of {memory_limit_bytes / 2**30:.2f} GiB)"
    if config.nnodes > 1:
        result.facts["host_ram_scope"] = (f"this node only ({socket.gethostname()}, 1 of {config.nnodes} nodes): its "
                                          "torchrun, its ranks and their loader workers")
    ram = watched.ram
    if ram.samples:
        result.metrics[HOST_RAM_PEAK_RSS_BYTES] = float(ram.peak_rss_bytes)
        if ram.peak_pss_bytes is not None:
            result.metrics[HOST_RAM_PEAK_PSS_BYTES] = float(ram.peak_pss_bytes)
        if ram.peak_pss_anon_bytes is not None:
            result.metrics[HOST_RAM_PEAK_PSS_ANON_BYTES] = float(ram.peak_pss_anon_bytes)
        result.facts["host_ram_max_processes"] = ram.max_processes
        result.facts["host_ram_samples"] = ram.samples
    record_memory_trend(result, ram.rss_series)
    try:
        if not files.manifest.is_file():  # the process died before writing it
            files.write(files.manifest, build_manifest(result, command))
        result.facts.update(files.facts())
        files.write(files.result, result.to_dict())  # the complete record, host RAM included
    except RecordingError as exc:  # the result is in memory; the results store reports the failure
        result.facts.update(files.facts())
        result.facts.setdefault("recording_errors", []).append(str(exc))
