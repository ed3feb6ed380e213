"""The host RAM sampler counts loader-worker-like child processes, and PSS counts shared pages once."""

import json
import multiprocessing
import os
import subprocess
import sys
import time

import psutil
import pytest

from suite.meters.host_ram import TREE_REFRESH_MAX_S, TREE_REFRESH_S, HostRamSampler, sample_tree

pytestmark = pytest.mark.mechanics

MiB = 2**20
ALLOC = 150 * MiB


def _wait_rss(pid, at_least, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if psutil.Process(pid).memory_info().rss >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never reached {at_least} bytes RSS")


def test_sampler_counts_child_processes():
    code = f"b = bytearray({ALLOC}); import sys; sys.stdin.read()"  # touch ALLOC bytes, then wait
    before = sample_tree(psutil.Process())
    children = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE) for _ in range(2)]
    try:
        for child in children:
            _wait_rss(child.pid, ALLOC)
        with HostRamSampler(os.getpid(), interval_s=0.02) as sampler:
            time.sleep(0.3)
        peak = sampler.peak()
    finally:
        for child in children:
            child.communicate(b"")
    assert peak.samples >= 2
    assert peak.max_processes >= before.processes + 2
    assert peak.peak_rss_bytes >= before.rss + 2 * ALLOC
    assert peak.peak_pss_bytes is not None and peak.peak_pss_bytes >= 2 * ALLOC
    if sys.platform == "linux":  # the children's bytearrays are anonymous memory
        assert peak.peak_pss_anon_bytes is not None and peak.peak_pss_anon_bytes >= 2 * ALLOC


@pytest.mark.skipif(sys.platform != "linux", reason="Linux's smaps_rollup breaks PSS down")
def test_the_anonymous_part_of_pss_counts_what_a_process_allocated_not_the_files_it_maps(tmp_path):
    """A process that allocates ALLOC and one that maps a file of ALLOC and reads it both grow PSS by ~ALLOC; only the
    first grows its anonymous part. A library's mapped pages are file pages like these, and how many of them a
    process has depends on how the page cache holds the file (docs/performance.md), not on the run."""
    data = tmp_path / "mapped.bin"
    data.write_bytes(os.urandom(ALLOC))
    wait = "import sys; sys.stdin.read()"
    codes = {
        "idle": wait,
        "allocates": f"b = bytearray({ALLOC}); b[::4096] = b'x' * len(b[::4096]); {wait}",
        "maps a file": (f"import mmap; f = open({str(data)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, "
                        f"access=mmap.ACCESS_READ); sum(m[i] for i in range(0, len(m), 4096)); {wait}"),
    }
    children = {name: subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
                for name, code in codes.items()}
    try:
        for name in ("allocates", "maps a file"):
            _wait_rss(children[name].pid, ALLOC)
        samples = {name: sample_tree(psutil.Process(child.pid)) for name, child in children.items()}
    finally:
        for child in children.values():
            child.communicate(b"")
    idle = samples["idle"]
    assert idle.pss_anon is not None and 0 < idle.pss_anon <= idle.pss
    for name in ("allocates", "maps a file"):
        assert samples[name].pss - idle.pss >= 0.9 * ALLOC, (name, samples[name], idle)
    assert samples["allocates"].pss_anon - idle.pss_anon >= 0.9 * ALLOC
    assert abs(samples["maps a file"].pss_anon - idle.pss_anon) <= 0.1 * ALLOC, (samples["maps a file"], idle)


def test_another_process_mapping_the_same_file_lowers_pss_but_not_its_anonymous_part(tmp_path):
    """Why the tables compare configurations by the anonymous part: PSS splits a file page between every process that
    maps it, so a process's PSS falls when a neighbour maps the same library (the runner and a configuration process
    started ahead of its turn map torch's); what it allocated does not move. In a matrix this moved a configuration's
    PSS by 10-20 MiB with its place in the schedule (docs/performance.md)."""
    data = tmp_path / "library.bin"
    data.write_bytes(os.urandom(ALLOC))
    touch_file = (f"import mmap; f = open({str(data)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, "
                  f"access=mmap.ACCESS_READ); sum(m[i] for i in range(0, len(m), 4096)); ")
    wait = "import sys; sys.stdin.read()"
    measured = subprocess.Popen([sys.executable, "-c", f"b = bytearray({ALLOC}); b[::4096] = b'x' * len(b[::4096]); "
                                 + touch_file + wait], stdin=subprocess.PIPE)
    neighbour = None
    try:
        _wait_rss(measured.pid, 2 * ALLOC)
        alone = sample_tree(psutil.Process(measured.pid))
        neighbour = subprocess.Popen([sys.executable, "-c", touch_file + wait], stdin=subprocess.PIPE)
        _wait_rss(neighbour.pid, ALLOC)
        beside = sample_tree(psutil.Process(measured.pid))
    finally:
        for child in (measured, neighbour):
            if child is not None:
                child.communicate(b"")
    assert alone.pss - beside.pss >= 0.4 * ALLOC, (alone, beside)  # half of the file's pages went to the neighbour
    assert alone.pss_anon is not None and beside.pss_anon is not None
    assert abs(alone.pss_anon - beside.pss_anon) <= 0.05 * ALLOC, (alone, beside)
    assert alone.pss_anon >= 0.9 * ALLOC


