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
import functools
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from suite.analysis.scoring import ConfigScore, score_repeats
from suite.analysis.timeline import matrix_timing
from suite.config import MatrixSpec, RunConfig
from suite.errors import ConfigError, RecordingError, UnknownPluginError
from suite.meters.setup import process_started_at
from suite.registry import device_names, load_workload
from suite.results.record import FAILED, FINISHED, KILLED, RunResult, differing_datasets
from suite.results.store import ResultsStore
from suite.run.children import Standby, can_start_ahead
from suite.run.launch import Interrupted, NoProgress, Progress, launch
from suite.run.recorder_set import RecorderSet
from suite.tracking.base import Recorder
from suite.workload import Workload


def resolve(spec: MatrixSpec) -> tuple[type[Workload], list[RunConfig]]:
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
        if config.submission_division == "closed" and not config.submission_org:
            raise ConfigError("division closed needs the submitting organization: give --submission-org")
        if config.submission_division == "closed" and config.eval_samples is not None:
            raise ConfigError("division closed evaluates on the whole held-out set: leave --eval-samples out")
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
    timing: dict[str, float] = dataclasses.field(default_factory=dict)  # see suite.analysis.timeline


#: How many configuration processes are started ahead at once (see run_matrix): two import side by side on two cores;
#: more would hold more idle memory (each ~0.4 GiB with torch and transformers imported) for little gain.
AHEAD = 2


def start_first(configs: Sequence[RunConfig], repeats: int, memory_limit_bytes: int | None) -> list[Standby]:
    """The processes of the first :data:`AHEAD` configurations started ahead (for :func:`run_matrix`'s ``started``),
    as soon as the matrix is known: their imports overlap the runner's own set-up (dataset check, MLflow)."""
    started: list[Standby] = []
    for config in [c for c in configs for _ in range(repeats)][:AHEAD]:  # in run_matrix's order
        if not can_start_ahead(config):
            break
        try:
            started.append(Standby(config, memory_limit_bytes))
        except (OSError, ValueError):
            break
    return started


class _StopMatrix(Exception):
    """The results folder cannot be written: no further configuration is started."""


def run_matrix(configs: Sequence[RunConfig], store: ResultsStore, recorders: Sequence[Recorder],
               progress: Progress | None = None, start_ahead: bool = True, started_at: float | None = None,
               started: Sequence[Standby] = ()) -> MatrixOutcome:
    """Run every configuration ``repeats`` times (from the store's matrix info), recording each run as it ends
    and each configuration's score (see :mod:`suite.analysis.scoring`) after its last repeat.

    On an interrupt (Ctrl-C, SIGTERM), the running configuration is recorded as KILLED, the matrix is closed
    with status KILLED and the interrupt propagates.

    With ``start_ahead``, configuration processes are started ahead of their turn (:class:`~suite.run.children.
    Standby`), :data:`AHEAD` at a time, so that they import side by side: the first ones while the recorders open,
    the next ones when a configuration has done its measured steps and final evaluation and the one after it has
    no process yet. Processes started ahead wait idle (no CPU) while another configuration measures.
    ``started_at``: when the matrix began (default: this process's start), for its timing.
    ``started``: the processes of the first runs, already started ahead by the caller (:func:`start_first`); this
    call owns them.
    """
    if not configs:
        for process in started:
            process.cancel()
        raise ConfigError("the matrix has no configuration to run")
    runner = _MatrixRun(configs, store, progress or NoProgress(), start_ahead, started)
    if start_ahead:  # the first ones (unless the caller started them)
        all(runner.start_one(position) for position in range(AHEAD))
    recorder_set = runner.recorder_set = RecorderSet(recorders)
    opened = time.perf_counter()
    try:
        recorder_set.open(store)
    except BaseException:
        runner.cancel_ahead()
        raise
    setup_mlflow_s = time.perf_counter() - opened if recorders else None
    recorder_set.plan(configs)
    runner.outcome = MatrixOutcome([], [], FINISHED, recorder_errors=recorder_set.errors)
    try:
        for index, config in enumerate(configs):
            runner.score([runner.run_one(index, config, repeat) for repeat in range(store.matrix_info.repeats)])
    except _StopMatrix:
        pass
    except KeyboardInterrupt:  # also while recording (e.g. MLflow retrying): every ended run is in the folder
        runner.outcome.status, runner.outcome.reason = KILLED, "interrupted by the user"
        raise
    finally:
        runner.cancel_ahead()  # the matrix stopped early: the processes started ahead are not needed
        runner.close(started_at or process_started_at(), setup_mlflow_s)
    return runner.outcome


