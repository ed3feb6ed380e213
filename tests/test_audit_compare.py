"""Audit record checks and published-vs-measured ratios, on the published record and on synthetic ones."""

from pathlib import Path

import pytest

from suite.audit import FAIL, PASS, Record, audit_reference, check_loader, check_warmup_accounting
from suite.cli import main
from suite.compare import compare, load_reference, measured_table, ratios, reference_table
from suite.errors import SuiteError

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
    assert r["gaudi2 cpu-loader: workers 2 vs 0"] == pytest.approx(768.7 / 601.5)
    assert r["gaudi2 vs h100: cpu-loader, workers 2"] == pytest.approx(768.7 / 602.1)
    assert r["gaudi2 workers 2: device-loader vs cpu-loader"] == pytest.approx(847.7 / 768.7)


def test_measured_ratios_line_up_with_published_ones():
    from suite.comparison import rows_from_results

    _, data = load_reference(str(REFERENCE))
    config = dict(workload="bridgetower", preset="large", device="h100", loader="cpu", precision="bf16")
    runs = [{"config": {**config, "num_workers": n}, "status": "FINISHED",
             "metrics": {"throughput_samples_per_s": v}} for n, v in [(0, 40.0), (2, 70.0)]]
    scores = [{"config_id": "bridgetower-large-h100-nw2-cpu-bf16", "repeats": 3, "throughput_score": 80.0,
               "throughput_cv": 0.01}]
    rows = {r.name: r for r in compare(reference_table(data), measured_table(rows_from_results(runs, scores)))}
    row = rows["h100 cpu-loader: workers 2 vs 0"]
    assert row.published == pytest.approx(602.1 / 336.5) and row.measured == pytest.approx(2.0)  # score wins
    assert rows["gaudi2 vs h100: cpu-loader, workers 0"].measured is None


def test_unknown_reference_lists_the_available_ones():
    with pytest.raises(SuiteError, match="unknown reference 'nope'; available: .*bridgetower_hf_blog_2023"):
        load_reference("nope")


def _result(losses, throughput=100.0, device_name="cpu-x", status="FINISHED"):
    from suite.results import RunResult

    config = dict(workload="w", preset="p", device="cpu", num_workers=0, loader="cpu", precision="fp32", steps=2,
                  warmup_steps=0, seed=1, batch_size=8, dataset=None, weights=None)
    return RunResult(config=config, status=status, reason=None if status == "FINISHED" else "boom", losses=losses,
                     metrics={"throughput_samples_per_s": throughput}, facts={"device": {"device_name": device_name}})


MANIFEST = {"device": {"device_name": "cpu-x"}, "dataset_fingerprint": {"sha256": "d"},
            "initial_weights_sha256": "w", "tokenizer_sha256": "t"}


def _verdicts(checks):
    return {c.name: c.verdict for c in checks}


def test_rerun_comparison_rules():
    from suite.audit import compare_rerun

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


def test_noise_band_uses_recorded_spread_and_drift_is_a_warning():
    from suite.audit import WARN, environment_check, noise_band_for

    scores = [{"config_id": "c", "throughput_cv": 0.08}]
    assert noise_band_for("c", scores, 0.1) == pytest.approx(0.24)
    assert noise_band_for("other", scores, 0.1) == 0.1
    check = environment_check([{"packages": {"torch": "0.0.1"}}])
    assert check.verdict == WARN and "torch 0.0.1 ->" in check.detail
