"""MLPerf logging through mllog (the ruleset and MLCommons' checker on real logs: tests/test_mlperf_rules.py)."""

import json

import pytest

from suite.results.mlperf_log import RULESET, MlperfLog

pytestmark = pytest.mark.mechanics


def test_wrapper_refuses_what_mllog_would_swallow(tmp_path):
    log = MlperfLog(tmp_path / "a.log")
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        log.event("seed", object())
    with pytest.raises(ValueError, match="ended without 'run_start'"):
        log.end("run_stop")
    log.start("init_start")
    with pytest.raises(ValueError, match="intervals never ended: init_start"):
        log.close()


def test_abort_closes_open_intervals_innermost_first(tmp_path):
    log = MlperfLog(tmp_path / "a.log")
    log.start("run_start")
    log.start("block_start", metadata={"first_step": 0, "step_count": 1})
    log.abort("loader worker died")
    log.close()
    events = [json.loads(line.split(" ", 1)[1]) for line in (tmp_path / "a.log").read_text().splitlines()]
    assert [e["key"] for e in events] == ["run_start", "block_start", "block_stop", "run_stop"]
    assert (events[-1]["metadata"]["status"], events[-1]["metadata"]["reason"]) == ("aborted", "loader worker died")


def test_ruleset_ships_with_the_package():
    assert RULESET.is_file() and RULESET.suffix == ".yaml"
