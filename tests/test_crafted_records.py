"""Issue 46, readers: every reader command (report, compare, compare --json, audit --no-rerun, export, score) given a
crafted but valid record answers with a table or one line, never a traceback or a hang: a record that does not fit the
schema is one line naming the file and the field; a figure its metric cannot take (NaN, ±Inf, a throughput of 0) is
shown as "-" with the reason and never divided by; what is parsed is bounded by what it would become in memory."""

import copy
import json
import math
import re
import resource
import shutil
import subprocess
import sys
import time

import pytest

from suite.cli import main
from suite.fileio import json_memory_estimate
from suite.results.mlperf_log import LOG_MAX_LINE, parse_log

pytestmark = pytest.mark.mechanics


def _edit_runs(folder, edit):
    """``edit`` applied to every run record, in results.json and in each run's result.json alike."""
    data = json.loads((folder / "results.json").read_text())
    for run in data["runs"]:
        edit(run)
    (folder / "results.json").write_text(json.dumps(data))
    for result in folder.glob("runs/*/result.json"):
        run = json.loads(result.read_text())
        edit(run)
        result.write_text(json.dumps(run))


def _every_metric(value):
    def edit(run):
        run["metrics"] = {name: value for name in run["metrics"]}
    return edit


def _every_fact(value):
    def edit(run):
        run["facts"] = {name: copy.deepcopy(value) for name in run["facts"]}
    return edit


def _ten_identical_runs(folder):
    """Ten runs of one configuration with the same figures: their score's 95 % interval came out a last bit off the
    score, and the report's chart died on a negative error bar ("'yerr' must not contain negative values")."""
    data = json.loads((folder / "results.json").read_text())
    first = data["runs"][0]
    data["runs"] = [{**copy.deepcopy(first), "run_uid": f"uid{i}", "repeat": i} for i in range(10)]
    (folder / "results.json").write_text(json.dumps(data))


def _listed_twice(folder):
    data = json.loads((folder / "results.json").read_text())
    data["runs"] = data["runs"] + [copy.deepcopy(data["runs"][0])]
    (folder / "results.json").write_text(json.dumps(data))


CRAFTED = {
    "every metric NaN": lambda f: _edit_runs(f, _every_metric(float("nan"))),
    "every metric +Inf": lambda f: _edit_runs(f, _every_metric(float("inf"))),
    "every metric -Inf": lambda f: _edit_runs(f, _every_metric(float("-inf"))),
    "every metric 0": lambda f: _edit_runs(f, _every_metric(0)),
    "every metric 1e40": lambda f: _edit_runs(f, _every_metric(1e40)),
    "facts that are strings": lambda f: _edit_runs(f, _every_fact("x")),
    "facts that are lists": lambda f: _edit_runs(f, _every_fact([1, 2])),
    "started_at 1e308": lambda f: _edit_runs(f, lambda run: run.update(started_at=1e308)),
    "a path that is not UTF-8": lambda f: _edit_runs(f, lambda run: run["config"].update(dataset="/data/caf\udcff")),
    "ten identical runs": _ten_identical_runs,
    "a run listed twice": _listed_twice,
}


def _readers(folder, tmp_path):
    return {"report": ["report", str(folder)], "compare": ["compare", str(folder), "--output", str(tmp_path / "cmp")],
            "compare --json": ["compare", "--json", str(folder)],
            "audit --no-rerun": ["audit", "--no-rerun", str(folder), "--output", str(tmp_path / "audit"),
                                 "--no-progress", "--tracking-uri", f"sqlite:///{tmp_path}/audit.db"],
            "export": ["export", str(folder), "--output", str(tmp_path / "export")],
            "score": ["score", str(folder)]}


