"""The recorder interface: open a matrix, begin/end each configuration run, score it, close.

The results folder (:mod:`suite.results.store`) is not a recorder: it is written first, always, and a
failure to write it stops the matrix. Recorders are the optional destinations after it (MLflow); one that
fails is switched off for the rest of the matrix and the folder keeps every run for ``suite upload``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Sequence

from suite.analysis.scoring import ConfigScore
from suite.config import RunConfig
from suite.results.files import MatrixInfo
from suite.results.record import RunResult


class Recorder(ABC):
    @abstractmethod
    def open(self, info: MatrixInfo, results_root: Path) -> None:
        """Start recording a matrix whose results folder is ``results_root``."""

    def plan(self, configs: Sequence[RunConfig]) -> None:
        """The configurations this matrix will run, in order (before the first :meth:`begin`)."""

    def begin(self, config: RunConfig, repeat: int, run_uid: str) -> None:
        """Repeat ``repeat`` of a configuration is about to run; ``run_uid`` identifies that run."""

    @abstractmethod
    def end(self, result: RunResult) -> None:
        """A configuration run ended (FINISHED, FAILED or KILLED) and is in the results folder; record it."""

    def score(self, score: ConfigScore) -> None:
        """All repeats of a configuration ended; ``score`` summarizes them."""

    def matrix_metrics(self, metrics: dict[str, float]) -> None:
        """Figures of the whole matrix (its MLflow set-up, the share of its wall time in measured windows)."""

    @abstractmethod
    def close(self, status: str, reason: str | None = None) -> None:
        """The matrix ended with ``status``."""

    def abandon(self) -> None:
        """This recorder failed and is switched off: stop its background work without waiting on it."""

    def describe(self) -> dict[str, Any]:
        """Where this recorder put things (printed at the end of a run)."""
        return {}
