"""Host RAM sampling over a process tree (the training process and its loader workers), and keeping the pages
that tree shares after a fork shared (:func:`kept_shared_with_forks`).

RSS summed over processes counts shared pages once per process (copy-on-write pages of forked
DataLoader workers, shared libraries), so it overstates the real footprint; PSS (proportional set
size) divides each shared page among the processes sharing it, so the PSS sum counts it once. Both
peaks are reported. Sampling runs in a background thread, ideally of another process than the
measured one (the runner samples its child from the parent), so it does not perturb the measurement.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import psutil


@dataclass(frozen=True)
class HostRamPeak:
    """Peaks of the per-sample sums over the process tree."""

    peak_rss_bytes: int
    peak_pss_bytes: int | None  # None where the OS gives no PSS (non-Linux)
    max_processes: int
    samples: int
    #: (time.monotonic(), RSS sum) over the run, thinned evenly past :data:`SERIES_CAP` samples: the memory trend
    rss_series: tuple[tuple[float, int], ...] = ()
    #: the anonymous and shared-memory part of PSS (``Pss_Anon`` + ``Pss_Shmem``): what the tree allocated, without
    #: the shared libraries' mapped pages, whose count depends on how the page cache holds those files
    #: (docs/performance.md); None where the kernel does not break PSS down (not Linux, Linux before 5.1)
    peak_pss_anon_bytes: int | None = None


class TreeSample(NamedTuple):
    """One reading of a process tree: sums over its processes (PSS figures ``None`` where not read or unknown)."""

    rss: int
    pss: int | None
    processes: int
    pss_anon: int | None = None


#: Linux's per-process totals of /proc/PID/smaps (4.14+; ``Pss_Anon``/``Pss_Shmem`` since 5.1), read in one pass.
_HAS_ROLLUP = Path("/proc/self/smaps_rollup").exists()
_ROLLUP_KEYS = {"Pss:": "pss", "Pss_Anon:": "anon", "Pss_Shmem:": "shmem"}


def read_smaps_rollup(pid: int) -> dict[str, int] | None:
    """``pss``, ``anon`` and ``shmem`` (bytes; the latter two absent on kernels that lack them) of a process
    from ``/proc/PID/smaps_rollup``: the file psutil reads for PSS, which does not pass the breakdown on. ``None``
    where the system has no such file; raises ``psutil.NoSuchProcess`` for a process that has exited and
    ``psutil.AccessDenied`` for one not readable."""
    if not _HAS_ROLLUP:
        return None
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise psutil.NoSuchProcess(pid) from exc
    except PermissionError as exc:
        raise psutil.AccessDenied(pid) from exc
    values: dict[str, int] = {}
    for line in text.splitlines()[1:]:  # the first line names the address range
        fields = line.split()
        if len(fields) >= 2 and fields[0] in _ROLLUP_KEYS:
            values[_ROLLUP_KEYS[fields[0]]] = int(fields[1]) * 1024  # kB
    if "pss" not in values:  # an exited process can leave an empty file
        raise psutil.NoSuchProcess(pid)
    return values


def process_tree(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and its descendants (empty once ``root`` has exited); costs a scan of every process."""
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def sample_tree(root: psutil.Process, with_pss: bool = True,
                procs: list[psutil.Process] | None = None) -> TreeSample:
    """One sample: sums of RSS, PSS and PSS's anonymous part, and the number of processes, over root and descendants.

    RSS costs microseconds; PSS makes the kernel walk every resident page (~13 ms for a 500 MB
    process), so ``with_pss=False`` reads RSS only (PSS is then ``None``). ``procs``: the tree as listed
    by :func:`process_tree` a moment ago (listing it scans every process of the machine, ~2 ms); one that has
    exited since is skipped (its reading fails). There is no liveness check per sample: psutil's ``is_running``
    costs twice the RSS reading itself (34 vs 18 µs here), and the runner samples its own child, whose pid cannot
    be reused before the runner reaps it.
    """
    if procs is None:
        procs = process_tree(root)  # empty once root has exited
    if not procs:
        return TreeSample(0, 0, 0, 0)
    rss = 0
    pss: int | None = 0
    anon: int | None = 0
    counted = 0
    for proc in procs:
        info = None
        if with_pss:
            try:
                info = _pss_reading(proc)
            except psutil.NoSuchProcess:  # (and ZombieProcess) exited between listing and reading
                continue
            except psutil.AccessDenied:
                pass  # PSS not readable: RSS below, and the PSS sum is unknown
        if info is None:  # RSS only: asked for, or PSS denied
            try:
                rss += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            pss = anon = None
            counted += 1
            continue
        rss += info[0]
        counted += 1
        pss = None if pss is None or info[1] is None else pss + info[1]
        anon = None if anon is None or info[2] is None else anon + info[2]
    if not with_pss:
        return TreeSample(rss, None, counted, None)
    return TreeSample(rss, pss, counted, anon)


