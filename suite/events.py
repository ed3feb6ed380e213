"""The one-line event protocol from a configuration process to the runner (progress, phases, the result).

Events are JSON objects on the child's stdout, each on a line starting with :data:`PREFIX`; any other output
line is ordinary log output. If the runner is gone (its end of the pipe closed, e.g. it was killed), events
are dropped and the configuration runs on to write its own result files.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

PREFIX = "@@suite-event "
#: Set by the runner to the wall-clock time (``time.time()``) it started the configuration process: the start of
#: ``setup_process_start_s``.
LAUNCHED_AT_ENV = "SUITE_LAUNCHED_AT"
_runner_gone = False


def emit(stream: TextIO | None = None, **event: Any) -> None:
    global _runner_gone
    if _runner_gone:
        return
    out = stream or sys.stdout
    try:
        out.write(PREFIX + json.dumps(event, separators=(",", ":")) + "\n")
        out.flush()
    except (BrokenPipeError, ValueError):  # the runner closed the pipe / stdout closed: nobody listens
        _runner_gone = True
        try:  # keep the interpreter's final flush of stdout from failing too
            sys.stdout = open("/dev/null", "w")  # lives until the process exits
        except OSError:
            pass


def parse(line: str) -> dict[str, Any] | None:
    """The event on ``line``, or ``None`` if it is plain output."""
    if not line.startswith(PREFIX):
        return None
    try:
        return json.loads(line[len(PREFIX):])
    except json.JSONDecodeError:
        return None
