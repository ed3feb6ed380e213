"""The record layer without training: one configuration identity, the results store, compare rows, the MLflow
gateway's paging and tags, hostile results files, the audit's observations, and a store write failing mid-matrix.

Issue 18's defects, by number: 1 and 2 (compare merges configurations, scores of suffixed ids), 3 (published
ratios; in test_audit_compare.py), 4 (paging), 5 (the audit checks observations), 7 (a write failing, in-process),
11 (hostile files), 12 (relative paths; the copied-folder audit is in test_end_to_end.py).
"""

import dataclasses
import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest

from suite.cli import main
from suite.config import RunConfig
from suite.config import param_text
from suite.errors import ResultsFolderError
from suite.results.record import FAILED, FINISHED, KILLED, RunResult
from suite.results.files import MatrixInfo
from suite.results.store import ResultsStore
from suite.tracking.base import Recorder

pytestmark = pytest.mark.mechanics

BASE = RunConfig(workload="bridgetower", preset="tiny", device="cpu", num_workers=0, loader="cpu", precision="fp32",
                 batch_size=8)


def _matrix(**fields):
    return MatrixInfo(name="m", workload="bridgetower", command=["suite", "run"], **fields)


def _result(config, throughput=10.0, status=FINISHED, uid=None, repeat=0):
    return RunResult(config=config, status=status, repeat=repeat, run_uid=uid or f"u{time.time_ns()}",
                     metrics={"throughput_samples_per_s": throughput} if status == FINISHED else {},
                     reason=None if status == FINISHED else "boom", losses=[1.0, 0.5])


# --- identity --------------------------------------------------------------------------------------------------
def test_config_id_covers_every_field_and_is_stable():
    variants = {"device": "cuda", "num_workers": 2, "loader": "cpu-fast", "precision": "bf16", "engine": "hf-trainer",
                "prefetch_factor": 4, "nproc_per_node": 2, "batch_size": 16, "seed": 7, "dataset": "/data/x y",
                "weights": "/ckpt", "preset": "large", "steps": 99, "warmup_steps": 0, "skip_bad_samples": True}
    ids = {BASE.config_id} | {dataclasses.replace(BASE, **{k: v}).config_id for k, v in variants.items()}
    assert len(ids) == len(variants) + 1  # every field changes the id
    assert BASE.config_id == dataclasses.replace(BASE).config_id
    # stable across releases: adding a field with a default must not change existing ids
    assert BASE.config_id == "bridgetower-tiny-cpu-nw0-cpu-fp32-suite-b8-s42-13fe6875"
    weird = dataclasses.replace(BASE, device="my dev/1").config_id
    assert "/" not in weird and " " not in weird


def test_a_run_record_holds_a_typed_configuration_and_json_only_at_its_edges(tmp_path):
    """Issue 28, point 1: ``RunResult.config`` is a :class:`RunConfig` (no dict lookups by key in the code), turned
    into JSON by ``to_dict`` and back by ``from_dict`` only, where the record is written and read."""
    import typing

    assert typing.get_type_hints(RunResult)["config"] is RunConfig
    result = _result(BASE)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["config"] == BASE.to_dict()
    again = RunResult.from_dict(data)
    assert isinstance(again.config, RunConfig) and again.config == BASE and again.to_dict() == result.to_dict()
    with pytest.raises(ValueError, match="num_workers"):
        RunResult.from_dict({**data, "config": {**data["config"], "num_workers": "two"}})


def test_params_are_plain_text_and_read_back_into_the_same_configuration():
    assert param_text(("cpu",)) == "cpu" and param_text((0, 1, 2)) == "0,1,2"
    assert param_text(None) == "default" and param_text(True) == "true"
    config = dataclasses.replace(BASE, prefetch_factor=4, dataset="/d", skip_bad_samples=True)
    assert RunConfig.from_params(config.as_params()) == config


