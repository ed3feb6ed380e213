"""Audit record checks and published-vs-measured ratios, on the published record and on synthetic ones."""

from pathlib import Path

import pytest

from suite.audit.checks import FAIL, PASS
from suite.audit.verdicts import Record
from suite.audit.record_checks import audit_reference, check_loader, check_warmup_accounting
from suite.cli import main
from suite.analysis.published import align, load_reference, measured_table, ratios, reference_table
from suite.errors import SuiteError
from suite.config import RunConfig

pytestmark = pytest.mark.mechanics

REFERENCE = Path(__file__).resolve().parents[1] / "reference" / "bridgetower_hf_blog_2023.json"


def test_audit_flags_the_known_flaws_of_the_published_benchmark():
    report = audit_reference(REFERENCE)
    assert not report.passed
    by_check = {}
    for c in report.checks:
        by_check.setdefault(c.name, []).append(c)
    assert all(c.verdict == FAIL and c.detail == "logged 48 but used 40" for c in by_check["batch_size"])
    [warmup] = by_check["warmup_accounting"]
    assert warmup.verdict == FAIL and "0 excluded by h100" in warmup.detail and "3 excluded by gaudi2" in warmup.detail
    loader_fails = [c.subject for c in by_check["loader"] if c.verdict == FAIL]
    assert loader_fails == ["gaudi2-nw2-device"]  # workers reported but ignored with the media pipeline


def test_audit_command_on_the_reference_exits_non_zero(capsys):
    assert main(["audit", str(REFERENCE)]) == 1
    assert "unequal accounting" in capsys.readouterr().out


def _record(subject, warmup=3, loader="cpu", ran="cpu", workers=2, effective=2):
    return Record(subject, 8, 8, warmup, loader, ran, workers, effective)


def test_record_checks_pass_and_fail():
    assert check_warmup_accounting([_record("a"), _record("b")])[0].verdict == PASS
    assert check_warmup_accounting([_record("a"), _record("b", warmup=None)])[0].verdict == FAIL
    assert [c.verdict for c in check_loader([_record("a"), _record("b", ran="device")])] == [PASS, FAIL]


def test_published_ratios():
    _, data = load_reference("bridgetower_hf_blog_2023")
    r = ratios(reference_table(data))
    assert r["gaudi2 cpu-loader bf16 hf-trainer: workers 2 vs 0"] == pytest.approx(768.7 / 601.5)
    assert r["gaudi2 vs h100: cpu-loader bf16 hf-trainer, workers 2"] == pytest.approx(768.7 / 602.1)
    assert r["gaudi2 bf16 hf-trainer workers 2: device-loader vs cpu-loader"] == pytest.approx(847.7 / 768.7)


def _row(throughput, runs=1, **fields):
    from suite.analysis.compare import rows_from_results
    from suite.results.record import RunResult

    config = {**dict(workload="bridgetower", preset="large", device="h100", loader="cpu", precision="bf16",
                     engine="hf-trainer", num_workers=0, batch_size=48), **fields}
    results = [RunResult(config=RunConfig.from_dict(config), status="FINISHED",
                         metrics={"throughput_samples_per_s": throughput})
               for _ in range(runs)]
    [row] = rows_from_results(results)
    return row


def test_measured_ratios_line_up_with_published_ones():
    _, data = load_reference(str(REFERENCE))
    rows = [_row(40.0), _row(70.0, num_workers=2)]
    alignment = align(reference_table(data), measured_table(rows))
    by_kind = {r.kind.label: r for r in alignment.ratios}
    row = by_kind["loader cpu: workers 2 vs 0"]
    [h100_published] = [s for s in alignment.published_series if s.device == "h100"]
    [h100_measured] = alignment.measured_series
    assert row.published[h100_published] == pytest.approx(602.1 / 336.5)
    assert row.measured[h100_measured] == pytest.approx(70.0 / 40.0)
    assert "loader=cpu workers=1" in by_kind["loader cpu: workers 1 vs 0"].why[h100_measured]