@pytest.mark.parametrize("case", CRAFTED)
def test_every_reader_answers_a_crafted_record_with_a_table_or_one_line(case, recorded_matrix, tmp_path, capsys):
    folder = tmp_path / "crafted"
    shutil.copytree(recorded_matrix, folder)
    CRAFTED[case](folder)
    for name, args in _readers(folder, tmp_path).items():
        shutil.rmtree(tmp_path / "audit", ignore_errors=True)
        code = main(args)  # a traceback would be an exception here
        out, err = capsys.readouterr()
        assert code in (0, 1, 2, 3), (name, code, err)
        errors = [line for line in err.splitlines() if line.startswith("suite: error:")]
        if code == 2:
            assert len(errors) == 1 and err.strip().endswith(errors[0].split(": ", 2)[-1].strip()), (name, err)
        if name == "compare --json" and code == 0:
            json.loads(out, parse_constant=lambda c: pytest.fail(f"compare --json wrote {c}"))
        if case in ("every metric NaN", "every metric 0"):
            assert "throughput_samples_per_s" in err, (name, err)  # the figure named, with why it is not used


def test_a_record_that_does_not_fit_names_the_file_and_the_field(recorded_matrix, tmp_path, capsys):
    folder = tmp_path / "crafted"
    shutil.copytree(recorded_matrix, folder)
    _edit_runs(folder, lambda run: run["facts"].update(contention="busy"))
    assert main(["compare", str(folder)]) == 2
    assert capsys.readouterr().err.strip() == (f"suite: error: {folder / 'results.json'}: run 0: facts.contention is "
                                               "a string, not object")


def test_a_figure_its_metric_cannot_take_is_shown_as_a_dash_with_the_reason(recorded_matrix, tmp_path, capsys):
    folder = tmp_path / "crafted"
    shutil.copytree(recorded_matrix, folder)
    _edit_runs(folder, lambda run: run["metrics"].update(step_time_p50_s=float("nan"), data_wait_fraction=3.0))
    assert main(["compare", str(folder), "--output", str(tmp_path / "cmp")]) == 0
    out, err = capsys.readouterr()
    assert "step_time_p50_s: nan is not a finite number" in err and "data_wait_fraction: 3 is above 1" in err
    rows = [line for line in out.splitlines() if line.startswith("│") and "workers=" in line]
    assert rows and all(re.search(r"│\s+-\s+│", line) for line in rows)  # p50 and data-wait: "-"
    # written back as it was read: nothing is lost when a folder is rewritten
    from suite.results.files import read_results_file

    result = read_results_file(folder / "results.json")[0]
    assert "step_time_p50_s" not in result.metrics and math.isnan(result.to_dict()["metrics"]["step_time_p50_s"])


def _peak_rss_of(args, timeout=120):
    """Peak RSS (MiB) of ``suite ARGS`` run by a fresh Python that waits for it (RUSAGE_CHILDREN counts the
    processes it waited for: this one alone), with its output and exit status."""
    wrapper = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(done.returncode)")
    done = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "suite", *args], capture_output=True,
                          text=True, timeout=timeout)
    *said, peak = done.stderr.strip().splitlines()
    done.stderr = "\n".join(said)
    return int(peak) / 1024, done


def test_a_results_file_of_twenty_megabytes_of_empty_objects_is_refused_before_it_is_parsed(recorded_matrix, tmp_path):
    """A 99 MB results.json of `{}` reached 2.6 GB of RSS before its one-line error (the 512 MiB byte cap would have
    let ~13.5 GB through): the bound is on what the text becomes in memory."""
    folder = tmp_path / "crafted"
    shutil.copytree(recorded_matrix, folder)
    body = b",".join([b"{}"] * 7_000_000)
    (folder / "results.json").write_bytes(b'{"schema_version": 2, "runs": [' + body + b"]}")
    assert json_memory_estimate(body) > 1024 * 2**20
    peak, done = _peak_rss_of(["compare", str(folder)])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "once read" in done.stderr and "over the limit" in done.stderr
    assert peak < 800, f"{peak:.0f} MiB"