def _pss_reading(proc: psutil.Process) -> tuple[int, int | None, int | None]:
    """One process's RSS, PSS and PSS's anonymous part (Linux's breakdown; else psutil's reading, part unknown)."""
    rollup = read_smaps_rollup(proc.pid)
    if rollup is None:
        info = proc.memory_full_info()
        return info.rss, getattr(info, "pss", None), None
    anon = rollup["anon"] + rollup["shmem"] if "anon" in rollup and "shmem" in rollup else None
    return proc.memory_info().rss, rollup["pss"], anon  # RSS as every RSS-only sample reads it (as psutil does)


#: How soon the sampler lists the process tree again after the list changed (new loader workers are seen within
#: this while processes come and go).
TREE_REFRESH_S = 0.25
#: The longest wait between listings: the wait doubles from :data:`TREE_REFRESH_S` while the tree stays the same
#: (listing it reads every process of the machine, ~2 ms for 70 processes here: 0.9 % of a core at 4 Hz).
TREE_REFRESH_MAX_S = 2.0
#: RSS growth since the last PSS reading that triggers another one (memory is growing: track the peak).
PSS_ON_RSS_GROWTH = 0.05
#: Share of one core the PSS readings may take in a steady state; they are spaced out to stay within it.
PSS_CPU_BUDGET = 0.005
#: Most (time, RSS) samples kept for the memory trend: past it, every other one is dropped and from then on only every
#: other sample is kept (the spacing doubles), so a long run keeps an even series of bounded size.
SERIES_CAP = 4096