def test_measured_ratios_keep_precision_and_engine_apart_whatever_the_row_order():
    """Rows of fp32 and bf16 (or of two engines) are separate cells: no first-row-wins, same ratios in any order."""
    rows = [_row(40.0, precision="fp32", engine="suite"), _row(60.0, precision="fp32", engine="suite", num_workers=2),
            _row(10.0), _row(30.0, num_workers=2)]
    forward, backward = ratios(measured_table(rows)), ratios(measured_table(list(reversed(rows))))
    assert forward == backward
    assert forward["h100 cpu-loader fp32 suite: workers 2 vs 0"] == pytest.approx(1.5)
    assert forward["h100 cpu-loader bf16 hf-trainer: workers 2 vs 0"] == pytest.approx(3.0)


def test_two_rows_on_one_published_cell_are_an_error_naming_both():
    rows = [_row(40.0, prefetch_factor=2), _row(50.0, prefetch_factor=4)]
    with pytest.raises(SuiteError, match="configurations .*-pf2-.* and .*-pf4-.* both measure h100"):
        measured_table(rows)


def test_unknown_reference_lists_the_available_ones():
    with pytest.raises(SuiteError, match="unknown reference 'nope'; available: .*bridgetower_hf_blog_2023"):
        load_reference("nope")


def _result(losses, throughput=100.0, device_name="cpu-x", status="FINISHED"):
    """A run of 30 steady steps at ``throughput`` (batch 8), measured on a quiet machine."""
    from suite.results.record import RunResult

    config = dict(workload="w", preset="p", device="cpu", num_workers=0, loader="cpu", precision="fp32", steps=2,
                  warmup_steps=0, seed=1, batch_size=8, dataset=None, weights=None)
    steps = [8 / throughput * (1 + 0.01 * ((i * 5) % 7 - 3) / 3) for i in range(30)]
    return RunResult(config=RunConfig.from_dict(config), status=status,
                     reason=None if status == "FINISHED" else "boom", losses=losses,
                     metrics={"throughput_samples_per_s": throughput},
                     facts={"device": {"device_name": device_name}, "step_times_s": steps,
                            "contention": {"contended": False, "others_share": 0.01, "steal_share": 0.0}})


MANIFEST = {"device": {"device_name": "cpu-x"}, "dataset_fingerprint": {"sha256": "d"},
            "initial_weights_sha256": "w", "tokenizer_sha256": "t"}


def _verdicts(checks):
    return {c.name: c.verdict for c in checks}


def test_rerun_comparison_rules():
    from suite.audit.rerun import compare_rerun

    same = compare_rerun(_result([1.0, 0.5]), MANIFEST, _result([1.0, 0.5], 105.0), MANIFEST, 0.1, 1e-2)
    assert _verdicts(same) == {"rerun": PASS, "inputs": PASS, "loss_digest": PASS, "throughput": PASS}
    drifted = compare_rerun(_result([1.0, 0.5]), MANIFEST, _result([1.0, 0.5000001], 50.0), MANIFEST, 0.1, 1e-2)
    assert _verdicts(drifted)["loss_digest"] == FAIL  # same device kind: bit-identical or nothing
    assert _verdicts(drifted)["throughput"] == FAIL  # -50 % is outside a 10 % band
    other = compare_rerun(_result([1.0, 0.5]), MANIFEST, _result([1.0, 0.5001], device_name="gpu-y"), MANIFEST,
                          0.1, 1e-2)
    assert _verdicts(other)["loss_digest"] == PASS and "tolerance 0.01" in other[2].detail
    changed_inputs = compare_rerun(_result([1.0]), MANIFEST, _result([1.0]), {**MANIFEST, "tokenizer_sha256": "u"},
                                   0.1, 1e-2)
    assert _verdicts(changed_inputs)["inputs"] == FAIL
    failed = compare_rerun(_result([1.0]), MANIFEST, _result([], status="FAILED"), MANIFEST, 0.1, 1e-2)
    assert _verdicts(failed) == {"rerun": FAIL}


def test_recorded_repeats_are_read_and_drift_is_a_warning():
    from suite.audit.verdicts import WARN
    from suite.audit.rerun import environment_check, recorded_repeats

    scores = [{"config_id": "c", "throughput_values": [100.0, 90.0, float("nan")]}]
    assert recorded_repeats("c", scores) == [100.0, 90.0] and recorded_repeats("other", scores) is None
    check = environment_check([{"packages": {"torch": "0.0.1"}}])
    assert check.verdict == WARN and "torch 0.0.1 ->" in check.detail
    commit = environment_check([{"packages": {}, "git": {"git_commit": "0123456789abcdef"}}])
    assert commit.verdict == WARN and "suite commit 0123456789ab ->" in commit.detail
