"""Issue 29: what a user sees. An 80-column terminal gets no line longer than 80 characters; every finished
configuration records where the cores went in its measured window, and the terminal and the report say in one
sentence what bounded it."""

import json
import os
import subprocess
import sys

import pytest

from suite.analysis.bottleneck import CORE_BOUND, explain

from conftest import runs_of

pytestmark = pytest.mark.mechanics
CORES = ("host_cpu_cores_trainer", "host_cpu_cores_loader_workers", "host_cpu_cores_other", "host_cores_available")


def test_an_80_column_terminal_gets_no_longer_line_and_every_configuration_its_cores_and_sentence(tmp_path):
    env = {**os.environ, "COLUMNS": "80", "SUITE_REPORT": "1"}
    done = subprocess.run([sys.executable, "-m", "suite", "run", "--workers", "0,2", "--steps", "3", "--no-progress",
                           "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    assert [line for line in lines if len(line) > 80] == []
    assert "what bounded each configuration" in done.stdout
    said = " ".join(done.stdout.split())  # the sentences, unwrapped
    runs = runs_of(tmp_path / "out")
    for run in runs:
        metrics = run["metrics"]
        assert all(name in metrics for name in CORES), sorted(metrics)
        assert metrics["host_cores_available"] >= 1
        assert 0 < metrics["host_cpu_cores_trainer"] <= metrics["host_cores_available"] + 0.5
        assert (metrics["host_cpu_cores_loader_workers"] > 0) == (run["config"]["num_workers"] > 0)
        assert f"{metrics['host_cores_available']:g} core" in said
        assert run["facts"]["memory_trend"] in ("plateau", "growing", "inconclusive")  # issue 31: leak or plateau
    report = (tmp_path / "out" / "report.md").read_text()
    assert "What bounded each configuration" in report and report.count(": 2 core") + report.count(": 1 core") >= 2


def test_the_sentence_names_what_bounded_a_configuration():
    base = {"host_cores_available": 2.0, "host_cpu_cores_other": 0.0, "measured_wall_s": 10.0, "measured_steps": 10}
    waiting = {**base, "host_cpu_cores_trainer": 1.0, "host_cpu_cores_loader_workers": 0.0, "data_wait_fraction": 0.4}
    assert "the input pipeline bounded it, with cores to spare" in explain(0, waiting)
    busy = {**base, "host_cpu_cores_trainer": 1.2, "host_cpu_cores_loader_workers": 0.8, "data_wait_fraction": 0.02,
            "measured_wall_s": 13.0}
    sentence = explain(2, busy, baseline={**waiting, "data_wait_fraction": 0.0})
    assert sentence.startswith("2 cores: the trainer used 1.2, the 2 workers 0.8;")
    assert "its own processes kept every core busy: the cores bounded it" in sentence
    assert "the step's compute rose 27% against workers=0 (the workers took cores from it: they used 0.8)" in sentence
    idle = {**base, "host_cpu_cores_trainer": 1.0, "host_cpu_cores_loader_workers": 0.1, "data_wait_fraction": 0.0}
    assert (1.1 / 2) < CORE_BOUND and "the training step's own compute bounded it" in explain(1, idle)
    assert explain(0, {"data_wait_fraction": 0.5}) is None  # no core figures recorded: nothing said
    # a device decoder's threads in the training process (DALI's CPU pipeline) are named, and their cores are busy
    decoding = {**idle, "host_cpu_cores_trainer": 1.0, "host_cpu_cores_loader_workers": 0.0,
                "host_cpu_cores_decoder_threads": 0.8}
    sentence = explain(0, decoding)
    assert sentence.startswith("2 cores: the trainer used 1.0, its decoder threads 0.8;")
    assert "its own processes kept every core busy: the cores bounded it" in sentence


def test_the_sentence_never_blames_the_workers_for_other_peoples_load():
    """Issue 46 (10) / 51 (1): with the workers at 0.018 cores and other work at 1.68, the sentence said "the step's
    compute rose 37 % against workers=0 (the workers took cores from it)". A table where that claim is false: other
    processes used the cores. The sentence says who took them, and no more."""
    base = {"host_cores_available": 2.0, "measured_wall_s": 13.7, "measured_steps": 10, "data_wait_fraction": 0.0,
            "host_cpu_cores_trainer": 0.3, "host_cpu_cores_loader_workers": 0.018, "host_cpu_cores_other": 1.68,
            "contention_others_cpu_share": 0.84, "contention_steal_share": 0.0}
    quiet = {**base, "measured_wall_s": 10.0, "host_cpu_cores_other": 0.0, "contention_others_cpu_share": 0.0,
             "host_cpu_cores_trainer": 1.0}
    sentence = explain(1, base, baseline=quiet)
    assert "other processes used 84% of the cores" in sentence and "answers nothing about this configuration" in sentence
    assert "workers took cores" not in sentence and "compute rose" not in sentence and "bounded it;" not in sentence


def test_a_stopped_configuration_is_said_stopped_not_blamed_on_other_work():
    """Issue 46 (10): a configuration stopped by SIGSTOP for part of its window was blamed on "other work"."""
    metrics = {"host_cores_available": 2.0, "measured_wall_s": 9.0, "measured_steps": 10, "data_wait_fraction": 0.05,
               "host_cpu_cores_trainer": 0.6, "host_cpu_cores_loader_workers": 0.0, "host_cpu_cores_other": 0.02,
               "contention_others_cpu_share": 0.01, "contention_steal_share": 0.0, "contention_paused_share": 0.55}
    sentence = explain(0, metrics)
    assert "did not run for 55% of its measured window (stopped" in sentence
    assert "other processes" not in sentence and "other work" not in sentence


@pytest.mark.e2e
def test_a_piped_run_says_each_configuration_as_it_happens(tmp_path):
    """Issue 51 (9): piped into a file or a CI log, a run printed nothing until its end (rich's live display cannot
    redraw there). Without a terminal each configuration's start and result is a line when it happens: the first
    configuration's result arrives while the run goes on, before the second starts."""
    proc = subprocess.Popen([sys.executable, "-m", "suite", "run", "--workers", "0,1", "--steps", "2",
                             "--warmup-steps", "0", "--system-metrics-interval", "0", "--output", str(tmp_path / "out"),
                             "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in proc.stderr:
            seen.append((line.strip(), proc.poll()))
            if line.startswith("[2/2]"):
                break
        proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, seen
    lines = [text for text, _ in seen]
    first = next(i for i, text in enumerate(lines) if text.startswith("[1/2]"))
    result = next(i for i, text in enumerate(lines) if "samples/s" in text)  # the first one's result (wrapped)
    assert first < result < len(lines) - 1 and lines[-1].startswith("[2/2]")
    assert seen[result][1] is None  # read while the run was still going
