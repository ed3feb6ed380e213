"""``suite recover`` and ``suite upload``: finish what a crash left, and record a results folder into MLflow.

Repair of the folder (under its lock; refused while a runner still holds it):

* runs kept in a rescue file (written when the disk was full) are merged into results.json;
* a run whose ``runs/<name>/result.json`` exists but is missing from results.json (the runner died while its
  configuration process ran on, or a write failed) is recorded from that file;
* a run that started (``run.json``) but left no result, and whose process is gone, is recorded as KILLED;
  one whose process still runs is left for a later call;
* a matrix left RUNNING by a runner that is gone becomes KILLED, with its end time.

Recording (into the matrix's own store, or another with ``suite upload --tracking-uri``): runs already complete
in MLflow (found by their uids) are left alone, runs left RUNNING are completed with their result or marked
KILLED, the rest are created; the matrix run gets its final status and end time. The folder's
``mlflow_run_id`` values are updated only for its own store: uploading elsewhere never rewrites them.
Both steps are idempotent.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

from suite.analysis.scoring import ConfigScore
from suite.errors import ResultsFolderError, SuiteError
from suite.redact import REDACTED, redact_uri
from suite.results.files import RunFiles, read_rescue, rescued_manifests
from suite.results.record import KILLED, RUNNING, RunResult
from suite.results.store import ResultsStore
from suite.tracking.mlflow_gateway import MlflowGateway
from suite.tracking.mlflow_recorder import MlflowRecorder
from suite.tracking.stores import check_reachable, default_tracking_uri, normalize_uri

PROCESS_MODULE = "suite.run.process"


@dataclass
class RecoveryReport:
    repairs: list[str] = field(default_factory=list)
    still_running: list[str] = field(default_factory=list)
    recorded: int = 0
    already_there: int = 0
    killed_in_mlflow: int = 0
    parent_run_id: str | None = None
    tracking_uri: str | None = None
    ids_written: bool = False


def _process_alive(pid: object, files: RunFiles) -> bool:
    """Whether the configuration process of ``files`` (pid from run.json) is still running."""
    import psutil

    if not isinstance(pid, int):
        return False
    try:
        command = " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return PROCESS_MODULE in command and str(files.folder) in command


def _incomplete_manifest(folder: Path) -> bool:
    """Whether a run folder lacks its complete manifest (none, an unreadable one, or the one written before the
    run)."""
    return not RunFiles(folder.parent.parent, folder.name).manifest_complete()


def repair(store: ResultsStore, rescue: Path | None = None) -> tuple[list[str], list[str]]:
    """Repair a locked results folder (see the module docstring); (what was repaired, runs still running)."""
    matrix = store.matrix_info
    notes: list[str] = []
    known: set[str | None] = {r.run_uid for r in store.held_results() if r.run_uid}
    if rescue is not None:
        rescued_matrix, runs, scores = read_rescue(rescue)
        if rescued_matrix.uid != matrix.uid:
            raise ResultsFolderError(f"rescue file {rescue} belongs to matrix {rescued_matrix.uid}, not to "
                                     f"{store.root} (matrix {matrix.uid})")
        manifests = rescued_manifests(rescue)
        for run in runs:
            if run.run_uid not in known:
                store.record(run)
                known.add(run.run_uid)
                folder = store.run_folder(run)
                if folder is not None and folder.is_dir() and not (folder / "result.json").exists():
                    RunFiles(store.root, folder.name).write(folder / "result.json", run.to_dict())
                notes.append(f"recorded {run.run_uid} ({run.status}) from the rescue file")
            folder = store.run_folder(run)
            manifest = manifests.get(run.run_uid or "")
            if manifest is not None and folder is not None and folder.is_dir() and _incomplete_manifest(folder):
                RunFiles(store.root, folder.name).write(folder / "manifest.json", manifest)
                notes.append(f"wrote {folder.name}'s complete manifest from the rescue file")
        if scores and not store.scores():
            store.record_scores(scores)
        if matrix.status == RUNNING and rescued_matrix.status != RUNNING:
            store.finish(rescued_matrix.status, rescued_matrix.reason, rescued_matrix.ended_at)
    still_running: list[str] = []
    for files, result, info in store.runs_on_disk():
        run_uid = (result.run_uid if result else None) or (info or {}).get("run_uid")
        if not run_uid or run_uid in known:
            continue
        if result is not None:
            result.facts.update(files.facts())
            result.facts["recovered"] = f"recorded by suite recover from {files.relative_folder}/result.json"
            store.record(result)
            notes.append(f"recorded {files.name} ({result.status}) from its result.json")
        elif info is not None:
            if _process_alive(info.get("pid"), files):
                still_running.append(files.name)
                continue
            try:
                config = files.read_config()
            except (OSError, ValueError, SuiteError) as exc:  # no config.json, or not one: nothing to record it as
                notes.append(f"left {files.name} out: started, no result, and no readable configuration "
                             f"({' '.join(str(exc).split())[:200]})")
                known.add(run_uid)
                continue
            ended = files.log.stat().st_mtime if files.log.exists() else time.time()
            killed = RunResult(config=config, status=KILLED, reason="its runner stopped while it ran and no result "
                               "was written", run_uid=run_uid, repeat=int(info.get("repeat", 0)), ended_at=ended)
            killed.facts.update(files.facts())
            store.record(killed)
            notes.append(f"recorded {files.name} as KILLED: started, no result, process gone")
        known.add(run_uid)
    if store.matrix_info.status == RUNNING:
        ends = [r.ended_at for r in store.held_results() if r.ended_at]
        store.finish(KILLED, "the runner stopped without closing the matrix (killed?); repaired by suite recover",
                     max(ends) if ends else time.time())
        notes.append("matrix was left RUNNING by a runner that is gone: now KILLED")
    return notes, still_running


def upload(directory: Path, tracking_uri: str | None = None, rescue: Path | None = None) -> RecoveryReport:
    """Repair ``directory`` and record it into ``tracking_uri`` (default: the matrix's own store; for a matrix run
    where MLflow was not installed, ``$MLFLOW_TRACKING_URI`` or ``./mlflow.db``)."""
    store = ResultsStore.reopen(directory)
    try:
        report = RecoveryReport()
        report.repairs, report.still_running = repair(store, rescue)
        matrix = store.matrix_info
        recorded = matrix.tracking_uri
        if tracking_uri is None and recorded is not None and REDACTED in recorded:
            raise SuiteError(f"the matrix recorded into {recorded}, whose credentials are never recorded: pass "
                             "--tracking-uri with them (or the store to upload into)")
        uri = tracking_uri or recorded or default_tracking_uri()
        check_reachable(uri)
        # the matrix's own store: the one it records, credentials aside; a folder recorded where MLflow was not
        # installed has none yet, and the first store it is uploaded into becomes its own
        own_store = recorded is None or redact_uri(normalize_uri(uri)) == redact_uri(normalize_uri(recorded))
        recorder = MlflowRecorder(MlflowGateway(uri), resume=True)
        recorder.open(matrix, store.root)
        # another store: copies, so that its run ids never land in this folder's records
        results = store.held_results() if own_store else copy.deepcopy(store.held_results())
        recorder.plan([r.config for r in results])  # run names as `suite run` gives them
        for result in results:
            recorder.end(result)
        for score in store.scores():
            recorder.score(ConfigScore.from_dict(score))
        spare = {files.name for files, _, _ in store.runs_on_disk() if files.name in report.still_running}
        report.killed_in_mlflow = recorder.kill_leftovers() if not spare else 0
        recorder.close(matrix.status, matrix.reason)
        if own_store:
            for result in results:
                store.record(result)  # now with every MLflow run id
            if recorded is None:
                store.adopt_store(redact_uri(normalize_uri(uri)))
        report.recorded = len(results) - len(recorder.skipped)
        report.already_there = len(recorder.skipped)
        report.parent_run_id, report.ids_written = recorder.parent_run_id, own_store
        report.tracking_uri = redact_uri(uri)
        return report
    finally:
        store.release()
