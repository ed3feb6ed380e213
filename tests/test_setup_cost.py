"""Set-up cost: the per-phase clock, the file-digest and token caches, and processes started ahead of their turn."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from suite.config import RunConfig
from suite.results.record import FINISHED
from suite.results.files import MatrixInfo
from suite.results.store import ResultsStore
from suite.run.children import Standby
from suite.run.launch import launch
from suite.meters.setup import SETUP_PHASES, SetupClock, metric_name

from workloads.bridgetower.data.sources import ImageFolderSource
from workloads.bridgetower.data.synthetic import ensure_synthetic
from workloads.bridgetower.tokenizer import build_byte_level_tokenizer, tokenize_captions

pytestmark = pytest.mark.mechanics


def test_setup_clock_adds_up_phases_and_refuses_unknown_ones():
    clock = SetupClock()
    clock.add("model", 0.25)
    clock.add("model", 0.5)
    with clock.phase("tokenization"):
        time.sleep(0.01)
    assert clock.metrics()["setup_model_s"] == 0.75
    assert clock.metrics()["setup_tokenization_s"] >= 0.01
    assert list(clock.metrics()) == [metric_name(p) for p in SETUP_PHASES if p in ("model", "tokenization")]
    with pytest.raises(KeyError, match="unknown set-up phase"):
        clock.add("modle", 1.0)


@pytest.fixture()
def dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_CACHE_DIR", str(tmp_path / "cache"))
    return ensure_synthetic(samples=12, seed=3, root=tmp_path / "data")


def test_fingerprint_reuses_file_digests_across_processes_until_a_file_changes(dataset):
    first = ImageFolderSource(dataset)
    fingerprint = first.fingerprint()
    assert first.fingerprint_cache == {"hits": 0, "misses": 12}
    again = ImageFolderSource(dataset)  # a new process would build a new source: nothing shared in memory
    assert again.fingerprint() == fingerprint and again.fingerprint_cache == {"hits": 12, "misses": 0}

    # rewritten with other bytes of the same size, mtime set back: ctime moved, so it is hashed again
    image = dataset / "00004.jpg"
    stat = image.stat()
    data = bytearray(image.read_bytes())
    data[-3] ^= 0xFF
    image.write_bytes(bytes(data))
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = ImageFolderSource(dataset)
    assert changed.fingerprint()["sha256"] != fingerprint["sha256"]
    assert changed.fingerprint_cache == {"hits": 11, "misses": 1}


def test_a_cached_digest_is_not_used_for_a_file_that_would_not_be_read(dataset):
    """Over the size bound now: "unreadable" as without a cache (the run then fails or skips it)."""
    fingerprint = ImageFolderSource(dataset).fingerprint()
    bound = max(p.stat().st_size for p in dataset.glob("*.jpg")) - 1
    bounded = ImageFolderSource(dataset, max_bytes=bound)
    assert bounded.fingerprint()["sha256"] != fingerprint["sha256"]
    assert bounded.fingerprint_cache["hits"] < 12


def test_a_corrupt_digest_cache_is_ignored_and_rewritten(dataset):
    first = ImageFolderSource(dataset)
    fingerprint = first.fingerprint()
    [cache] = (Path(os.environ["SUITE_CACHE_DIR"]) / "bridgetower" / "file-hashes").glob("*.json")
    cache.write_text('{"version": 1, "root": "x", "files": {"a": [1, 2')
    again = ImageFolderSource(dataset)
    assert again.fingerprint() == fingerprint and again.fingerprint_cache["misses"] == 12
    assert json.loads(cache.read_text())["version"] == 1


def test_tokenized_captions_come_from_the_cache_only_for_the_same_captions(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_CACHE_DIR", str(tmp_path))
    tokenizer = build_byte_level_tokenizer()
    captions = ["a cat on a mat", "two dogs and an umbrella"]
    fresh, cached = tokenize_captions(tokenizer, captions, 16)
    assert not cached
    again, cached = tokenize_captions(tokenizer, captions, 16)
    assert cached
    expected = tokenizer(captions, max_length=16, padding="max_length", truncation=True, return_tensors="pt")
    for key in ("input_ids", "attention_mask"):
        assert again[key].equal(fresh[key]) and again[key].equal(expected[key])
    assert not tokenize_captions(tokenizer, [captions[0], "two dogs and a parasol"], 16)[1]
    assert not tokenize_captions(tokenizer, captions, 12)[1]  # another length
    for path in (tmp_path / "bridgetower" / "tokens").glob("*.pt"):
        path.write_bytes(b"garbage")  # a damaged cache file: tokenized again, never an error
    assert not tokenize_captions(tokenizer, captions, 16)[1]


TINY = dict(workload="bridgetower", preset="tiny", device="cpu", num_workers=0, loader="cpu", precision="fp32",
            batch_size=8, steps=2, warmup_steps=1)


def _store(tmp_path):
    return ResultsStore.create(tmp_path / "out", MatrixInfo(name="m", workload="bridgetower", command=["test"]))


def _waits_for_its_turn(standby, timeout=60.0):
    """The standby process is blocked reading its stdin (imports done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if standby.proc.poll() is not None:
            return False
        try:
            if psutil.Process(standby.proc.pid).cpu_percent(interval=0.5) < 5:
                return True
        except psutil.NoSuchProcess:
            return False
    return False


def test_a_process_started_ahead_runs_its_configuration_with_its_early_stderr_in_the_log(tmp_path):
    config = RunConfig(**TINY)
    standby = Standby(config)
    assert _waits_for_its_turn(standby)
    os.write(standby._stderr.fileno(), b"written before the hand-over\n")  # as an import warning would be
    store = _store(tmp_path)
    result = launch(config, store, standby=standby)
    assert result.status == FINISHED, result.reason
    assert result.facts["started_ahead"] is True
    # imports happened before the hand-over; the first-step latency starts at the hand-over
    assert result.metrics["setup_imports_s"] > 0.5
    log = (tmp_path / "out" / "runs" / config.config_id / "run.log").read_text()
    assert log.index("written before the hand-over") < log.index("started ahead of its turn")


def test_a_process_started_ahead_that_does_not_fit_is_replaced_by_a_fresh_one(tmp_path):
    standby = Standby(RunConfig(**TINY), memory_limit_bytes=64 * 2**30)  # another memory limit than the run's
    result = launch(RunConfig(**TINY), _store(tmp_path), standby=standby)
    assert result.status == FINISHED, result.reason
    assert result.facts["started_ahead"] is False
    assert standby.proc.poll() is not None  # cancelled, not left waiting


def test_a_process_started_ahead_that_died_is_replaced_by_a_fresh_one(tmp_path):
    standby = Standby(RunConfig(**TINY))
    os.killpg(standby.proc.pid, signal.SIGKILL)
    standby.proc.wait(timeout=30)
    result = launch(RunConfig(**TINY), _store(tmp_path), standby=standby)
    assert result.status == FINISHED and result.facts["started_ahead"] is False


def test_a_process_started_ahead_exits_when_its_runner_is_killed(tmp_path):
    """kill -9 of the runner closes the standby's stdin: it exits on its own instead of waiting forever."""
    script = ("import sys, time\n"
              "from suite.config import RunConfig\n"
              "from suite.run.launch import Standby\n"
              f"standby = Standby(RunConfig(**{TINY!r}))\n"
              "print(standby.proc.pid, flush=True)\n"
              "time.sleep(600)\n")
    runner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(runner.stdout.readline())
        assert psutil.pid_exists(pid)
    finally:
        runner.kill()
        runner.wait()
    process = psutil.Process(pid)
    try:
        process.wait(timeout=90)  # finishes its imports, reads end of input, exits
    except psutil.TimeoutExpired:
        process.kill()
        pytest.fail("the process started ahead outlived its runner")


def test_cancel_stops_a_process_started_ahead_while_it_imports():
    standby = Standby(RunConfig(**TINY))
    standby.cancel()
    assert standby.proc.poll() is not None


def test_no_process_is_left_behind_when_the_matrix_is_refused(tmp_path, capsys):
    """The first configurations' processes start before the dataset check; a refused matrix cancels them."""
    from suite.cli import main

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    code = main(["run", "--workers", "0,1", "--steps", "1", "--batch-size", "100000", "--no-progress",
                 "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    assert code == 2 and "fewer than one batch" in capsys.readouterr().err
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [p.cmdline() for p in left]


def test_the_progress_line_names_the_first_step_latency_and_its_largest_phases():
    from suite.analysis.summary import setup_text, timing_line
    from suite.results.record import RunResult

    metrics = {"setup_imports_s": 6.0, "setup_model_s": 0.4, "setup_tokenization_s": 0.2, "setup_device_s": 0.01,
               "setup_first_step_s": 0.9}
    assert setup_text(metrics) == "first step after 0.9 s (model 0.4, tokenization 0.2 s)"
    assert setup_text({"setup_model_s": 0.4}) == ""  # a run that never reached its first step
    result = RunResult(config=RunConfig(**TINY), status=FINISHED, metrics=metrics)
    line = timing_line([result], {"matrix_wall_s": 20.0, "in_window_s": 9.0, "in_window_fraction": 0.45,
                                  "setup_mlflow_s": 2.5})
    assert line == ("time: 9.0 s of the matrix's 20.0 s in warm-up + measured windows (45%); first step after 0.9 s "
                    "(median over configurations); MLflow set-up 2.5 s")


def test_the_matrix_wall_time_is_partitioned_along_its_runs():
    from suite.analysis.summary import timing_line
    from suite.analysis.timeline import TIMELINE, matrix_timing
    from suite.results.record import KILLED, RunResult

    now = time.time()
    start = now - 30.0

    def run(begin, end, window, evaluation, **kw):
        return RunResult(config=RunConfig(**TINY), status=FINISHED, started_at=start + begin, ended_at=start + end,
                         metrics={"warmup_wall_s": 0.5, "measured_wall_s": window - 0.5, "eval_time_s": evaluation,
                                  "setup_first_step_s": 0.6}, **kw)

    runs = [run(8.0, 14.0, 3.0, 2.0), run(15.0, 21.0, 3.0, 2.5), run(25.0, 29.0, 2.5, 1.0)]
    timing = matrix_timing(runs, start, 1.5)
    assert sum(timing[key] for key, _ in TIMELINE) == pytest.approx(timing["matrix_wall_s"])
    assert timing["before_first_s"] == pytest.approx(8.0)
    assert timing["in_window_s"] == pytest.approx(8.5) and timing["evaluation_s"] == pytest.approx(5.5)
    assert timing["setup_and_teardown_s"] == pytest.approx(16.0 - 8.5 - 5.5)
    assert timing["between_configurations_s"] == pytest.approx(1.0 + 4.0)
    assert timing["after_last_s"] == pytest.approx(1.0, abs=0.5)
    line = timing_line(runs, timing)
    assert line.startswith("time: 8.5 s of the matrix's 30.0 s in warm-up + measured windows (28%); outside them: "
                           "8.0 s before the first configuration, 5.5 s evaluating, 2.0 s setting configurations up "
                           "and down, 5.0 s between configurations, 1.0 s after the last; first step after 0.6 s"), line
    # measured on another node: not this node's time; a run that never started, or runs side by side: no partition
    from suite.results.record import WORKER_NODE

    elsewhere = run(29.1, 29.5, 1.0, 0.0, facts={"node_role": WORKER_NODE})
    assert elsewhere.recorded_elsewhere
    assert matrix_timing([*runs, elsewhere], start, None)["in_window_s"] == pytest.approx(8.5)
    never = RunResult(config=RunConfig(**TINY), status=KILLED, ended_at=now)
    overlapping = [run(8.0, 14.0, 3.0, 2.0), run(13.0, 21.0, 3.0, 2.5)]
    for partial in ([*runs, never], overlapping):
        timing = matrix_timing(partial, start, None)
        assert "in_window_fraction" in timing and not {k for k, _ in TIMELINE} - {"in_window_s"} & set(timing)


def test_a_process_started_ahead_that_dies_at_the_hand_over_is_replaced_by_a_fresh_one(tmp_path, monkeypatch):
    """It died after the runner checked it (the race fits() cannot close): the hand-over meets a broken pipe."""
    standby = Standby(RunConfig(**TINY))
    os.killpg(standby.proc.pid, signal.SIGKILL)
    standby.proc.wait(timeout=30)
    monkeypatch.setattr(Standby, "fits", lambda self, config, limit: True)
    result = launch(RunConfig(**TINY), _store(tmp_path), standby=standby)
    assert result.status == FINISHED, result.reason
    assert result.facts["started_ahead"] is False