@pytest.mark.parametrize("text,said", [
    (b"[" * 5_000_000, "over the limit"),  # 5 MB of [: bigger than a config file may be
    (b"[" * 300_000, "MiB once read"),  # under the byte cap, over what its objects would take
    (b'{"workers": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", "nested too deeply"),
])
def test_a_config_file_is_bounded_in_bytes_in_memory_and_in_depth(tmp_path, capsys, text, said):
    config = tmp_path / "c.json"
    config.write_bytes(text)
    code = main(["run", "--config", str(config), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err


def test_a_config_file_of_three_gigabytes_is_refused_without_reading_it(tmp_path, capsys):
    config = tmp_path / "c.json"
    with open(config, "wb") as handle:  # sparse: no disk taken
        handle.truncate(3 * 2**30)
    started = time.monotonic()
    assert main(["run", "--config", str(config), "--dry-run"]) == 2
    assert "over the limit" in capsys.readouterr().err and time.monotonic() - started < 10


def test_a_metric_name_of_two_megabytes_is_refused_in_one_line(recorded_matrix, tmp_path, capsys):
    """It drove `suite export` to 1.9 GB: a column per name, a name per cell."""
    folder = tmp_path / "crafted"
    shutil.copytree(recorded_matrix, folder)
    _edit_runs(folder, lambda run: run["metrics"].update({"m" * 2_000_000: 1.0}))
    assert main(["export", str(folder), "--output", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "a metric name of 2,000,000 characters" in err and len(err) < 400


def test_score_reads_a_log_of_one_long_line_at_once(recorded_matrix, tmp_path):
    """mlperf-logging's parser costs the square of a line's length (re.sub(".*:::MLLOG ")): a one-line log of
    200 kB hung `suite score`. Lines are bounded before any parser sees them."""
    folder = tmp_path / "crafted"
    shutil.copytree(recorded_matrix, folder)
    for log in folder.glob("runs/*/mlperf.log"):
        log.write_text(':::MLLOG {"key": "' + "x" * 200_000 + '"}\n')
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "suite", "score", str(folder)], capture_output=True, text=True,
                          timeout=120)
    assert time.monotonic() - started < 60 and "Traceback" not in done.stderr
    assert done.returncode == 2  # nothing to score: no time-to-train run


def test_the_bounded_parser_gives_what_mlcommons_parser_gives(recorded_matrix, tmp_path):
    """The real parser (mlperf-logging's ``parse_file``) against ours on real logs and on a log with a prefix, a
    non-MLLOG line and a broken line: the same lines, keys, values and errors."""
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    from suite.results.mlperf_log import newest_training_ruleset

    ruleset = newest_training_ruleset()
    logs = sorted(recorded_matrix.glob("runs/*/mlperf.log"))
    odd = tmp_path / "odd.log"
    real = logs[0].read_text().splitlines()
    odd.write_text("\n".join(["a plain line", "node0: " + real[0], ':::MLLOG {"broken', *real[1:]]) + "\n")
    for log in [*logs, odd]:
        theirs, their_errors = parse_file(str(log), ruleset=ruleset)
        ours, our_errors = parse_log(log, ruleset)
        assert [(l.key, l.timestamp, l.value, l.lineno) for l in ours] == \
            [(l.key, l.timestamp, l.value, l.lineno) for l in theirs]
        assert [line for line, _ in our_errors] == [line for line, _ in their_errors]
    long = tmp_path / "long.log"
    long.write_text(":::MLLOG " + "x" * (LOG_MAX_LINE + 1) + "\n")
    with pytest.raises(ValueError, match="over the limit"):
        parse_log(long, ruleset)


@pytest.mark.parametrize("holder", [True, False])
def test_auditing_a_matrix_that_has_not_ended_is_never_a_pass(recorded_matrix, tmp_path, capsys, holder):
    """Issue 46 (10): `audit --no-rerun` of a matrix still running said PASS without "incomplete"."""
    from filelock import FileLock

    folder = tmp_path / "running"
    shutil.copytree(recorded_matrix, folder)
    matrix = json.loads((folder / "matrix.json").read_text())
    matrix.update(status="RUNNING", ended_at=None)
    (folder / "matrix.json").write_text(json.dumps(matrix))
    lock = FileLock(str(folder / ".suite.lock"))
    if holder:
        lock.acquire()
    try:
        code = main(["audit", "--no-rerun", str(folder), "--output", str(tmp_path / "audit"), "--no-progress",
                     "--tracking-uri", f"sqlite:///{tmp_path}/audit.db"])
    finally:
        if holder:
            lock.release()
    out = capsys.readouterr().out
    assert code == 3 and "audit verdict: INCONCLUSIVE" in out
    assert ("still running" if holder else "left RUNNING by a runner that is gone") in out