# --- compare rows (defects 1, 2) -----------------------------------------------------------------------------
def _store_with(tmp_path, results, name="out"):
    store = ResultsStore.create(tmp_path / name, _matrix())
    for result in results:
        store.record(result)
    store.finish(FINISHED)
    store.release()
    return tmp_path / name


def test_compare_json_gives_one_row_per_configuration_of_an_engine_by_prefetch_matrix(tmp_path, capsys):
    configs = [dataclasses.replace(BASE, num_workers=1, engine=e, prefetch_factor=p)
               for e in ("suite", "hf-trainer") for p in (2, 4)]
    folder = _store_with(tmp_path, [_result(c, 10.0 + i) for i, c in enumerate(configs)])
    assert main(["compare", str(folder), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["config_id"] for r in rows) == sorted(c.config_id for c in configs)
    assert {(r["config"]["engine"], r["config"]["prefetch_factor"]) for r in rows} == {
        ("suite", 2), ("suite", 4), ("hf-trainer", 2), ("hf-trainer", 4)}


def test_two_result_sets_are_compared_with_labels_that_tell_them_apart(tmp_path, capsys):
    """Issue 29, point 1: `suite compare A B` over two folders of the same configurations (one run with more steps)
    gives every row with its set's name and what differs between the sets, and plots no line through points of
    different sets."""
    from suite.analysis.plots import lines_of

    workers = (0, 2)
    a = _store_with(tmp_path, [_result(dataclasses.replace(BASE, num_workers=n), 10.0 + n) for n in workers], "A")
    b = _store_with(tmp_path, [_result(dataclasses.replace(BASE, num_workers=n, steps=60), 20.0 + n)
                               for n in workers], "B")
    assert main(["compare", str(a), str(b), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 4 and len({r["label"] for r in rows}) == 4
    assert sorted(r["set"].split(",")[0].rstrip(")") for r in rows) == ["A (steps 30"] * 2 + ["B (steps 60"] * 2
    assert main(["compare", str(a), str(b), "--output", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "A (steps 30" in out and "B (steps 60" in out
    assert (tmp_path / "plots" / "throughput.png").is_file()
    from suite.analysis.compare import ResultSet, label_sets, rows_from_results
    from suite.results.store import ResultsStore as Store

    # the same configurations in two sets (a re-run): only the set tells their points apart
    again = _store_with(tmp_path, [_result(dataclasses.replace(BASE, num_workers=n), 30.0 + n) for n in workers], "C")
    sets = [ResultSet(f.name, {}, rows_from_results(Store(f).results())) for f in (a, again)]
    lines = lines_of(label_sets(sets))
    assert len(lines) == 2 and all(len({r.set_label for r in members}) == 1
                                    and [r.config.num_workers for r in members] == [0, 2]
                                    for members in lines.values())
    [joined] = lines_of([r for s in sets for r in s.rows]).values()  # unlabelled: one line through both sets
    assert [r.config.num_workers for r in joined] == [0, 0, 2, 2]


def test_a_result_set_named_like_matplotlib_math_is_plotted_as_its_name(tmp_path, capsys):
    """A folder's name reaches the plot's legend as text: `$` would start mathtext, and an unclosed `{` stopped the
    figure with a parse error (a traceback instead of plots)."""
    sets = [_store_with(tmp_path, [_result(dataclasses.replace(BASE, num_workers=n), 10.0 + n) for n in (0, 2)], name)
            for name in ("plain", "run$x^{2$")]
    assert main(["compare", *map(str, sets), "--output", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "throughput.png").is_file() and (tmp_path / "plots" / "memory.png").is_file()


def test_compare_of_a_name_that_is_neither_a_folder_nor_a_run_id_says_so(tmp_path, capsys):
    assert main(["compare", "nosuchdir"]) == 2
    assert "no such results folder: nosuchdir (nor an MLflow run id" in capsys.readouterr().err


def test_export_writes_one_row_per_run_of_folders_and_experiments_that_pandas_reads_back(tmp_path, capsys):
    """Issue 29, point 8: `suite export` over two folders and an MLflow experiment: CSV and Parquet, one row per
    configuration run (repeats each their own), configuration axes, metrics and facts as columns."""
    import pandas as pd

    a = _store_with(tmp_path, [_result(dataclasses.replace(BASE, num_workers=n), 10.0 + n) for n in (0, 2)], "A")
    runs_b = [_result(dataclasses.replace(BASE, num_workers=1), 5.0, repeat=i) for i in range(3)]
    for run in runs_b:
        run.facts["contention"] = {"contended": False, "others_share": 0.01}
    b = _store_with(tmp_path, [*runs_b, _result(BASE, status=FAILED)], "B")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["upload", str(a), "--tracking-uri", uri]) == 0
    assert main(["export", str(a), str(b), "--experiment", "bridgetower", "--tracking-uri", uri,
                 "--output", str(tmp_path / "x")]) == 0
    assert "8 run(s)" in capsys.readouterr().out
    for table in (pd.read_csv(tmp_path / "x" / "runs.csv"), pd.read_parquet(tmp_path / "x" / "runs.parquet")):
        assert len(table) == 8 and list(table.columns[:5]) == ["source", "run_uid", "mlflow_run_id", "config_id",
                                                                "status"]
        assert sorted(table["config.num_workers"].tolist()) == [0, 0, 0, 1, 1, 1, 2, 2]
        assert (table["status"] == "FINISHED").sum() == 7
        from_b = table[table["source"] == str(b)]
        assert sorted(from_b["repeat"].tolist()) == [0, 0, 1, 2]
        assert from_b["facts.contention.others_share"].dropna().tolist() == [0.01] * 3
        from_mlflow = table[table["source"] == "mlflow:bridgetower"]
        assert sorted(from_mlflow["throughput_samples_per_s"].tolist()) == [10.0, 12.0]
        assert set(from_mlflow["config_id"]) == set(table[table["source"] == str(a)]["config_id"])
    assert main(["export"]) == 2


def test_repeats_of_a_suffixed_configuration_are_scored_not_shown_raw(tmp_path, capsys):
    config = dataclasses.replace(BASE, num_workers=2, prefetch_factor=4)
    runs = [_result(config, v, repeat=i) for i, v in enumerate((10.0, 20.0, 100.0))]
    folder = _store_with(tmp_path, [*runs, _result(config, status=FAILED, repeat=3)])
    assert main(["compare", str(folder), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["config_id"].endswith(config.config_id[-30:]) and "-pf4-" in row["config_id"]
    assert row["metrics"]["throughput_samples_per_s"] == pytest.approx(20.0)  # MLPerf: drop 10 and 100
    assert (row["runs"], row["unfinished_runs"]) == (3, 1)


# --- the results store -----------------------------------------------------------------------------------------
def _hold_lock(folder, ready, release):
    store = ResultsStore.create(folder, _matrix())
    ready.set()
    release.wait(30)
    store.release()


def test_a_folder_in_use_is_refused_and_a_folder_with_results_is_never_overwritten(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(tmp_path / "out", ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(ResultsFolderError, match=r"in use by another suite process \(pid \d+"):
            ResultsStore.create(tmp_path / "out", _matrix())
    finally:
        release.set()
        holder.join(30)
    with pytest.raises(ResultsFolderError, match="already holds the results of another matrix"):
        ResultsStore.create(tmp_path / "out", _matrix())


@pytest.mark.parametrize("make,message", [
    (lambda p: p.write_text("x"), "is a file, not a folder"),
    (lambda p: (p.write_text("x"), None)[1], "lies under a file"),
])
def test_an_output_that_cannot_be_a_folder_is_one_line(tmp_path, make, message):
    make(tmp_path / "f")
    target = tmp_path / "f" if "file, not" in message else tmp_path / "f" / "sub"
    with pytest.raises(ResultsFolderError, match=message):
        ResultsStore.create(target, _matrix())


def test_paths_inside_the_folder_are_relative_and_a_copied_folder_reads_its_own_manifest(tmp_path):
    from suite.results.files import RunFiles

    store = ResultsStore.create(tmp_path / "a", _matrix())
    files = store.run_files("r1")
    files.write(files.manifest, {"manifest_version": 2, "config": BASE.to_dict()})
    result = _result(BASE)
    result.facts.update(files.facts())
    store.record(result)
    store.release()
    assert result.facts["manifest"] == "runs/r1/manifest.json" and result.facts["run_dir"] == "runs/r1"
    import shutil

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    (tmp_path / "a" / "runs" / "r1" / "manifest.json").unlink()  # the original is gone: the copy must not need it
    copied = ResultsStore(tmp_path / "b")
    assert copied.manifest_of(copied.results()[0])["config"] == BASE.to_dict()
    assert RunFiles(tmp_path / "b", "r1").folder == copied.run_folder(copied.results()[0])


# --- hostile results files (defect 11) -------------------------------------------------------------------------
HOSTILE = [
    ("results.json", "{not json", "results.json is not valid JSON (Expecting property name"),
    ("results.json", "{}", "has schema_version None"),
    ("results.json", "[]", "lists no runs"),
    ("results.json", '[{"foo": 1}]', "results.json: run 0: unknown field(s) foo"),
    ("results.json", '[{"config": {"device": "cpu"}, "status": "FINISHED"}]', "run 0: config: missing config field"),
    ("results.json", '[{"config": {}, "status": "DONE"}]', "status 'DONE' is not one of"),
    ("matrix.json", "[1, 2]", "matrix.json: not a JSON object but a list"),
]


@pytest.mark.parametrize("name,text,message", HOSTILE)
@pytest.mark.parametrize("command", ["compare", "audit", "upload"])
def test_hostile_records_are_one_line_errors_and_nothing_is_rewritten(tmp_path, capsys, name, text, message, command):
    folder = _store_with(tmp_path, [_result(BASE)])
    (folder / name).write_text(text)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    argv = {"compare": ["compare", str(folder)], "audit": ["audit", str(folder), "--no-rerun",
                                                            "--output", str(tmp_path / "audit")],
            "upload": ["upload", str(folder), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]}[command]
    if command == "upload" and text == "[]":  # a matrix killed before its first run ended: valid, nothing to do
        assert main(argv) == 0
        return
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


def test_a_manifest_that_is_a_list_is_a_one_line_error(tmp_path, capsys):
    store = ResultsStore.create(tmp_path / "out", _matrix())
    files = store.run_files("r1")
    files.manifest.write_text("[1]")
    result = _result(BASE)
    result.facts.update(files.facts())
    store.record(result)
    store.release()
    assert main(["audit", str(tmp_path / "out"), "--no-rerun", "--output", str(tmp_path / "a")]) == 2
    assert "manifest.json is not a JSON object but a list" in capsys.readouterr().err


# --- MLflow gateway (defect 4 and tag names) -------------------------------------------------------------------
def test_mlflow_searches_read_every_page(tmp_path, monkeypatch):
    from suite.tracking.reading import rows_from_mlflow
    from suite.tracking import mlflow_gateway
    from suite.tracking.mlflow_gateway import MlflowGateway

    gateway = MlflowGateway(f"sqlite:///{tmp_path}/m.db")
    experiment = gateway.experiment_id("bridgetower")
    for workers in range(12):
        config = dataclasses.replace(BASE, num_workers=workers)
        run_id = gateway.create_run(experiment, config.config_id, {"suite.role": "configuration",
                                                                   "suite.run_uid": str(workers)}, config.as_params())
        gateway.log(run_id, metrics=[("throughput_samples_per_s", 1.0 + workers, 0, 0)])
        gateway.terminate(run_id, FINISHED)
    monkeypatch.setattr(mlflow_gateway, "_PAGE", 5)  # 12 runs: three pages
    rows = rows_from_mlflow(gateway, experiment="bridgetower")
    assert sorted(r.config.num_workers for r in rows) == list(range(12))


def test_the_gateway_uses_mlflows_own_tag_names():
    from mlflow.utils import mlflow_tags

    from suite.tracking import mlflow_gateway

    assert mlflow_gateway.PARENT_RUN_ID == mlflow_tags.MLFLOW_PARENT_RUN_ID
    assert mlflow_gateway.RUN_NOTE == mlflow_tags.MLFLOW_RUN_NOTE


def _create_experiment(uri, barrier, results):
    from suite.tracking.mlflow_gateway import MlflowGateway

    barrier.wait(60)
    try:
        results.put(MlflowGateway(uri).experiment_id("bridgetower"))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results.put(f"{type(exc).__name__}: {exc}")


def test_two_processes_creating_a_fresh_sqlite_store_both_succeed(tmp_path):
    """Defect 10: without the initialisation lock one of them died with 'duplicate column name: step'."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    uri = f"sqlite:///{tmp_path}/fresh.db"
    procs = [ctx.Process(target=_create_experiment, args=(uri, barrier, results)) for _ in range(3)]
    for proc in procs:
        proc.start()
    answers = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
    assert len(set(answers)) == 1 and answers[0].isdigit(), answers  # one experiment, no error
    import sqlite3

    assert sqlite3.connect(tmp_path / "fresh.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# --- the audit checks observations (defect 5) ------------------------------------------------------------------
def test_the_audit_compares_the_manifest_config_with_results_json():
    from suite.audit.checks import FAIL, PASS
    from suite.audit.record_checks import check_config

    manifest = {"config": {**BASE.to_dict(), "num_workers": 1, "prefetch_factor": 4}}
    check = check_config("c", BASE.to_dict(), manifest)
    assert check.verdict == FAIL
    assert "num_workers: results.json 0, manifest 1" in check.detail
    assert "prefetch_factor: results.json None, manifest 4" in check.detail
    assert check_config("c", BASE.to_dict(), {"config": BASE.to_dict()}).verdict == PASS


def test_the_loader_facts_come_from_what_ran_not_from_the_config(monkeypatch):
    """A cpu-fast configuration whose pipeline is (wrongly) the reference one is caught by the audit."""
    from suite.audit.checks import FAIL, PASS
    from suite.audit.record_checks import check_loader, record_of
    from suite.run.process import execute
    from workloads.bridgetower.data import loader
    from workloads.bridgetower.data.pipelines import ReferencePipeline

    config = dataclasses.replace(BASE, loader="cpu-fast", steps=1, warmup_steps=0)
    honest = execute(config)
    assert honest.status == FINISHED, honest.reason
    assert (honest.facts["loader_used"], honest.facts["num_workers_used"]) == ("cpu-fast", 0)
    assert check_loader([record_of(honest, None)])[0].verdict == PASS
    monkeypatch.setitem(loader.LOADER_PIPELINES, "cpu-fast", ReferencePipeline)
    swapped = execute(config)
    assert swapped.facts["loader_used"] == "cpu"
    [check] = check_loader([record_of(swapped, None)])
    assert check.verdict == FAIL and "requested 'cpu-fast' but 'cpu' ran" in check.detail


# --- a store write failing in the middle of a matrix (defect 7, in-process) ------------------------------------
class _ListRecorder(Recorder):
    def __init__(self):
        self.ended, self.closed = [], None

    def open(self, info, root):
        pass

    def begin(self, config, repeat, uid):
        pass

    def end(self, result):
        self.ended.append(result.status)
        result.mlflow_run_id = "mlflow-id"

    def score(self, score):
        pass

    def close(self, status, reason=None):
        self.closed = (status, reason)

    def abandon(self):
        pass


def test_a_results_folder_that_stops_taking_writes_keeps_the_run_and_stops_the_matrix(tmp_path, monkeypatch):
    from suite.results import store as store_module
    from suite.run import matrix

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    configs = [dataclasses.replace(BASE, num_workers=n) for n in (0, 1)]
    launched = []

    def fake_launch(config, store, progress, **kwargs):
        launched.append(config.num_workers)
        return _result(config, uid=kwargs["run_uid"])

    monkeypatch.setattr(matrix, "launch", fake_launch)
    store = ResultsStore.create(tmp_path / "out", _matrix())
    real_write = store_module.write_json_atomic

    def full_disk(path, data):
        if Path(path).name == "results.json" and data["runs"]:
            raise OSError(28, "No space left on device")
        return real_write(path, data)

    monkeypatch.setattr(store_module, "write_json_atomic", full_disk)
    recorder = _ListRecorder()
    outcome = matrix.run_matrix(configs, store, [recorder])
    store.release()
    assert launched == [0]  # stopped: no configuration is started once the folder cannot be written
    assert [r.status for r in outcome.results] == [FINISHED] and recorder.ended == [FINISHED]  # MLflow still got it
    assert outcome.status == FAILED and "No space left on device" in outcome.reason
    assert recorder.closed[0] == FAILED and "cannot be written" in recorder.closed[1]
    rescued = json.loads(outcome.rescue_file.read_text())
    assert outcome.rescue_file.parent == tmp_path / "tmp"
    assert [r["status"] for r in rescued["runs"]] == [FINISHED] and rescued["matrix"]["status"] == FAILED
    monkeypatch.setattr(store_module, "write_json_atomic", real_write)  # space freed: recover from the rescue file
    from suite.tracking.upload import repair

    with ResultsStore.reopen(tmp_path / "out") as reopened:
        notes, _ = repair(reopened, outcome.rescue_file)
    assert any("rescue file" in n for n in notes)
    recovered = ResultsStore(tmp_path / "out")
    assert [r.status for r in recovered.results()] == [FINISHED]
    assert recovered.matrix().status == FAILED and "No space left" in recovered.matrix().reason


def test_a_killed_runner_is_told_apart_from_a_running_one(tmp_path):
    """matrix.json RUNNING with nobody holding the lock: the runner is gone; recover says KILLED."""
    from suite.tracking.upload import repair

    store = ResultsStore.create(tmp_path / "out", _matrix())
    assert not store.in_use()  # the holder itself
    store.release()
    code = "from suite.results.store import ResultsStore; import time; s = ResultsStore.reopen({!r}); time.sleep(30)"
    holder = subprocess.Popen([sys.executable, "-c", code.format(str(tmp_path / "out"))])
    try:
        deadline = time.time() + 60
        while not ResultsStore(tmp_path / "out").in_use():
            assert time.time() < deadline and holder.poll() is None
            time.sleep(0.1)
        with pytest.raises(ResultsFolderError, match="in use"):
            ResultsStore.reopen(tmp_path / "out")
    finally:
        holder.kill()
        holder.wait()
    with ResultsStore.reopen(tmp_path / "out") as reopened:
        repair(reopened)
    matrix = ResultsStore(tmp_path / "out").matrix()
    assert matrix.status == KILLED and "runner stopped" in matrix.reason and matrix.ended_at


def test_an_interrupt_after_a_run_sent_its_result_keeps_it_finished(tmp_path, monkeypatch):
    """Ctrl-C between a configuration's last event and its recording: the finished run is recorded FINISHED (not
    KILLED), the matrix says KILLED, and the interrupt goes on."""
    from suite.run import matrix
    from suite.run.launch import Interrupted

    def fake_launch(config, store, progress, **kwargs):
        raise Interrupted(_result(config, uid=kwargs["run_uid"]))

    monkeypatch.setattr(matrix, "launch", fake_launch)
    store = ResultsStore.create(tmp_path / "out", _matrix())
    recorder = _ListRecorder()
    with pytest.raises(KeyboardInterrupt):
        matrix.run_matrix([BASE, dataclasses.replace(BASE, num_workers=1)], store, [recorder])
    store.release()
    folder = ResultsStore(tmp_path / "out")
    assert [r.status for r in folder.results()] == [FINISHED] and recorder.ended == [FINISHED]
    assert folder.matrix().status == KILLED and recorder.closed[0] == KILLED


# --- an error raised while a failure is being recorded (CI: "mllog intervals never ended", no result) ----------
@pytest.mark.parametrize("second_error", [RuntimeError, KeyboardInterrupt], ids=["error", "interrupt"])
def test_a_second_error_while_a_failure_is_logged_keeps_the_first_reason_and_closes_the_mlperf_log(
        tmp_path, monkeypatch, second_error):
    """An error (or a Ctrl-C) raised while a failure's traceback is written must not replace the run's reason nor
    leave the MLPerf log's intervals open: the log's close then raised a ValueError in place of everything and the
    configuration process died without a result (CI, the killed-worker test: its log was not kept, so what raised
    the second time is not known; torch's SIGCHLD handler raises a dead worker's error wherever the main thread is,
    a Ctrl-C can come anywhere)."""
    from suite.run import process
    from workloads.bridgetower.workload import BridgeTowerWorkload

    steps = []
    real_step = BridgeTowerWorkload.train_step

    def broken_step(self, batch):  # the warm-up step runs; the first measured one fails
        steps.append(batch)
        if len(steps) > 1:
            raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed.")
        return real_step(self, batch)

    raised = []

    def log_traceback_interrupted():
        if not raised:
            raised.append(True)
            raise second_error("raised again while the first failure was logged")

    monkeypatch.setattr(BridgeTowerWorkload, "train_step", broken_step)
    monkeypatch.setattr(process, "log_traceback", log_traceback_interrupted)
    log = tmp_path / "mlperf.log"
    config = dataclasses.replace(BASE, steps=2, warmup_steps=1)
    if second_error is KeyboardInterrupt:  # an interrupt propagates; the log is closed on its way out
        with pytest.raises(KeyboardInterrupt):
            process.execute(config, mllog_path=str(log))
    else:
        result = process.execute(config, mllog_path=str(log))
        assert result.status == FAILED
        assert result.reason == "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed."
    assert raised
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()]
    stops = {e["key"]: e["metadata"] for e in events if e["key"] in ("block_stop", "run_stop")}
    assert set(stops) == {"block_stop", "run_stop"}
    for metadata in stops.values():  # why the run aborted: its own failure, an interrupt after it or not
        assert (metadata["status"], metadata["reason"]) == (
            "aborted", "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.")


def test_an_interrupted_run_ends_its_mlperf_log_aborted_as_interrupted(tmp_path, monkeypatch):
    """Ctrl-C in a measured step: the interrupt propagates (the runner records the configuration KILLED) and the
    MLPerf log's open intervals end ``aborted``, reason ``interrupted``."""
    from suite.run import process
    from workloads.bridgetower.workload import BridgeTowerWorkload

    steps = []
    real_step = BridgeTowerWorkload.train_step

    def interrupted_step(self, batch):
        steps.append(batch)
        if len(steps) > 1:
            raise KeyboardInterrupt
        return real_step(self, batch)

    monkeypatch.setattr(BridgeTowerWorkload, "train_step", interrupted_step)
    log = tmp_path / "mlperf.log"
    with pytest.raises(KeyboardInterrupt):
        process.execute(dataclasses.replace(BASE, steps=2, warmup_steps=1), mllog_path=str(log))
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()]
    stops = {e["key"]: e["metadata"] for e in events if e["key"] in ("block_stop", "run_stop")}
    assert {key: (m["status"], m["reason"]) for key, m in stops.items()} == {
        "block_stop": ("aborted", "interrupted"), "run_stop": ("aborted", "interrupted")}
