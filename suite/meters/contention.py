"""How busy the machine was with other work during a measured window.

A throughput measured while other processes used the cores, or while the hypervisor stole them, is not the
machine's. Over the window this reads (psutil): the CPU seconds the whole machine spent busy, the CPU seconds of
the training process and its descendants (loader workers), the steal time, and the load average; the difference is
what everything else used. A window is *contended* when others used more than :data:`OTHERS_SHARE_LIMIT` of the
machine's cores or steal exceeded :data:`STEAL_SHARE_LIMIT`, rules written here once and recorded with the figures.
A window in which the training process itself did not run for more than :data:`PAUSED_SHARE_LIMIT` of it (stopped
by SIGSTOP or Ctrl-Z, a frozen cgroup, a paused VM: :class:`PauseWatch` sees it) is not the machine's either, and is
said as such, never blamed on other work.

The same readings say where the cores went (:meth:`Contention.metrics`): mean cores used over the window by the
training process (its own threads: the step, intra-op threads), by the threads a device decoder runs inside it
(named as :data:`DECODER_THREAD_PREFIXES` says; counted apart from the training process's), by its loader workers
(every process below it, those that ended during the window included), by everything else, and the cores this
process may run on. Under torchrun the training processes are the launcher's children (the ranks) and the loader workers
theirs.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import psutil

from suite.figures import CONTENTION_OTHERS_CPU_SHARE, CONTENTION_PAUSED_SHARE, CONTENTION_STEAL_SHARE, LOAD_AVERAGE_1M

#: Share of the machine's CPU capacity used by other processes above which a window is contended.
OTHERS_SHARE_LIMIT = 0.10
#: Share of CPU capacity stolen by the hypervisor above which a window is contended.
STEAL_SHARE_LIMIT = 0.02
#: Share of the window the training process did not run (stopped, frozen) above which it is not the machine's.
PAUSED_SHARE_LIMIT = 0.02


def is_contended(others_share: float, steal_share: float, paused_share: float = 0.0) -> bool:
    """The rule: other processes used more than :data:`OTHERS_SHARE_LIMIT` of the cores, the hypervisor stole
    more than :data:`STEAL_SHARE_LIMIT`, or the process did not run for more than :data:`PAUSED_SHARE_LIMIT` of the
    window."""
    return others_share > OTHERS_SHARE_LIMIT or steal_share > STEAL_SHARE_LIMIT or paused_share > PAUSED_SHARE_LIMIT


def interference(others_share: float, steal_share: float, paused_share: float = 0.0) -> str:
    """What took the machine from a window, in words, each part only where it passed its limit: "the training process
    did not run for 40% of it (stopped or frozen)", "other processes used 52% of the cores", "the hypervisor stole
    5%"; "" where nothing did."""
    parts = []
    if paused_share > PAUSED_SHARE_LIMIT:
        parts.append(f"the training process did not run for {paused_share:.0%} of its measured window (stopped, e.g. "
                     "SIGSTOP or Ctrl-Z, or frozen)")
    if others_share > OTHERS_SHARE_LIMIT:
        parts.append(f"other processes used {others_share:.0%} of the cores")
    if steal_share > STEAL_SHARE_LIMIT:
        parts.append(f"the hypervisor stole {steal_share:.0%} of the cores")
    return "; ".join(parts)


class PauseWatch:
    """How long this process did not run while watched: a thread wakes every :data:`TICK_S`; a wake-up late by more
    than :data:`LATE_S` while the process's CPU time hardly moved (under :data:`RAN_SHARE` of the delay: a thread
    holding the GIL would have spent CPU) means the whole process was stopped (SIGSTOP, Ctrl-Z), frozen or its VM
    paused, and the delay is counted. ``start()`` / ``stop()`` -> seconds."""

    TICK_S = 0.1
    LATE_S = 0.5
    RAN_SHARE = 0.1

    def __init__(self) -> None:
        import threading

        self._paused = 0.0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="suite-pause-watch", daemon=True)

    def _watch(self) -> None:
        wall, cpu = time.monotonic(), time.process_time()
        while not self._halt.wait(self.TICK_S):
            now, now_cpu = time.monotonic(), time.process_time()
            late = now - wall - self.TICK_S
            if late > self.LATE_S and now_cpu - cpu < self.RAN_SHARE * late:
                self._paused += late
            wall, cpu = now, now_cpu

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> float:
        self._halt.set()
        self._thread.join(timeout=5)
        return self._paused


def _busy_seconds(times: object) -> float:
    """CPU seconds the machine ran something (steal excluded: it is counted on its own)."""
    idle = getattr(times, "idle", 0.0) + getattr(times, "iowait", 0.0) + getattr(times, "steal", 0.0)
    total = sum(getattr(times, f) for f in times._fields if f not in ("guest", "guest_nice"))  # type: ignore[attr-defined]
    return total - idle


#: Name prefixes of the threads device decoders start inside the training process: DALI names its threads
#: "[DALI][WT]Input", "[DALI][TP0]Exec", "[DALI] Executor" (its CPU pipeline, nvidia-dali-cuda120 2.4.0;
#: tests/test_hardware_decoders.py runs it and checks they are counted here).
DECODER_THREAD_PREFIXES = ("[DALI]",)


