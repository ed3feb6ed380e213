"""MLPerf-format logging through MLCommons' own ``mlperf_logging.mllog``.

Each configuration's process writes ``mlperf.log`` (``:::MLLOG {json}`` lines) beside its result.
This wrapper adds what mllog leaves to the caller: values are checked to be JSON-serialisable before
logging (mllog would log an error line and drop the event), and every interval started must be ended
(:meth:`MlperfLog.close` raises on an unmatched start). The log is checked with MLCommons' compliance
checker against our ruleset, :data:`RULESET`.
"""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

RULESET = Path(__file__).parent / "rules" / "suite_training_1.0.0.yaml"
#: mllog intervals end with a different key than they start with.
START_OF = {"init_stop": "init_start", "run_stop": "run_start", "block_stop": "block_start",
            "epoch_stop": "epoch_start"}
STOP_OF = {start: stop for stop, start in START_OF.items()}
_ids = itertools.count()


class MlperfLog:
    """An mllog logger writing to one file; ``MlperfLog(None)`` logs nothing."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._open: list[str] = []  # started intervals, innermost last
        self._logger: logging.Logger | None = None
        self._mllog: Any = None
        if self.path is None:
            return
        from mlperf_logging.mllog import mllog

        self._logger = logging.getLogger(f"suite.mlperf_log.{next(_ids)}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        self._handler = logging.FileHandler(self.path, mode="w")
        self._logger.addHandler(self._handler)
        # stack offset 2: report the caller of this wrapper as the event's file and line
        self._mllog = mllog.MLLogger(logger=self._logger, default_stack_offset=2)

    @staticmethod
    def _check(key: str, value: Any, metadata: dict[str, Any] | None) -> None:
        try:
            json.dumps({"value": value, "metadata": metadata})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"mllog event {key!r} is not JSON-serialisable: {exc}") from exc

    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllog is not None:
            self._check(key, value, metadata)
            self._mllog.event(key=key, value=value, metadata=metadata)

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllog is not None:
            if key in self._open:
                raise ValueError(f"mllog interval {key!r} started twice")
            self._check(key, value, metadata)
            self._open.append(key)
            self._mllog.start(key=key, value=value, metadata=metadata)

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllog is not None:
            start = START_OF.get(key, key)
            if start not in self._open:
                raise ValueError(f"mllog interval {key!r} ended without {start!r}")
            self._check(key, value, metadata)
            self._open.remove(start)
            self._mllog.end(key=key, value=value, metadata=metadata)

    def abort(self) -> None:
        """End every open interval, innermost first, with status ``aborted``."""
        for start in reversed(list(self._open)):
            self.end(STOP_OF.get(start, start), metadata={"status": "aborted"})

    def close(self) -> None:
        """Flush and close; raises if an interval was left open."""
        if self._logger is None:
            return
        self._logger.removeHandler(self._handler)
        self._handler.close()
        self._logger = self._mllog = None
        if self._open:
            raise ValueError(f"mllog intervals never ended: {', '.join(sorted(self._open))}")


def check_compliance(log_path: str | Path, ruleset: str | Path = RULESET) -> tuple[bool, str]:
    """Run MLCommons' compliance checker on ``log_path`` with our ruleset; (passed, checker output)."""
    log_output = Path(log_path).with_suffix(".compliance.log")
    proc = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--config", str(Path(ruleset).resolve()),
         "--log_output", str(log_output), str(log_path)],
        capture_output=True, text=True,
    )
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()