def _hold(ready, done):
    ready.set()
    done.wait(30)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork (shared copy-on-write pages)")
def test_pss_counts_forked_shared_pages_once():
    ctx = multiprocessing.get_context("fork")
    shared = bytearray(ALLOC)  # touched in the parent; forked children share these pages
    shared[::4096] = b"x" * len(shared[::4096])
    readies, done = [ctx.Event() for _ in range(2)], ctx.Event()
    procs = [ctx.Process(target=_hold, args=(r, done)) for r in readies]
    for p in procs:
        p.start()
    try:
        for r in readies:
            assert r.wait(20)
        rss, pss, n, _ = sample_tree(psutil.Process())
    finally:
        done.set()
        for p in procs:
            p.join()
    assert n >= 3
    # RSS counts the shared buffer three times, PSS about once: the gap is ~2 x ALLOC.
    assert rss - pss >= 1.5 * ALLOC
    del shared


def test_sampler_rejects_bad_interval():
    with pytest.raises(ValueError):
        HostRamSampler(os.getpid(), interval_s=0)


def test_a_steady_tree_is_listed_less_often_and_a_new_worker_is_still_seen():
    """Listing the tree reads every process of the machine; while the tree stays the same the sampler waits longer
    between listings (up to TREE_REFRESH_MAX_S), and a process started after that is still counted within it."""
    code = ("import subprocess, sys\n"
            "sys.stdin.readline()\n"  # wait for the word, then start a worker-like child
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "sys.stdin.readline(); child.kill()\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, text=True)
    try:
        with HostRamSampler(parent.pid, interval_s=0.02) as sampler:
            time.sleep(4 * TREE_REFRESH_S + TREE_REFRESH_MAX_S)  # steady: the waits grow to the longest
            steady_listings = sampler.tree_listings
            assert sampler.peak().max_processes == 1
            parent.stdin.write("start\n")
            parent.stdin.flush()
            deadline = time.monotonic() + TREE_REFRESH_MAX_S + 5.0
            while sampler.peak().max_processes < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            seen = sampler.peak().max_processes
    finally:
        parent.communicate("stop\n", timeout=30)
    # listing every TREE_REFRESH_S would have taken ~(4 + TREE_REFRESH_MAX_S / TREE_REFRESH_S) listings; with the
    # waits doubling it takes about log2(max/min) + 2, plus a PSS sample's own listing now and then
    every_quarter = 4 + TREE_REFRESH_MAX_S / TREE_REFRESH_S
    assert steady_listings <= every_quarter / 2, (steady_listings, every_quarter)
    assert seen == 2


_COPY_ON_COLLECT = """
import contextlib, gc, json, os, sys
import psutil
from suite.meters.host_ram import kept_shared_with_forks

def pss_mib(*pids):
    return sum(psutil.Process(p).memory_full_info().pss for p in pids) / 2**20

held = [[i] for i in range(600_000)]  # ~45 MiB of objects the collector examines (lists), made before the fork
with kept_shared_with_forks() if sys.argv[1] == "kept" else contextlib.nullcontext() as frozen:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a loader worker: holds the pages it inherited and waits
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    before = pss_mib(os.getpid(), child)
    gc.collect()  # a full collection in the training process, after the worker forked
    after = pss_mib(os.getpid(), child)
    os.close(write)
    os.waitpid(child, 0)
print(json.dumps({"grew_mib": after - before, "frozen": frozen,
                  "frozen_after": gc.get_freeze_count()}))
"""


@pytest.mark.parametrize("mode", ["kept", "control"])
def test_a_full_collection_after_the_workers_fork_copies_nothing_the_set_up_made(mode):
    """What made the host PSS of configurations with loader workers take one of two levels from run to run: a full
    collection in the training process after the fork writes to every object it examines, and each written page
    is copied. Under ``kept_shared_with_forks`` (as the configuration process trains) the set-up's objects are frozen:
    the same collection copies (almost) nothing. The control, without it, shows that this machine copies on such a
    write at all (otherwise the first case would pass for nothing)."""
    out = subprocess.run([sys.executable, "-c", _COPY_ON_COLLECT, mode], capture_output=True, text=True,
                         timeout=120, check=True)
    seen = json.loads(out.stdout)
    if mode == "kept":
        assert seen["grew_mib"] < 4, seen  # a few pages of the collector's own and the interpreter's
        assert seen["frozen"] > 600_000 and seen["frozen_after"] == 0, seen  # given back to the collector after
    else:
        assert seen["grew_mib"] > 20, seen  # the lists' pages (~34 MiB) copied for the parent
