"""The recorder interface: open a matrix, begin/end each configuration, close."""

from __future__ import annotations

from abc import ABC, abstractmethod
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite.config import RunConfig
from suite.results import RunResult
from suite.scoring import ConfigScore


@dataclass
class MatrixInfo:
    """What a whole matrix invocation shares: its name, workload, command line and environment."""

    name: str
    workload: str
    command: list[str]
    output_dir: Path
    repeats: int = 1
    memory_limit_bytes: int | None = None
    experiment: str | None = None  # MLflow experiment; None: the workload's name
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)  # finds this matrix again (suite upload)
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


class Recorder(ABC):
    #: A recorder whose failure stops the matrix (results.json). Others are switched off with a warning
    #: (an unreachable MLflow server), and ``suite upload`` records their runs later.
    essential: bool = True

    @abstractmethod
    def open(self, info: MatrixInfo) -> None:
        """Start recording a matrix."""

    def begin(self, config: RunConfig, repeat: int, run_uid: str) -> None:
        """Repeat ``repeat`` of a configuration is about to run; ``run_uid`` identifies that run."""

    @abstractmethod
    def end(self, result: RunResult) -> None:
        """A configuration ended (FINISHED, FAILED or KILLED); persist it now."""

    def score(self, score: ConfigScore) -> None:
        """All repeats of a configuration ended; ``score`` summarizes them."""

    @abstractmethod
    def close(self, status: str) -> None:
        """The matrix ended with ``status``."""

    def describe(self) -> dict[str, Any]:
        """Where this recorder put things (printed at the end of a run)."""
        return {}
