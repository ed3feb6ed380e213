"""The matrix runner: validate everything, then run each configuration in its own fresh process.

Flow: :func:`resolve` checks the workload, preset and device names and fixes the batch size from the preset
(before anything runs); the workload prepares shared inputs once; :func:`run_matrix` launches each
configuration (:func:`suite.run.launch.launch`) and, as each ends, writes it to the results folder first, then
hands it to the recorders (MLflow), then stores the MLflow run id beside it. A failed configuration is recorded
with its reason and the matrix goes on. A results folder that cannot be written (a full disk) stops the matrix:
the runs stay in memory, the recorders still get them, a rescue file keeps them for ``suite recover``, and the
matrix is FAILED with the reason. An interrupt records the running configuration as KILLED.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from suite.analysis.scoring import ConfigScore, score_repeats
from suite.config import MatrixSpec, RunConfig
from suite.errors import ConfigError, RecordingError, UnknownPluginError
from suite.records.results import FAILED, FINISHED, KILLED, RunResult
from suite.records.store import ResultsStore
from suite.recorders.base import Recorder
from suite.registry import device_names, load_workload
from suite.run.launch import Interrupted, NoProgress, Progress, launch


def resolve(spec: MatrixSpec) -> tuple[type, list[RunConfig]]:
    """Validate names against the registries and expand the matrix with the preset's batch size.

    Raises :class:`UnknownPluginError` / :class:`ConfigError` naming what is valid, before anything runs.
    """
    workload_cls = load_workload(spec.workload)
    if spec.preset not in workload_cls.presets:
        raise UnknownPluginError(
            f"unknown preset {spec.preset!r} for workload {spec.workload}; "
            f"valid presets: {', '.join(workload_cls.presets)}"
        )
    known_devices = device_names()
    for device in spec.devices:
        if device not in known_devices:
            raise UnknownPluginError(f"unknown device {device!r}; valid devices: {', '.join(known_devices)}")
    batch_size = spec.batch_size or workload_cls.presets[spec.preset].batch_size
    configs = [dataclasses.replace(c, batch_size=batch_size) for c in spec.expand()]
    for config in configs:
        deviations = workload_cls.recipe_deviations(config) if config.submission_division == "closed" else []
        if deviations:
            raise ConfigError(f"division closed is for runs that follow the published recipe exactly; "
                              f"{config.describe()} differs: {'; '.join(deviations)} (leave the division open)")
    return workload_cls, configs


def shard_of(configs: Sequence[RunConfig], index: int, count: int) -> list[RunConfig]:
    """Shard ``index`` of ``count`` (0-based): every ``count``-th configuration in the order of their ids, so each
    configuration falls in exactly one shard whatever order the options listed the axes in, and the shards differ
    in size by one at most. The shard keeps the matrix's own order."""
    if not 0 <= index < count:
        raise ConfigError(f"shard {index}/{count}: the index must be in 0..{count - 1}")
    ids = sorted({c.config_id for c in configs})
    mine = {config_id for position, config_id in enumerate(ids) if position % count == index}
    return [c for c in configs if c.config_id in mine]


class RecorderSet:
    """Calls every recorder in order; one that fails is switched off for the rest of the matrix, with the
    failure kept in :attr:`errors` and noted in the run's facts (the results folder holds every run)."""

    def __init__(self, recorders: Sequence[Recorder]) -> None:
        self._active = list(recorders)
        self.errors: list[str] = []

    def _call(self, stage: str, call: Callable[[Recorder], None], result: RunResult | None = None) -> None:
        for recorder in list(self._active):
            try:
                call(recorder)
            except Exception as exc:  # noqa: BLE001 - an optional destination: switched off, never fatal
                self._active.remove(recorder)
                recorder.abandon()
                message = f"{type(recorder).__name__} failed at {stage} and is off for the rest of the matrix: " \
                          f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
                self.errors.append(message)
                if result is not None:
                    result.facts.setdefault("recorder_errors", []).append(message)

    def open(self, store: ResultsStore) -> None:
        self._call("open", lambda r: r.open(store.matrix_info, store.root))

    def plan(self, configs: Sequence[RunConfig]) -> None:
        self._call("plan", lambda r: r.plan(configs))

    def begin(self, config: RunConfig, repeat: int, run_uid: str) -> None:
        self._call(f"the start of {config.config_id}", lambda r: r.begin(config, repeat, run_uid))

    def end(self, result: RunResult) -> None:
        config_id = RunConfig.from_dict(result.config).config_id
        self._call(f"the end of {config_id}", lambda r: r.end(result), result)

    def score(self, score: ConfigScore) -> None:
        self._call(f"the score of {score.config_id}", lambda r: r.score(score))

    def close(self, status: str, reason: str | None) -> None:
        self._call("close", lambda r: r.close(status, reason))


