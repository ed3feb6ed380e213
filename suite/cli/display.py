"""What the CLI shows: progress while a matrix runs, and tables of results, scores, checks and comparisons."""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from typing import Any, Sequence

from suite.analysis.summary import summary_line
from suite.config import RunConfig
from suite.redact import redact_text
from suite.results.record import RunResult, distinct_runs, unusable_notes
from suite.run.estimate import format_duration
from suite.text import visible

MiB = 2**20


#: The width assumed where output goes to a file or a pipe: no line is wrapped.
UNBOUNDED = 10_000
#: Narrower than this, tables are printed as a block of lines per row instead.
TABLE_WIDTH = 160


def wide_console() -> Any:
    from rich.console import Console

    return Console(width=max(Console().width, TABLE_WIDTH))


def narrow() -> bool:
    """Whether the terminal is too narrow for the result tables (then each row is a wrapped block of lines)."""
    return terminal_width() < TABLE_WIDTH


class Timing:
    """Step and configuration times as a matrix runs, for the progress display: the current step time and
    samples/s, and ETAs for the configuration and the matrix (from the configurations done so far, else from the
    store's history of the same configurations, else from the steps timed so far)."""

    def __init__(self, count: int, history: Any = None) -> None:
        self.count = count
        self.history = history  # suite.run.estimate.Estimate of the planned configurations, or None
        self.done_s: list[float] = []
        self.config: RunConfig | None = None
        self.config_started = 0.0
        self.last_step_at: float | None = None
        self.step_times: list[float] = []
        self.step, self.total = 0, 0

    def start(self, config: RunConfig) -> None:
        self.config, self.config_started = config, time.monotonic()
        self.last_step_at, self.step_times, self.step, self.total = None, [], 0, 0

    def on_step(self, step: int, total: int) -> None:
        now = time.monotonic()
        if self.last_step_at is not None and step > self.step:
            self.step_times.append((now - self.last_step_at) / (step - self.step))
        self.last_step_at, self.step, self.total = now, step, total

    def end(self) -> None:
        self.done_s.append(time.monotonic() - self.config_started)

    @property
    def step_time_s(self) -> float | None:
        recent = sorted(self.step_times[-10:])
        return recent[len(recent) // 2] if recent else None

    def config_eta_s(self) -> float | None:
        step_time = self.step_time_s
        if step_time is None or not self.total:
            return None
        return step_time * max(0, self.total - self.step)

    def matrix_eta_s(self) -> float | None:
        """The current configuration's remaining time plus one typical configuration per one not yet started."""
        left = self.count - len(self.done_s) - (1 if self.config is not None else 0)
        typical: float | None = None
        if self.done_s:
            typical = sum(self.done_s) / len(self.done_s)
        elif self.history is not None and self.history.per_config:
            known = [v for v in self.history.per_config.values() if v is not None]
            typical = sum(known) / len(known) if known else None
        current = self.config_eta_s()
        if current is None and self.config is not None:
            if typical is None:
                return None
            current = max(0.0, typical - (time.monotonic() - self.config_started))
        if typical is None:
            return current if left == 0 else None
        return (current or 0.0) + typical * max(0, left)

    def step_text(self, loss: float) -> str:

        parts = [f"loss {loss:.4f}"]
        step_time = self.step_time_s
        if step_time and self.config is not None:
            samples = (self.config.batch_size or 0) * self.config.nproc_per_node
            parts.append(f"{step_time * 1000:.0f} ms/step" + (f", {samples / step_time:.1f} samples/s" if samples
                                                              else ""))
        eta = self.config_eta_s()
        if eta is not None:
            parts.append(f"ETA {format_duration(eta)}")
        return " | ".join(parts)

    def matrix_text(self) -> str:

        eta = self.matrix_eta_s()
        return "" if eta is None else f"matrix ETA {format_duration(eta)}"


class RichProgress:
    """Two bars: configurations of the matrix (with its ETA), and steps of the current configuration (step time,
    samples/s, ETA)."""

    def __init__(self, count: int, history: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.timing = Timing(count, history)
        self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=self.console)
        self._matrix = self._bars.add_task("configurations", total=count, info=self.timing.matrix_text())
        self._steps = self._bars.add_task("steps", total=None, info="")
        self._library_logs = LibraryLogsOnConsole(self.console)

    def __enter__(self) -> "RichProgress":
        self._library_logs.__enter__()
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.stop()
        self._library_logs.__exit__(*exc)

    def config_started(self, config: RunConfig, index: int, count: int) -> None:
        self.timing.start(config)
        self._bars.reset(self._steps, total=None, description=config.describe(), info="starting")
        self._bars.update(self._matrix, info=self.timing.matrix_text())

    def event(self, config: RunConfig, event: dict[str, Any]) -> None:
        if "eval_accuracy" in event:
            self._bars.update(self._steps, info=f"eval_accuracy {event['eval_accuracy']:.3f}")
        elif "step" in event:
            self.timing.on_step(event["step"], event["total"])
            self._bars.update(self._steps, completed=event["step"], total=event["total"],
                              info=self.timing.step_text(event["loss"]))
            self._bars.update(self._matrix, info=self.timing.matrix_text())
        elif "phase" in event:
            self._bars.update(self._steps, info=event["phase"], total=event.get("total"))

    def config_ended(self, result: RunResult) -> None:
        self.timing.end()
        self._bars.advance(self._matrix)
        self._bars.update(self._matrix, info=self.timing.matrix_text())
        from rich.text import Text

        self.console.print(Text(summary_line(result)), soft_wrap=True)


class LibraryLogsOnConsole:
    """While a progress display runs, MLflow's and Alembic's log records go through it (above the bars, at
    WARNING and up) instead of their own stderr handlers, which would print INFO lines into the bars."""

    LOGGERS = ("mlflow", "alembic")

    def __init__(self, console: Any) -> None:
        self._console = console
        self._saved: list[tuple[Any, list[Any], int, bool]] = []

    def __enter__(self) -> "LibraryLogsOnConsole":
        import logging

        from rich.logging import RichHandler

        handler = RichHandler(console=self._console, show_time=False, show_path=False, level=logging.WARNING)
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            self._saved.append((logger, list(logger.handlers), logger.level, logger.propagate))
            logger.handlers = [handler]
            logger.setLevel(logging.WARNING)
            logger.propagate = False
        return self

    def __exit__(self, *exc: object) -> None:
        for logger, handlers, level, propagate in self._saved:
            logger.handlers, logger.propagate = handlers, propagate
            logger.setLevel(level)
        self._saved.clear()


class PlainProgress:
    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def config_started(self, config: RunConfig, index: int, count: int) -> None:
        say(f"[{index + 1}/{count}] {config.describe()} ({config.config_id})", file=sys.stderr)

    def event(self, config: RunConfig, event: dict[str, Any]) -> None:
        pass

    def config_ended(self, result: RunResult) -> None:
        say(summary_line(result), file=sys.stderr)


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def terminal_width() -> int:
    """The terminal's width: ``$COLUMNS`` where set, the terminal's own, else :data:`UNBOUNDED` (output to a file
    or a pipe keeps whole lines)."""
    return shutil.get_terminal_size((UNBOUNDED, 24)).columns


def wrapped(text: str, indent: str = "", width: int | None = None) -> str:
    """``text`` in lines no longer than the terminal (:func:`terminal_width`): each line of it keeps its own leading
    spaces (after ``indent``), its continuation lines two more; a word longer than a line (a path) is broken."""
    width = max(width or terminal_width(), 40)
    out = []
    for line in text.split("\n"):
        body = line.lstrip(" ")
        lead = indent + line[:len(line) - len(body)]
        out.append(lead + body if len(lead + body) <= width else
                   textwrap.fill(body, width=width, initial_indent=lead, subsequent_indent=lead + "  ",
                                 break_on_hyphens=False))
    return "\n".join(out)


def say(text: str, file: Any = None) -> None:
    """Print ``text`` wrapped to the terminal's width (see :func:`wrapped`); a credential that reached it (an
    error from a database driver quoting its URL) redacted, the last guard of :mod:`suite.redact`."""
    print(wrapped(redact_text(text)), file=file or sys.stdout, flush=True)


#: Lines a warning about unusable figures shows before counting the rest.
UNUSABLE_SHOWN = 5


def warn_unusable(results: Sequence[RunResult], source: object) -> None:
    """Warnings on ``source``'s records: a run listed more than once (counted once), and the figures shown as "-"
    because their recorded values cannot be theirs (:func:`suite.results.record.unusable_notes`: the first
    :data:`UNUSABLE_SHOWN` runs, then a count)."""
    repeated = distinct_runs(results)[1]
    if repeated:
        say(f"suite: warning: {visible(source)} lists {len(repeated)} run(s) more than once (run uid "
            f"{visible(', '.join(repeated[:3]))}{', ...' if len(repeated) > 3 else ''}): each is counted once",
            file=sys.stderr)
    notes = unusable_notes(results)
    if not notes:
        return
    lines = notes[:UNUSABLE_SHOWN] + ([f"and {len(notes) - UNUSABLE_SHOWN} more run(s)"]
                                      if len(notes) > UNUSABLE_SHOWN else [])
    say(f"suite: warning: {visible(source)}: figures recorded with values they cannot take, shown as \"-\" and never "
        "computed with: " + visible(" | ".join(lines)), file=sys.stderr)
