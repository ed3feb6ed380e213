"""The files of a results folder: their names, the matrix's description (:class:`MatrixInfo`), one run's folder
(:class:`RunFiles`), and how results, scores and rescue files are read and validated. With :mod:`.store` (the folder
as a whole), the only code that reads or writes a results folder."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from suite.config import RunConfig
from suite.errors import ConfigError, LossDigestMismatch, RecordEdited, RecordingError, ResultsFolderError
from suite.fileio import loads_bounded, read_record_text, write_json_atomic
from suite.results.manifest import COMPLETE
from suite.results.record import END_STATUSES, RUNNING, RunResult, timestamp_problem

SCHEMA_VERSION = 2
MATRIX_FILE = "matrix.json"
RESULTS_FILE = "results.json"
SCORES_FILE = "scores.json"
RUNS_DIR = "runs"
LOCK_FILE = ".suite.lock"
AUDIT_FILE = "audit.json"
RESCUE_PREFIX = "suite-rescue-"


def _utc_now() -> float:
    return time.time()


@dataclass
class MatrixInfo:
    """What one matrix invocation is (``matrix.json``): its name, workload, command line, where it records,
    and how it ended."""

    name: str
    workload: str
    command: list[str]
    repeats: int = 1
    memory_limit_bytes: int | None = None
    experiment: str | None = None  # MLflow experiment; None: the workload's name
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)  # finds this matrix again (recover, upload)
    kind: str = "matrix"  # matrix, tune, audit
    matrix_id: str | None = None  # shared by the shards of one matrix run on several hosts (suite run --shard)
    shard: str | None = None  # "I/N": the slice of the matrix this invocation ran
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    tracking_uri: str | None = None  # the matrix's own MLflow store
    timing: dict[str, float] = field(default_factory=dict)  # where the matrix's wall time went (run_matrix)
    #: the runs grouped by the dataset they read, when not all read the same (results.differing_datasets)
    dataset_changes: dict[str, list[str]] = field(default_factory=dict)
    status: str = RUNNING
    reason: str | None = None
    started_at: float = field(default_factory=_utc_now)
    ended_at: float | None = None
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any) -> "MatrixInfo":
        if not isinstance(data, dict):
            raise ValueError(f"not a JSON object but a {type(data).__name__}")
        data = dict(data)
        version = data.pop("schema_version", 1)
        if version not in (1, SCHEMA_VERSION):
            raise ValueError(f"schema_version {version!r}; this suite reads {SCHEMA_VERSION}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}")
        missing = [n for n in ("name", "workload", "command", "uid") if n not in data]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        if data.get("status", RUNNING) not in (RUNNING, *END_STATUSES):
            raise ValueError(f"status {data['status']!r} is not one of {RUNNING}, {', '.join(END_STATUSES)}")
        if not isinstance(data["command"], list) or not isinstance(data["uid"], str):
            raise ValueError("command must be a list and uid a string")
        for name in ("started_at", "ended_at"):
            problem = timestamp_problem(data.get(name))
            if problem:
                raise ValueError(f"{name} {problem}")
        return cls(**data)


@dataclass(frozen=True)
class RunFiles:
    """The files of one configuration run, ``runs/<name>/`` inside a results folder."""

    root: Path
    name: str

    @property
    def folder(self) -> Path:
        return self.root / RUNS_DIR / self.name

    @property
    def relative_folder(self) -> str:
        return f"{RUNS_DIR}/{self.name}"

    config = property(lambda self: self.folder / "config.json")
    run_info = property(lambda self: self.folder / "run.json")
    result = property(lambda self: self.folder / "result.json")
    log = property(lambda self: self.folder / "run.log")
    mllog = property(lambda self: self.folder / "mlperf.log")
    manifest = property(lambda self: self.folder / "manifest.json")

    def write(self, path: Path, data: Any) -> None:
        """One of this run's JSON files (config.json, run.json, result.json, manifest.json), atomically; the
        configuration process writes its own through this too."""
        try:
            write_json_atomic(path, data)
        except OSError as exc:
            raise RecordingError(f"cannot write {path}: {exc.strerror or exc}") from exc

    def read_config(self) -> RunConfig:
        """The run's config.json (the runner writes it), validated; :class:`ResultsFolderError` names what is wrong."""
        try:
            return RunConfig.from_dict(read_json(self.config))
        except (ConfigError, ValueError, TypeError) as exc:
            raise ResultsFolderError(f"{self.config}: {exc}") from None

    def read_run_info(self) -> dict[str, Any]:
        """The run's run.json (the runner's notes for the process: uid, repeat, command), ``{}`` where absent."""
        if not self.run_info.is_file():
            return {}
        info = read_json(self.run_info)
        if not isinstance(info, dict):
            raise ResultsFolderError(f"{self.run_info} is not a JSON object")
        return info

    def read_result(self) -> RunResult | None:
        """The run's result.json, validated; ``None`` where there is none."""
        if not self.result.is_file():
            return None
        return validate_result(read_json(self.result), str(self.result))

    def read_log_tail(self, lines: int) -> str:
        """The last ``lines`` lines of the run's log (``""`` where it cannot be read)."""
        try:
            with open(self.log, errors="replace") as fh:
                return "".join(deque(fh, maxlen=lines)).strip()
        except OSError:
            return ""

    def manifest_complete(self) -> bool:
        """Whether the run's manifest is the complete one (not missing, unreadable, or the one written before the
        run)."""

        try:
            return read_json(self.manifest).get("stage", COMPLETE) == COMPLETE
        except (ResultsFolderError, AttributeError):
            return False

    def facts(self) -> dict[str, str]:
        """Where the run's files are, relative to the results folder (recorded in the run's facts)."""
        facts = {"run_dir": self.relative_folder, "log": f"{self.relative_folder}/run.log",
                 "manifest": f"{self.relative_folder}/manifest.json"}
        if self.mllog.exists():
            facts["mlperf_log"] = f"{self.relative_folder}/mlperf.log"
        return facts


