"""The recorder interface: open a matrix, begin/end each configuration, close."""

from __future__ import annotations

from abc import ABC, abstractmethod
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
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


class Recorder(ABC):
    @abstractmethod
    def open(self, info: MatrixInfo) -> None:
        """Start recording a matrix."""

    def begin(self, config: RunConfig, repeat: int = 0) -> None:
        """Repeat ``repeat`` of a configuration is about to run."""

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
