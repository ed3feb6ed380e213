"""The recorders of a matrix called as one: a recorder that fails is set aside with its error, the others go on."""

from __future__ import annotations

from typing import Callable, Sequence

from suite.analysis.scoring import ConfigScore
from suite.config import RunConfig
from suite.results.record import RunResult
from suite.results.store import ResultsStore
from suite.tracking.base import Recorder


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
        config_id = result.config.config_id
        self._call(f"the end of {config_id}", lambda r: r.end(result), result)

    def score(self, score: ConfigScore) -> None:
        self._call(f"the score of {score.config_id}", lambda r: r.score(score))

    def matrix_metrics(self, metrics: dict[str, float]) -> None:
        self._call("the matrix's timing", lambda r: r.matrix_metrics(metrics))

    def close(self, status: str, reason: str | None) -> None:
        self._call("close", lambda r: r.close(status, reason))