@dataclass
class MatrixOutcome:
    """Every run (repeats included), one score per configuration, how the matrix ended, and what could not
    be recorded."""

    results: list[RunResult]
    scores: list[ConfigScore]
    status: str
    reason: str | None = None
    recorder_errors: list[str] = dataclasses.field(default_factory=list)
    recording_error: str | None = None  # the results folder could not be written
    rescue_file: Path | None = None  # where the runs were kept instead


class _StopMatrix(Exception):
    """The results folder cannot be written: no further configuration is started."""


def run_matrix(configs: Sequence[RunConfig], store: ResultsStore, recorders: Sequence[Recorder],
               progress: Progress | None = None) -> MatrixOutcome:
    """Run every configuration ``repeats`` times (from the store's matrix info), recording each run as it ends
    and each configuration's score (see :mod:`suite.analysis.scoring`) after its last repeat.

    On an interrupt (Ctrl-C, SIGTERM), the running configuration is recorded as KILLED, the matrix is closed
    with status KILLED and the interrupt propagates.
    """
    if not configs:
        raise ConfigError("the matrix has no configuration to run")
    info = store.matrix_info
    progress = progress or NoProgress()
    recorder_set = RecorderSet(recorders)
    recorder_set.open(store)
    recorder_set.plan(configs)
    outcome = MatrixOutcome([], [], FINISHED, recorder_errors=recorder_set.errors)

    def record(result: RunResult) -> None:
        """The results folder first, then the recorders, then the folder again with the MLflow run id."""
        outcome.results.append(result)
        try:
            store.record(result)
        except RecordingError as exc:
            outcome.recording_error = str(exc)
        recorder_set.end(result)
        if outcome.recording_error is None and result.mlflow_run_id:
            try:
                store.record(result)
            except RecordingError as exc:
                outcome.recording_error = str(exc)
        if outcome.recording_error is not None:
            raise _StopMatrix()

    total = len(configs) * info.repeats
    try:
        for index, config in enumerate(configs):
            repeats: list[RunResult] = []
            for repeat in range(info.repeats):
                run_uid = uuid.uuid4().hex
                recorder_set.begin(config, repeat, run_uid)
                progress.config_started(config, index * info.repeats + repeat, total)
                run_name = config.config_id if info.repeats == 1 else f"{config.config_id}-r{repeat}"
                try:
                    result = launch(config, store, progress, command=info.command, repeat=repeat,
                                    run_name=run_name, memory_limit_bytes=info.memory_limit_bytes, run_uid=run_uid)
                except KeyboardInterrupt as exc:
                    outcome.status, outcome.reason = KILLED, "interrupted by the user"
                    completed = exc.result if isinstance(exc, Interrupted) else None
                    try:
                        record(completed or RunResult(config=config.to_dict(), status=KILLED,
                                                      reason="interrupted by the user", ended_at=time.time(),
                                                      repeat=repeat, run_uid=run_uid))
                    except _StopMatrix:
                        pass
                    raise
                except RecordingError as exc:  # its run folder could not be written: it never ran
                    outcome.recording_error = str(exc)
                    record(RunResult(config=config.to_dict(), status=FAILED, reason=f"not run: {exc}",
                                     ended_at=time.time(), repeat=repeat, run_uid=run_uid))
                repeats.append(result)
                progress.config_ended(result)
                record(result)
            if any(r.recorded_elsewhere for r in repeats):  # measured and scored by global rank 0's node
                continue
            score = score_repeats(repeats)
            outcome.scores.append(score)
            try:
                store.record_scores([s.as_dict() for s in outcome.scores])
            except RecordingError as exc:
                outcome.recording_error = str(exc)
                raise _StopMatrix() from None
            recorder_set.score(score)
    except _StopMatrix:
        pass
    except KeyboardInterrupt:  # also while recording (e.g. MLflow retrying): every ended run is in the folder
        outcome.status, outcome.reason = KILLED, "interrupted by the user"
        raise
    finally:
        if outcome.recording_error is not None:
            outcome.status = KILLED if outcome.status == KILLED else FAILED
            outcome.reason = f"stopped: the results folder cannot be written ({outcome.recording_error})"
        elif outcome.status == FINISHED and any(r.status != FINISHED for r in outcome.results):
            failed = sum(r.status != FINISHED for r in outcome.results)
            outcome.status, outcome.reason = FAILED, f"{failed} of {len(outcome.results)} run(s) did not finish"
        try:
            store.finish(outcome.status, outcome.reason)
        except RecordingError as exc:
            outcome.recording_error = outcome.recording_error or str(exc)
        recorder_set.close(outcome.status, outcome.reason)
        if outcome.recording_error is not None:
            outcome.rescue_file = store.rescue()
    return outcome
