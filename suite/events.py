"""The one-line event protocol from an isolated run process to the runner (progress, phases).

Events are JSON objects on the child's stdout, each on a line starting with :data:`PREFIX`; any other
output line is ordinary log output.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

PREFIX = "@@suite-event "


def emit(stream: TextIO | None = None, **event: Any) -> None:
    out = stream or sys.stdout
    out.write(PREFIX + json.dumps(event, separators=(",", ":")) + "\n")
    out.flush()


def parse(line: str) -> dict[str, Any] | None:
    """The event on ``line``, or ``None`` if it is plain output."""
    if not line.startswith(PREFIX):
        return None
    try:
        return json.loads(line[len(PREFIX):])
    except json.JSONDecodeError:
        return None