def read_json(path: Path) -> Any:
    """A record file as JSON, read as a regular file within the size cap; :class:`ResultsFolderError` names the file
    and what is wrong."""
    try:
        text = read_record_text(path)
    except FileNotFoundError:
        raise ResultsFolderError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsFolderError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        return loads_bounded(text, str(path))
    except json.JSONDecodeError as exc:
        raise ResultsFolderError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") \
            from None
    except ValueError as exc:  # over the memory bound, or nested too deeply
        raise ResultsFolderError(str(exc)) from None


def validate_result(data: Any, where: str) -> RunResult:
    """A run record read from ``where``, checked field by field (config included)."""
    try:
        result = RunResult.from_dict(data)
    except ConfigError as exc:
        raise ResultsFolderError(f"{where}: config: {exc}") from None
    except LossDigestMismatch as exc:
        raise RecordEdited(f"{where}: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise ResultsFolderError(f"{where}: {exc}") from None
    return result


def read_results_file(path: Path, matrix_uid: str | None = None) -> list[RunResult]:
    """The runs of a ``results.json`` (schema 2, or the schema-1 bare list), each validated."""
    data = read_json(path)
    if isinstance(data, list):  # schema 1: a bare list of runs
        runs = data
    elif isinstance(data, dict):
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ResultsFolderError(f"{path} has schema_version {data.get('schema_version')!r}; this suite reads "
                                     f"{SCHEMA_VERSION} (a results.json written by `suite run`)")
        listed = data.get("runs")
        if not isinstance(listed, list):
            raise ResultsFolderError(f"{path} has no list of runs")
        runs = listed
        if matrix_uid is not None and data.get("matrix_uid") != matrix_uid:
            raise ResultsFolderError(f"{path} belongs to matrix {data.get('matrix_uid')!r}, but {MATRIX_FILE} beside "
                                     f"it describes matrix {matrix_uid!r}")
    else:
        raise ResultsFolderError(f"{path} is not a results file: a {type(data).__name__}, not a JSON object")
    return [validate_result(run, f"{path}: run {index}") for index, run in enumerate(runs)]


def read_scores_file(path: Path) -> list[dict[str, Any]]:
    data = read_json(path)
    scores = data if isinstance(data, list) else data.get("scores") if isinstance(data, dict) else None
    if not isinstance(scores, list) or not all(isinstance(s, dict) and "config_id" in s for s in scores):
        raise ResultsFolderError(f"{path} is not a scores file (a list of scores, each with its config_id)")
    return scores


def read_rescue(path: str | os.PathLike[str]) -> tuple[MatrixInfo, list[RunResult], list[dict[str, Any]]]:
    """A rescue file written by :meth:`ResultsStore.rescue`, validated (its manifests: :func:`rescued_manifests`)."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION or "matrix" not in data:
        raise ResultsFolderError(f"{path} is not a suite rescue file")
    try:
        matrix = MatrixInfo.from_dict(data["matrix"])
    except (ValueError, TypeError) as exc:
        raise ResultsFolderError(f"{path}: matrix: {exc}") from None
    runs = [validate_result(r, f"{path}: run {i}") for i, r in enumerate(data.get("runs") or [])]
    return matrix, runs, list(data.get("scores") or [])


def rescued_manifests(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The complete manifests a rescue file carries, by run uid (none in a rescue file of an older suite)."""
    data = read_json(Path(path))
    manifests = data.get("manifests") if isinstance(data, dict) else None
    return {str(k): v for k, v in manifests.items() if isinstance(v, dict)} if isinstance(manifests, dict) else {}


def read_audit_checks(path: Path) -> list[tuple[str, str, str, str]]:
    """The checks (subject, name, verdict, detail) of ``suite audit``'s audit.json, or of the folder holding it."""
    path = path / AUDIT_FILE if path.is_dir() else path
    data = read_json(path)
    try:
        return [(str(c["subject"]), str(c["name"]), str(c["verdict"]), str(c["detail"])) for c in data["checks"]]
    except (KeyError, TypeError) as exc:
        raise ResultsFolderError(f"{path} is not an audit.json of suite audit: {exc}") from None
