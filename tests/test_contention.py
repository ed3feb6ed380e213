"""The contention meter's pause watch, on real processes: a configuration stopped by SIGSTOP for part of its window is
seen as not running (issue 46: it was blamed on "other work"), and a thread that holds the GIL is not mistaken for a
stop."""

import multiprocessing
import os
import signal
import time

import pytest

from suite.meters.contention import PAUSED_SHARE_LIMIT, ContentionMeter, PauseWatch

pytestmark = pytest.mark.mechanics


def _window(seconds: float, hog_gil: bool, pipe) -> None:
    meter = ContentionMeter()
    meter.start()
    pipe.send("started")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if hog_gil:
            sum(range(30_000_000))  # one C call: the GIL held for a good part of a second, CPU spent
        else:
            time.sleep(0.01)
    contention = meter.stop()
    pipe.send((contention.paused_s, contention.window_s, contention.paused_share, contention.contended))


def _measure(stop_for: float, hog_gil: bool = False, window: float = 3.0):
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    process = context.Process(target=_window, args=(window, hog_gil, child))
    process.start()
    try:
        assert parent.poll(30) and parent.recv() == "started"
        if stop_for:
            time.sleep(0.5)
            os.kill(process.pid, signal.SIGSTOP)
            time.sleep(stop_for)
            os.kill(process.pid, signal.SIGCONT)
        assert parent.poll(60)
        return parent.recv()
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()


def test_a_window_stopped_by_sigstop_counts_the_time_it_did_not_run():
    paused, window, share, contended = _measure(stop_for=1.5)
    assert 1.2 <= paused <= 2.0, paused
    assert window >= 3.0 and share == pytest.approx(paused / window) and share > PAUSED_SHARE_LIMIT and contended


def test_a_window_that_ran_throughout_counts_no_pause():
    paused, _, share, _ = _measure(stop_for=0.0)
    assert paused == 0.0 and share == 0.0


def test_a_thread_holding_the_gil_is_not_a_pause():
    """The watch cannot wake while another thread holds the GIL, but the process spends CPU meanwhile: not a stop."""
    paused, _, _, _ = _measure(stop_for=0.0, hog_gil=True)
    assert paused == 0.0


def test_the_watch_alone_stops_at_once():
    watch = PauseWatch()
    watch.start()
    started = time.monotonic()
    assert watch.stop() == 0.0 and time.monotonic() - started < 1.0
