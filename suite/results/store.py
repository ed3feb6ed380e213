"""The results folder: this module alone reads and writes it.

Layout (schema version 2)::

    matrix.json     what the matrix is and how it ended (MatrixInfo); status RUNNING while it runs
    results.json    {"schema_version": 2, "matrix_uid": ..., "runs": [RunResult, ...]}, rewritten atomically
    scores.json     {"schema_version": 2, "matrix_uid": ..., "scores": [ConfigScore, ...]}
    runs/<name>/    one configuration run: config.json, run.json, result.json, run.log, mlperf.log,
                    manifest.json
    .suite.lock     held (flock) by the one process writing the folder; the kernel releases it when that
                    process dies, so "RUNNING and nobody holds the lock" means the runner crashed

Every path recorded inside the folder is relative to it, so a copied folder is self-contained. Reads validate
what they read and raise :class:`~suite.errors.ResultsFolderError` naming the file and what is wrong.
Writes that fail (a full disk) raise :class:`~suite.errors.RecordingError`; the caller keeps the record in
memory and :meth:`ResultsStore.rescue` puts it where it can be recovered from.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from suite.errors import RecordingError, ResultsFolderError
from suite.fileio import loads_bounded, read_record_text, write_json_atomic
from suite.results.files import (
    LOCK_FILE,
    MATRIX_FILE,
    RESCUE_PREFIX,
    RESULTS_FILE,
    RUNS_DIR,
    SCHEMA_VERSION,
    SCORES_FILE,
    MatrixInfo,
    RunFiles,
    read_json,
    read_results_file,
    read_scores_file,
    validate_result,
)
from suite.results.manifest import build_manifest, load_manifest
from suite.results.record import RunResult


class ResultsStore:
    """One results folder. :meth:`create` (a new matrix) and :meth:`reopen` (recovery) hold the folder's lock
    until :meth:`release`; reading needs no lock."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._lock: Any = None
        self._matrix: MatrixInfo | None = None
        self._runs: list[RunResult] = []
        self._scores: list[dict[str, Any]] = []

    # --- ownership -------------------------------------------------------------------------------
    def _acquire(self) -> None:
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.root / LOCK_FILE), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            holder = ""
            try:
                matrix = MatrixInfo.from_dict(loads_bounded(read_record_text(self.root / MATRIX_FILE), MATRIX_FILE))
                holder = f" (pid {matrix.pid} on {matrix.host}, matrix {matrix.name})"
            except (OSError, ValueError, TypeError):
                pass
            raise ResultsFolderError(f"results folder {self.root} is in use by another suite process{holder}; "
                                     "wait for it or choose another --output") from None
        except OSError as exc:
            raise ResultsFolderError(f"cannot lock results folder {self.root}: {exc.strerror or exc}") from exc
        self._lock = lock

    def in_use(self) -> bool:
        """Whether another process holds this folder's lock (always False for the holder itself)."""
        if self._lock is not None or not (self.root / LOCK_FILE).exists():
            return False
        from filelock import FileLock, Timeout

        probe = FileLock(str(self.root / LOCK_FILE), timeout=0)
        try:
            probe.acquire()
        except Timeout:
            return True
        except OSError:
            return False
        probe.release()
        return False

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "ResultsStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @classmethod
    def create(cls, root: str | os.PathLike[str], matrix: MatrixInfo) -> "ResultsStore":
        """A new results folder for ``matrix``, locked by this process. Refuses a folder in use or one that
        already holds results (nothing is overwritten), and a path that cannot be a folder."""
        store = cls(root)
        try:
            store.root.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise ResultsFolderError(f"--output {store.root} is a file, not a folder") from None
        except NotADirectoryError:
            raise ResultsFolderError(f"--output {store.root} lies under a file, not a folder") from None
        except OSError as exc:
            raise ResultsFolderError(f"cannot create output folder {store.root}: {exc.strerror or exc}") from None
        store._acquire()
        try:
            if (store.root / MATRIX_FILE).exists() or (store.root / RESULTS_FILE).exists():
                raise ResultsFolderError(f"{store.root} already holds the results of another matrix; "
                                         "choose another --output (nothing is overwritten)")
            store._matrix = matrix
            store._write(MATRIX_FILE, matrix.to_dict())
            store._write_results()
        except BaseException:
            store.release()
            raise
        return store

    @classmethod
    def reopen(cls, root: str | os.PathLike[str]) -> "ResultsStore":
        """An existing results folder, locked for repair (``suite recover``); its records read and validated."""
        store = cls(root)
        if not (store.root / MATRIX_FILE).is_file():
            raise ResultsFolderError(f"{store.root} is not a results folder: {MATRIX_FILE} is missing")
        store._acquire()
        try:
            store._matrix = store.matrix()
            store._runs = store.results() if (store.root / RESULTS_FILE).exists() else []
            store._scores = store.scores()
        except BaseException:
            store.release()
            raise
        return store

    # --- writing ----------------------------------------------------------------------------------
    def _require_lock(self) -> None:
        if self._lock is None:
            raise RuntimeError(f"results folder {self.root} is not open for writing")

    def _write(self, name: str, data: Any) -> None:
        try:
            write_json_atomic(self.root / name, data)
        except OSError as exc:
            raise RecordingError(f"cannot write {self.root / name}: {exc.strerror or exc}") from exc

    def _write_results(self) -> None:
        assert self._matrix is not None
        self._write(RESULTS_FILE, {"schema_version": SCHEMA_VERSION, "matrix_uid": self._matrix.uid,
                                   "runs": [r.to_dict() for r in self._runs]})

    @property
    def matrix_info(self) -> MatrixInfo:
        if self._matrix is None:
            self._matrix = self.matrix()
        return self._matrix

    def run_files(self, name: str) -> RunFiles:
        """The folder of run ``name``, created empty (a re-used name is an error: nothing is overwritten)."""
        self._require_lock()
        files = RunFiles(self.root, name)
        try:
            files.folder.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise ResultsFolderError(f"{files.folder} exists already: two runs would share it") from None
        except OSError as exc:
            raise RecordingError(f"cannot create {files.folder}: {exc.strerror or exc}") from exc
        return files

    def record(self, result: RunResult) -> None:
        """Add ``result`` to results.json, or update the run with its uid (e.g. once its MLflow id is known).
        On failure it stays in this store's memory (:meth:`rescue`) and :class:`RecordingError` is raised."""
        self._require_lock()
        for index, known in enumerate(self._runs):
            if result.run_uid is not None and known.run_uid == result.run_uid:
                self._runs[index] = result
                break
        else:
            self._runs.append(result)
        self._write_results()

    def record_scores(self, scores: list[dict[str, Any]]) -> None:
        self._require_lock()
        self._scores = list(scores)
        assert self._matrix is not None
        self._write(SCORES_FILE, {"schema_version": SCHEMA_VERSION, "matrix_uid": self._matrix.uid,
                                  "scores": self._scores})

    def finish(self, status: str, reason: str | None = None, ended_at: float | None = None) -> None:
        """matrix.json says how the matrix ended."""
        self._require_lock()
        matrix = self.matrix_info
        matrix.status, matrix.reason = status, reason
        matrix.ended_at = ended_at if ended_at is not None else time.time()
        self._write(MATRIX_FILE, matrix.to_dict())

    def adopt_store(self, tracking_uri: str) -> None:
        """matrix.json names the MLflow store its runs are now recorded into (a matrix run where MLflow was not
        installed has none until it is uploaded); ``tracking_uri`` as it may be recorded (redacted)."""
        self._require_lock()
        matrix = self.matrix_info
        matrix.tracking_uri = tracking_uri
        self._write(MATRIX_FILE, matrix.to_dict())

    def held_results(self) -> list[RunResult]:
        """The runs this writer holds (what results.json says, or would say if a write failed)."""
        return list(self._runs)

    def write_json(self, name: str, data: Any) -> Path:
        """An extra file of the folder (tune.json, audit.json...)."""
        self._require_lock()
        self._write(name, data)
        return self.root / name

    def path(self, name: str) -> Path:
        """Where an extra file or folder of this results folder goes (plots, reports)."""
        return self.root / name

    def rescue(self) -> Path | None:
        """Write what this store holds in memory (matrix, runs, scores) to a rescue file outside the results
        folder (the temporary folder, else the user's cache), for ``suite recover --from``; ``None`` if no
        place could take it."""

        matrix = self.matrix_info
        payload = {"schema_version": SCHEMA_VERSION, "matrix": matrix.to_dict(), "results_folder": str(self.root),
                   "runs": [r.to_dict() for r in self._runs], "scores": self._scores,
                   # each run's complete manifest, built from the result held here: what an audit re-runs from
                   "manifests": {r.run_uid: build_manifest(r, matrix.command) for r in self._runs if r.run_uid}}
        for folder in (Path(tempfile.gettempdir()), Path.home() / ".cache" / "suite" / "rescue"):
            target = folder / f"{RESCUE_PREFIX}{matrix.uid}.json"
            try:
                write_json_atomic(target, payload)
            except OSError:
                continue
            return target
        return None

    # --- reading ----------------------------------------------------------------------------------
    def matrix(self) -> MatrixInfo:
        path = self.root / MATRIX_FILE
        if not self.root.is_dir():
            raise ResultsFolderError(f"no such results folder: {self.root}")
        if not path.is_file():
            raise ResultsFolderError(f"{self.root} is not a results folder: {MATRIX_FILE} is missing")
        try:
            return MatrixInfo.from_dict(read_json(path))
        except (ValueError, TypeError) as exc:
            raise ResultsFolderError(f"{path}: {exc}") from None

    def results(self) -> list[RunResult]:
        """Every run of results.json, validated."""
        matrix_uid = self.matrix().uid if (self.root / MATRIX_FILE).is_file() else None
        return read_results_file(self.root / RESULTS_FILE, matrix_uid)

    def scores(self) -> list[dict[str, Any]]:
        path = self.root / SCORES_FILE
        return read_scores_file(path) if path.is_file() else []

    def run_folder(self, result: RunResult) -> Path | None:
        """The run's folder inside this results folder (wherever the folder has been copied to)."""
        run_dir = result.facts.get("run_dir")
        if not isinstance(run_dir, str) or not run_dir:
            return None
        return self.root / RUNS_DIR / Path(run_dir).name

    def manifest_of(self, result: RunResult) -> dict[str, Any] | None:
        """The run's manifest, read from this folder (``None`` if the run has none)."""

        folder = self.run_folder(result)
        if folder is None or not (folder / "manifest.json").is_file():
            return None
        return load_manifest(folder / "manifest.json")

    def mlperf_log_of(self, result: RunResult) -> Path | None:
        """The run's MLPerf log in this folder (``None`` if the run has no folder; the path may not exist)."""
        folder = self.run_folder(result)
        return None if folder is None else RunFiles(self.root, folder.name).mllog

    def folder_record_of(self, result: RunResult) -> RunResult | None:
        """The run folder's own copy of the run's record (``runs/<name>/result.json``): ``None`` where the run has no
        folder or the folder no copy; an unreadable copy raises as :meth:`runs_on_disk` does."""
        folder = self.run_folder(result)
        return None if folder is None else _folder_record(RunFiles(self.root, folder.name))

    def runs_on_disk(self) -> Iterator[tuple[RunFiles, RunResult | None, dict[str, Any] | None]]:
        """Every ``runs/<name>/`` folder with its result.json (validated; ``None`` if absent) and run.json."""
        runs = self.root / RUNS_DIR
        if not runs.is_dir():
            return
        for folder in sorted(p for p in runs.iterdir() if p.is_dir()):
            files = RunFiles(self.root, folder.name)
            info = read_json(files.run_info) if files.run_info.is_file() else None
            yield files, _folder_record(files), info if isinstance(info, dict) else None


def _folder_record(files: RunFiles) -> RunResult | None:
    """A run folder's result.json, validated; ``None`` where the folder has none."""
    return validate_result(read_json(files.result), str(files.result)) if files.result.is_file() else None