class HostRamSampler:
    """Samples a process tree until stopped; a context manager.

    RSS is read every ``interval_s`` seconds. The tree of processes is listed again :data:`TREE_REFRESH_S` after it
    last changed, the wait doubling up to :data:`TREE_REFRESH_MAX_S` while it stays the same: a steady training loop
    keeps its loader workers, a process that starts after a steady spell is counted within TREE_REFRESH_MAX_S, and
    while processes come and go they are seen within TREE_REFRESH_S. PSS, which costs the kernel a walk over every
    resident page, is read at most as often as keeps its CPU cost within ``pss_cpu_budget`` of one core (and at least
    every ``interval_s``): for a 500 MB process, about every 2.6 s at the default 0.5 %. It is also read
    whenever the tree's RSS has grown by more than :data:`PSS_ON_RSS_GROWTH` since the last PSS reading
    (a process loading its model or starting workers), so the PSS peak is not missed while memory grows;
    a steady training loop pays only the budget. The first and the last sample always include PSS.
    """

    def __init__(self, pid: int, interval_s: float = 0.05, pss_cpu_budget: float = PSS_CPU_BUDGET) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if not 0 < pss_cpu_budget <= 1:
            raise ValueError(f"pss_cpu_budget must be in (0, 1], got {pss_cpu_budget}")
        self._root = psutil.Process(pid)
        self._interval = interval_s
        self._pss_budget = pss_cpu_budget
        self._next_pss = 0.0
        self._rss_at_pss = 0
        self._last_rss = 0
        self.pss_samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak_rss = 0
        self._peak_pss: int | None = 0
        self._peak_anon: int | None = 0
        self._max_procs = 0
        self._samples = 0
        self._tree: list[psutil.Process] | None = None
        self._tree_listed = 0.0
        self._tree_wait = TREE_REFRESH_S
        self.tree_listings = 0
        self._series: list[tuple[float, int]] = []
        self._series_stride = 1
        self._series_skipped = 0

    def sample_now(self, with_pss: bool = True) -> None:
        """One sample; the process tree is listed anew when its refresh wait is over."""
        now = time.monotonic()
        if self._tree is None or now - self._tree_listed >= self._tree_wait:
            self._list_tree(now)
        rss, pss, procs, anon = sample_tree(self._root, with_pss, self._tree)
        if procs == 0:
            return
        self._samples += 1
        self._last_rss = rss
        self._keep(now, rss)
        self._peak_rss = max(self._peak_rss, rss)
        self._max_procs = max(self._max_procs, procs)
        if not with_pss:
            return
        self._rss_at_pss = rss
        self.pss_samples += 1
        if pss is None or self._peak_pss is None:
            self._peak_pss = None
        else:
            self._peak_pss = max(self._peak_pss, pss)
        self._peak_anon = None if anon is None or self._peak_anon is None else max(self._peak_anon, anon)

    def relist_tree(self) -> None:
        """List the process tree again at the next sample (the runner asks as a measured window starts, so loader
        workers started in the warm-up are in its memory series from its first sample)."""
        self._tree = None

    def _keep(self, now: float, rss: int) -> None:
        """Into the (time, RSS) series, every ``stride``-th sample; thinned by half when full."""
        self._series_skipped += 1
        if self._series_skipped < self._series_stride:
            return
        self._series_skipped = 0
        self._series.append((now, rss))
        if len(self._series) >= SERIES_CAP:
            del self._series[1::2]
            self._series_stride *= 2

    def _list_tree(self, now: float) -> None:
        tree = process_tree(self._root)
        self.tree_listings += 1
        same = self._tree is not None and {p.pid for p in tree} == {p.pid for p in self._tree}
        self._tree_wait = min(self._tree_wait * 2, TREE_REFRESH_MAX_S) if same else TREE_REFRESH_S
        self._tree, self._tree_listed = tree, now

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            growing = self._last_rss > self._rss_at_pss * (1 + PSS_ON_RSS_GROWTH)
            if now >= self._next_pss or growing:
                cpu = time.thread_time()
                self.sample_now(with_pss=True)
                cost = time.thread_time() - cpu
                self._next_pss = time.monotonic() + max(self._interval, cost / self._pss_budget)
            else:
                self.sample_now(with_pss=False)
            self._stop.wait(self._interval)
        self.sample_now(with_pss=True)

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
        return HostRamPeak(self._peak_rss, self._peak_pss, self._max_procs, self._samples, tuple(self._series),
                           self._peak_anon if self.pss_samples else None)

    def __enter__(self) -> "HostRamSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def kept_shared_with_forks() -> Iterator[int]:
    """Inside, Python's cyclic collector skips every object the process holds on entry (``gc.freeze``), so that
    processes forked inside (loader workers) keep sharing those objects' pages with this one; yields how many.

    A full collection writes into the header of every object it examines, and after a fork each write copies the
    page for the writer: one full collection in the training process after its workers started made the host PSS
    of a default configuration ~90 MiB higher, in whichever run it happened (decided by allocation counts, so by
    timing), and took 0.2-0.34 s of its step examining the imports' objects, inside the measured window in longer
    runs (see "Host PSS from run to run" in docs/performance.md). Frozen, they are never examined, here or in the
    forked processes. They go back to the collector on exit, unless a caller had frozen objects itself."""
    frozen_before = gc.get_freeze_count()
    gc.freeze()
    try:
        yield gc.get_freeze_count()
    finally:
        if not frozen_before:
            gc.unfreeze()