class _MatrixRun:
    """The state of one :func:`run_matrix` call: the schedule of runs, the processes started ahead of their turn,
    the recorders and the outcome so far."""

    recorder_set: RecorderSet
    outcome: MatrixOutcome

    def __init__(self, configs: Sequence[RunConfig], store: ResultsStore, progress: Progress, start_ahead: bool,
                 started: Sequence[Standby]) -> None:
        self.configs, self.store, self.progress, self.start_ahead = configs, store, progress, start_ahead
        self.info = store.matrix_info
        self.schedule = [(config, repeat) for config in configs for repeat in range(self.info.repeats)]
        self.ahead: dict[int, Standby] = dict(enumerate(started))  # schedule position -> its process

    def start_one(self, position: int) -> bool:
        if position in self.ahead or position >= len(self.schedule) or not can_start_ahead(self.schedule[position][0]):
            return True
        try:
            self.ahead[position] = Standby(self.schedule[position][0], self.info.memory_limit_bytes)
            return True
        except (OSError, ValueError):  # cannot start one now (process limit...): it starts at its turn
            return False

    def start_ahead_from(self, position: int) -> None:
        """Unless the run at ``position`` already has its process, start it and the next ones (:data:`AHEAD` in
        all) ahead of their turn: they import side by side, so every other configuration's imports are hidden."""
        if self.start_ahead and position not in self.ahead:
            all(self.start_one(later) for later in range(position, position + AHEAD))

    def cancel_ahead(self) -> None:
        while self.ahead:
            self.ahead.popitem()[1].cancel()

    def record(self, result: RunResult) -> None:
        """The results folder first, then the recorders, then the folder again with the MLflow run id."""
        outcome = self.outcome
        outcome.results.append(result)
        try:
            self.store.record(result)
        except RecordingError as exc:
            outcome.recording_error = str(exc)
        self.recorder_set.end(result)
        if outcome.recording_error is None and result.mlflow_run_id:
            try:
                self.store.record(result)
            except RecordingError as exc:
                outcome.recording_error = str(exc)
        if outcome.recording_error is not None:
            raise _StopMatrix()

    def run_one(self, index: int, config: RunConfig, repeat: int) -> RunResult:
        """One run of ``config``, launched, recorded and returned; an interrupt records it KILLED and propagates."""
        info, position = self.info, index * self.info.repeats + repeat
        run_uid = uuid.uuid4().hex
        self.recorder_set.begin(config, repeat, run_uid)
        self.progress.config_started(config, position, len(self.schedule))
        run_name = config.config_id if info.repeats == 1 else f"{config.config_id}-r{repeat}"
        mine = self.ahead.pop(position, None)  # launch owns it now
        try:
            result = launch(config, self.store, self.progress, command=info.command, repeat=repeat,
                            run_name=run_name, memory_limit_bytes=info.memory_limit_bytes, run_uid=run_uid,
                            standby=mine, compute_done=functools.partial(self.start_ahead_from, position + 1))
        except KeyboardInterrupt as exc:
            self.outcome.status, self.outcome.reason = KILLED, "interrupted by the user"
            completed = exc.result if isinstance(exc, Interrupted) else None
            try:
                self.record(completed or RunResult(config=config, status=KILLED, reason="interrupted by the user",
                                                   ended_at=time.time(), repeat=repeat, run_uid=run_uid))
            except _StopMatrix:
                pass
            raise
        except RecordingError as exc:  # its run folder could not be written: it never ran
            self.outcome.recording_error = str(exc)
            self.record(RunResult(config=config, status=FAILED, reason=f"not run: {exc}", ended_at=time.time(),
                                  repeat=repeat, run_uid=run_uid))
        self.progress.config_ended(result)
        self.record(result)
        return result

    def score(self, repeats: list[RunResult]) -> None:
        """A configuration's score over its repeats, recorded (unless another node measured and scores it)."""
        if any(r.recorded_elsewhere for r in repeats):  # measured and scored by global rank 0's node
            return
        score = score_repeats(repeats)
        self.outcome.scores.append(score)
        try:
            self.store.record_scores([s.as_dict() for s in self.outcome.scores])
        except RecordingError as exc:
            self.outcome.recording_error = str(exc)
            raise _StopMatrix() from None
        self.recorder_set.score(score)

    def close(self, started_at: float, setup_mlflow_s: float | None) -> None:
        """The matrix's timing, status and reason, into the folder and the recorders; a rescue file where the folder
        could not be written."""
        outcome, info, store = self.outcome, self.info, self.store
        outcome.timing = matrix_timing(outcome.results, started_at, setup_mlflow_s)
        info.timing = dict(outcome.timing)
        info.dataset_changes = differing_datasets(outcome.results)  # a file replaced mid-matrix: said, recorded
        self.recorder_set.matrix_metrics(outcome.timing)
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
        self.recorder_set.close(outcome.status, outcome.reason)
        if outcome.recording_error is not None:
            outcome.rescue_file = store.rescue()
