"""The run's own account on stderr (kept as ``run.log``)."""

from __future__ import annotations

import sys
import time
from typing import Any

from suite.text import visible


class RunLog:
    """A readable account of the run on stderr (the runner keeps it as ``run.log``): phases, the first steps
    and then about 50 more spread over the run, and the outcome."""

    def __init__(self, stream: Any = None) -> None:
        self._stream = stream or sys.stderr
        self._started = time.monotonic()

    def line(self, text: str) -> None:
        try:
            self._stream.write(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - self._started:7.1f}s] "
                               f"{visible(text)}\n")
            self._stream.flush()
        except OSError:  # a log that cannot be written (full disk) must not end the run
            pass

    def event(self, event: dict[str, Any]) -> None:
        if "eval_accuracy" in event:
            self.line(f"evaluation after step {event['step']}: eval_accuracy {event['eval_accuracy']:.4g}")
        elif "phase" in event:
            self.line(f"phase: {event['phase']}")
        elif "step" in event:
            step, total = event["step"], event["total"]
            if step <= 5 or step == total or step % max(1, total // 50) == 0:
                self.line(f"step {step}/{total}: loss {event['loss']:.6g}")
