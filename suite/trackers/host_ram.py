"""Host RAM sampling over a process tree (the training process and its loader workers).

RSS summed over processes counts shared pages once per process (copy-on-write pages of forked
DataLoader workers, shared libraries), so it overstates the real footprint; PSS (proportional set
size) divides each shared page among the processes sharing it, so the PSS sum counts it once. Both
peaks are reported. Sampling runs in a background thread, ideally of another process than the
measured one (the runner samples its child from the parent), so it does not perturb the measurement.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class HostRamPeak:
    """Peaks of the per-sample sums over the process tree."""

    peak_rss_bytes: int
    peak_pss_bytes: int | None  # None where the OS gives no PSS (non-Linux)
    max_processes: int
    samples: int


def sample_tree(root: psutil.Process) -> tuple[int, int | None, int]:
    """One sample: (sum of RSS, sum of PSS or None, number of processes) over root and descendants."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0, 0
    rss = 0
    pss: int | None = 0
    counted = 0
    for proc in procs:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # exited between listing and reading
        except psutil.AccessDenied:
            info = None
        if info is None:
            try:
                rss += proc.memory_info().rss
                pss = None
                counted += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
            continue
        rss += info.rss
        counted += 1
        proc_pss = getattr(info, "pss", None)
        if proc_pss is None or pss is None:
            pss = None
        else:
            pss += proc_pss
    return rss, pss, counted


class HostRamSampler:
    """Samples a process tree every ``interval_s`` seconds until stopped; a context manager."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._root = psutil.Process(pid)
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak_rss = 0
        self._peak_pss: int | None = 0
        self._max_procs = 0
        self._samples = 0

    def sample_now(self) -> None:
        rss, pss, procs = sample_tree(self._root)
        if procs == 0:
            return
        self._samples += 1
        self._peak_rss = max(self._peak_rss, rss)
        self._max_procs = max(self._max_procs, procs)
        if pss is None or self._peak_pss is None:
            self._peak_pss = None
        else:
            self._peak_pss = max(self._peak_pss, pss)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_now()
            self._stop.wait(self._interval)

    def start(self) -> "HostRamSampler":
        if self._thread is not None:
            raise RuntimeError("HostRamSampler already started")
        self._thread = threading.Thread(target=self._loop, name="host-ram-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> HostRamPeak:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.peak()

    def peak(self) -> HostRamPeak:
        return HostRamPeak(self._peak_rss, self._peak_pss, self._max_procs, self._samples)

    def __enter__(self) -> "HostRamSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
