"""Issue 49: every figure with a second witness in the results folder is cross-examined (suite/audit/witnesses.py),
the witnesses taken from the catalogue of figures. Each forgery of the issue is made on a copy of a real recorded
matrix, in every file the issue says the forger edited (results.json and the run folder's own result.json alike, so
that the witness named is the one that speaks), and the audit FAILs it naming that witness; the untouched folder
passes."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from suite.audit.checks import load_directory
from suite.audit.witnesses import check_witnesses
from suite.cli import main
from suite.figures import FACTS, FIGURES, Witness
from suite.workload import catalogue_of

pytestmark = [pytest.mark.mechanics, pytest.mark.e2e]

KINDS = {"fact", "formula", "config", "manifest", "log", "last_evaluation", "count", "peak_of", "within",
         "contention_rule"}


def _copy(recorded_matrix, tmp_path) -> Path:
    shutil.copytree(recorded_matrix, tmp_path / "copy")
    return tmp_path / "copy"


def _edit_runs(folder: Path, edit, *, copy_too: bool = True, index: int = 0) -> None:
    """``edit(run)`` on results.json's run ``index`` and (``copy_too``) on its run folder's result.json."""
    data = json.loads((folder / "results.json").read_text())
    run = data["runs"][index]
    edit(run)
    (folder / "results.json").write_text(json.dumps(data))
    if copy_too:
        own = folder / run["facts"]["run_dir"] / "result.json"
        record = json.loads(own.read_text())
        edit(record)
        own.write_text(json.dumps(record))


def _edit_manifest(folder: Path, edit, index: int = 0) -> None:
    run = json.loads((folder / "results.json").read_text())["runs"][index]
    path = folder / run["facts"]["run_dir"] / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def _witness_checks(folder: Path) -> list:
    recorded = load_directory(folder)
    checks = [check_witnesses(e.result.config.config_id, e, catalogue_of(e.result.config.workload))
              for e in recorded.evidence]
    return [recorded.listing, *checks]


def _failures(folder: Path) -> str:
    return " | ".join(c.detail for c in _witness_checks(folder) if c.verdict == "FAIL")


def test_every_declared_witness_is_one_the_audit_knows_and_the_untouched_folder_passes(recorded_matrix):
    declared = [w for f in FIGURES for w in f.witnesses] + [w for f in FACTS for w in f.witnesses]
    assert declared and {w.kind for w in declared} <= KINDS
    checks = _witness_checks(recorded_matrix)
    assert [c.verdict for c in checks] == ["PASS"] * len(checks), [c.detail for c in checks]
    assert all("the run folder's copy included" in c.detail for c in checks[1:])


def test_a_witness_of_an_unknown_kind_is_an_error_not_a_silent_pass(recorded_matrix):
    from suite.audit.witnesses import hear

    evidence = load_directory(recorded_matrix).evidence[0]
    with pytest.raises(ValueError, match="unknown kind"):
        hear(Witness("hearsay"), "x", 1.0, evidence)


def _scale_batch(run):
    run["config"]["batch_size"] *= 2  # the headlines recomputed from the steps at batch 16: twice the throughput
    for name in ("throughput_samples_per_s", "throughput_ci95_low", "throughput_ci95_high"):
        run["metrics"][name] *= 2


def _erase_contention(run):
    run["metrics"]["contention_others_cpu_share"] = 0.001
    run["facts"]["contention"]["others_share"] = 0.001
    run["facts"]["contention"]["contended"] = False


def _longer_wait(run):
    run["facts"]["data_wait_s"][0] = run["facts"]["step_times_s"][0] * 1.5


def _peak_below_samples(run):
    run["metrics"]["host_ram_peak_rss_bytes"] = min(run["facts"]["host_memory_samples"]["bytes"]) - 4096


@pytest.mark.parametrize("forgery, edit, manifest_edit, named", [
    ("batch size doubled in results.json and the manifest", _scale_batch,
     lambda m: (m["config"].update(batch_size=16), m["batch_size"].update(configured=16, used=16)),
     "batch_size_used is 8 but the configuration's batch_size says 16"),
    ("precision changed in results.json and the manifest", lambda r: r["config"].update(precision="bf16"),
     lambda m: (m["config"].update(precision="bf16"), m["precision"].update(requested="bf16", ran="bf16")),
     "precision_used is 'fp32' but the configuration's precision says 'bf16'"),
    ("eval_accuracy edited", lambda r: r["metrics"].update(eval_accuracy=0.9), None,
     "eval_accuracy is 0.9 but the last evaluation (facts.evaluations) says"),
    ("contention erased", _erase_contention, None,
     "contention_others_cpu_share is 0.001 but contention.others_cpu_s / contention.window_s / contention.cores"),
    ("a data wait longer than its step", _longer_wait, None, "data_wait_s[0] is"),
    ("a memory peak below its samples", _peak_below_samples, None,
     "host_ram_peak_rss_bytes is"),
    ("the loader changed everywhere but the manifest's loader.ran",
     lambda r: (r["config"].update(loader="cpu-fast"), r["facts"].update(loader_used="cpu-fast")),
     lambda m: (m["config"].update(loader="cpu-fast"), m["loader"].update(requested="cpu-fast")),
     "loader_used is 'cpu-fast' but the manifest's loader.ran says 'cpu'"),
])
def test_each_forgery_is_a_failure_naming_its_witness(recorded_matrix, tmp_path, forgery, edit, manifest_edit, named):
    folder = _copy(recorded_matrix, tmp_path)
    _edit_runs(folder, edit)
    if manifest_edit is not None:
        _edit_manifest(folder, manifest_edit)
    failures = _failures(folder)
    assert named in failures, (forgery, failures)


def test_an_edit_of_results_json_alone_is_told_by_the_run_folders_copy(recorded_matrix, tmp_path):
    folder = _copy(recorded_matrix, tmp_path)
    _edit_runs(folder, lambda r: r["metrics"].update(step_time_p50_s=r["metrics"]["step_time_p50_s"]), copy_too=False)
    assert _failures(folder) == ""  # the same value written back is no edit
    _edit_runs(folder, lambda r: r["facts"].update(warmup_steps_excluded=0), copy_too=False)
    assert "results.json and the run folder's result.json differ on facts.warmup_steps_excluded" in _failures(folder)


def test_mlperf_logs_eval_accuracy_edited_is_a_failure(recorded_matrix, tmp_path):
    folder = _copy(recorded_matrix, tmp_path)
    run = json.loads((folder / "results.json").read_text())["runs"][0]
    log = folder / run["facts"]["run_dir"] / "mlperf.log"
    lines = log.read_text().splitlines()
    edited = [line.replace('"value": ', '"value": 0.75, "was": ', 1) if '"key": "eval_accuracy"' in line else line
              for line in lines]
    assert edited != lines
    log.write_text("\n".join(edited) + "\n")
    assert "but mlperf.log's eval_accuracy says 0.75" in _failures(folder)


def test_a_run_listed_twice_or_left_out_of_the_listing_fails(recorded_matrix, tmp_path):
    twice = _copy(recorded_matrix, tmp_path / "twice")
    data = json.loads((twice / "results.json").read_text())
    data["runs"].append(data["runs"][0])
    (twice / "results.json").write_text(json.dumps(data))
    assert f"run {data['runs'][0]['run_uid']} is listed 2 times" in _failures(twice)
    left_out = _copy(recorded_matrix, tmp_path / "left-out")
    data = json.loads((left_out / "results.json").read_text())
    gone = data["runs"].pop(1)
    (left_out / "results.json").write_text(json.dumps(data))
    assert f"holds run {gone['run_uid']} (FINISHED), which results.json does not list" in _failures(left_out)


def test_suite_audit_exits_1_on_a_forgery_the_folder_holds_the_evidence_against(recorded_matrix, tmp_path, capsys):
    folder = _copy(recorded_matrix, tmp_path)
    _edit_runs(folder, _erase_contention)
    code = main(["audit", str(folder), "--no-rerun", "--no-progress", "--output", str(tmp_path / "audit"),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    report = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert code == 1 and report["verdict"] == "FAIL"
    assert [c["verdict"] for c in report["checks"] if c["name"] == "witnesses"] == ["FAIL", "PASS"]


def test_a_hand_edited_loss_is_a_forgery_the_audit_fails_and_other_readers_refuse(recorded_matrix, tmp_path, capsys,
                                                                                  monkeypatch):
    """Issue 49: a losses_hex edited by hand was an error with exit 2 from the audit; it contradicts the record's
    own loss_digest: FAIL, exit 1. The other readers refuse the folder in one line as before (exit 2)."""
    folder = _copy(recorded_matrix, tmp_path)
    _edit_runs(folder, lambda r: r["losses_hex"].__setitem__(0, float.hex(float.fromhex(r["losses_hex"][0]) + 1.0)),
               copy_too=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # as on a terminal, with the re-run's progress bars
    code = main(["audit", str(folder), "--output", str(tmp_path / "audit"),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    monkeypatch.undo()
    report = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert code == 1 and report["verdict"] == "FAIL"
    [check] = report["checks"]
    assert check["name"] == "record" and "loss_digest does not match the recorded losses" in check["detail"]
    capsys.readouterr()
    assert main(["compare", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "loss_digest does not match" in err
