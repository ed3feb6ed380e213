"""MLPerf logging through mllog, checked by MLCommons' compliance checker against our ruleset."""

import json

import pytest

from suite.results.mlperf_log import RULESET, MlperfLog, check_compliance

pytestmark = pytest.mark.mechanics


def _write_run(path, steps_logged=True, throughput=True, status="success"):
    log = MlperfLog(path)
    log.event("submission_benchmark", "bridgetower")
    log.start("init_start")
    for key, value in [("seed", 42), ("global_batch_size", 8), ("gradient_accumulation_steps", 1),
                       ("train_samples", 512), ("opt_name", "adamw"), ("opt_base_learning_rate", 1e-5)]:
        log.event(key, value)
    log.end("init_stop")
    log.start("run_start")
    if steps_logged:
        log.start("block_start", metadata={"first_step": 3, "step_count": 30})
        log.end("block_stop", metadata={"first_step": 3, "step_count": 30})
    if throughput:
        log.event("throughput", 61.5, metadata={"unit": "samples/s"})
    log.end("run_stop", metadata={"status": status})
    log.close()


def test_a_complete_run_log_is_compliant(tmp_path):
    _write_run(tmp_path / "mlperf.log")
    lines = (tmp_path / "mlperf.log").read_text().splitlines()
    assert all(line.startswith(":::MLLOG {") for line in lines)
    assert json.loads(lines[0].split(" ", 1)[1])["metadata"]["file"].endswith("test_mlperf_log.py")
    passed, output = check_compliance(tmp_path / "mlperf.log")
    assert passed, output


@pytest.mark.parametrize("kwargs,message", [
    (dict(throughput=False), "\"throughput_logged\": false"),  # success without a throughput
    (dict(steps_logged=False), "block_start"),  # no measured window
    (dict(status="done"), "run_stop"),
])
def test_the_checker_rejects_incomplete_logs(tmp_path, kwargs, message):
    _write_run(tmp_path / "mlperf.log", **kwargs)
    passed, output = check_compliance(tmp_path / "mlperf.log")
    assert not passed
    assert message in output


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
    log.abort()
    log.close()
    keys = [json.loads(line.split(" ", 1)[1])["key"] for line in (tmp_path / "a.log").read_text().splitlines()]
    assert keys == ["run_start", "block_start", "block_stop", "run_stop"]


def test_ruleset_ships_with_the_package():
    assert RULESET.is_file() and RULESET.suffix == ".yaml"