def _decoder_thread_seconds(proc: psutil.Process) -> float:
    """CPU seconds so far of ``proc``'s live threads that a decoder named (Linux: ``/proc/<pid>/task/<tid>/comm``;
    0 elsewhere). A decoder thread that ends during the window leaves its time in the process's own total."""
    total = 0.0
    try:
        threads = proc.threads()
    except psutil.Error:
        return 0.0
    for thread in threads:
        try:
            with open(f"/proc/{proc.pid}/task/{thread.id}/comm", encoding="utf-8", errors="replace") as fh:
                name = fh.read().strip()
        except OSError:
            continue
        if name.startswith(DECODER_THREAD_PREFIXES):
            total += thread.user_time + thread.system_time
    return total


def _tree_cpu_seconds(root: psutil.Process, trainers_are_children: bool) -> tuple[float, float, float]:
    """CPU seconds so far of the training processes (``root``, or under torchrun its children), of the decoder
    threads inside them (also in the first figure) and of the loader workers below them, ended ones included (their
    times are added to the parent that waited for them)."""
    trainer = workers = decoders = 0.0
    try:
        top = root.children() if trainers_are_children else [root]
    except psutil.Error:
        top = [root]
    trainers = {p.pid for p in top}
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        own = times.user + times.system
        if proc.pid in trainers:
            trainer += own
            decoders += _decoder_thread_seconds(proc)
            workers += times.children_user + times.children_system  # loader workers that ended, waited for
        elif proc.pid != root.pid:
            workers += own
    return trainer, decoders, workers


def cores_available() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return psutil.cpu_count() or 1


@dataclass(frozen=True)
class Contention:
    window_s: float
    cores: int
    others_cpu_s: float
    own_cpu_s: float
    steal_s: float
    load_average_1m: float | None
    trainer_cpu_s: float = 0.0
    workers_cpu_s: float = 0.0
    cores_available: int = 0
    decoder_threads_cpu_s: float = 0.0  # part of trainer_cpu_s
    paused_s: float = 0.0  # the training process did not run (stopped, frozen): PauseWatch

    @property
    def others_share(self) -> float:
        return self.others_cpu_s / (self.window_s * self.cores) if self.window_s > 0 else 0.0

    @property
    def steal_share(self) -> float:
        return self.steal_s / (self.window_s * self.cores) if self.window_s > 0 else 0.0

    @property
    def paused_share(self) -> float:
        return min(1.0, self.paused_s / self.window_s) if self.window_s > 0 else 0.0

    @property
    def contended(self) -> bool:
        return is_contended(self.others_share, self.steal_share, self.paused_share)

    def metrics(self) -> dict[str, float]:
        figures = {CONTENTION_OTHERS_CPU_SHARE: self.others_share, CONTENTION_STEAL_SHARE: self.steal_share,
                   CONTENTION_PAUSED_SHARE: self.paused_share}
        if self.window_s > 0:  # where the cores went: mean cores used over the window
            trainer = max(0.0, self.trainer_cpu_s - self.decoder_threads_cpu_s)
            figures.update(host_cpu_cores_trainer=trainer / self.window_s,
                           host_cpu_cores_decoder_threads=self.decoder_threads_cpu_s / self.window_s,
                           host_cpu_cores_loader_workers=self.workers_cpu_s / self.window_s,
                           host_cpu_cores_other=self.others_cpu_s / self.window_s,
                           host_cores_available=float(self.cores_available or self.cores))
        if self.load_average_1m is not None:
            figures[LOAD_AVERAGE_1M] = self.load_average_1m
        return figures

    def facts(self) -> dict[str, object]:
        return {**asdict(self), "others_share": self.others_share, "steal_share": self.steal_share,
                "paused_share": self.paused_share, "contended": self.contended,
                "rule": f"contended when other processes used > {OTHERS_SHARE_LIMIT:.0%} of the cores, steal > "
                        f"{STEAL_SHARE_LIMIT:.0%}, or the training process did not run (stopped, frozen) for > "
                        f"{PAUSED_SHARE_LIMIT:.0%} of the measured window"}


class ContentionMeter:
    """``start()`` at the beginning of the measured window, ``stop()`` at its end."""

    def __init__(self, pid: int | None = None) -> None:
        self._root = psutil.Process(pid or os.getpid())
        self._trainers_are_children = pid is not None and pid != os.getpid()  # the torchrun launcher
        self._start: tuple[float, float, float, float, float, float] | None = None
        self._pauses: PauseWatch | None = None

    def _read(self) -> tuple[float, float, float, float, float, float]:
        times = psutil.cpu_times()
        trainer, decoders, workers = _tree_cpu_seconds(self._root, self._trainers_are_children)
        return time.monotonic(), _busy_seconds(times), trainer, decoders, workers, getattr(times, "steal", 0.0)

    def start(self) -> None:
        self._pauses = PauseWatch()
        self._pauses.start()
        self._start = self._read()

    def stop(self) -> Contention | None:
        if self._start is None:
            return None
        paused = self._pauses.stop() if self._pauses is not None else 0.0
        wall0, busy0, trainer0, decoders0, workers0, steal0 = self._start
        wall1, busy1, trainer1, decoders1, workers1, steal1 = self._read()
        trainer, workers = max(0.0, trainer1 - trainer0), max(0.0, workers1 - workers0)
        decoders = min(trainer, max(0.0, decoders1 - decoders0))
        own = trainer + workers
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = None
        return Contention(window_s=wall1 - wall0, cores=psutil.cpu_count() or 1,
                          others_cpu_s=max(0.0, (busy1 - busy0) - own), own_cpu_s=own,
                          steal_s=max(0.0, steal1 - steal0), load_average_1m=load, trainer_cpu_s=trainer,
                          workers_cpu_s=workers, cores_available=cores_available(), decoder_threads_cpu_s=decoders,
                          paused_s=paused)
