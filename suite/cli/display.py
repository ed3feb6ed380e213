"""What the CLI shows: progress while a matrix runs, and tables of results, scores, checks and comparisons."""

from __future__ import annotations

import sys
import time
from typing import Any, Sequence

from suite.analysis.scoring import ConfigScore
from suite.analysis.summary import summary_line
from suite.config import RunConfig
from suite.devices.cpu import DEVICE_MEMORY_NOTE
from suite.results.record import FINISHED, RunResult
from suite.text import visible

MiB = 2**20


def wide_console() -> Any:
    from rich.console import Console

    return Console(width=max(Console().width, 160))


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
        from suite.run.estimate import format_duration

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
        from suite.run.estimate import format_duration

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
        print(f"[{index + 1}/{count}] {config.describe()} ({config.config_id})", file=sys.stderr, flush=True)

    def event(self, config: RunConfig, event: dict[str, Any]) -> None:
        pass

    def config_ended(self, result: RunResult) -> None:
        print(summary_line(result), file=sys.stderr, flush=True)


def _plain(text: str) -> Any:
    """A table cell shown as it is: reasons and labels may hold brackets (gloo's "[.../pair.cc:553]") that rich
    would read as markup."""
    from rich.text import Text

    return Text(visible(text))


def _fmt(metrics: dict[str, float], key: str, scale: float = 1.0, pattern: str = "{:.0f}") -> str:
    return pattern.format(metrics[key] * scale) if key in metrics else "-"


def print_results_table(results: Sequence[RunResult]) -> None:
    """One row per run: the headline metrics, or the failure reason."""
    from rich.table import Table

    table = Table(title="results")
    table.add_column("configuration", no_wrap=True)
    table.add_column("status", overflow="fold", max_width=60)
    for column in ("samples/s", "p50 ms", "p99 ms", "data-wait", "device peak MiB", "host PSS MiB", "host RSS MiB"):
        table.add_column(column, justify="right")
    for result in results:
        label = result.config.describe() + (f" #{result.repeat}" if result.repeat else "")
        m = result.metrics
        if result.status == FINISHED:
            table.add_row(_plain(label), result.status, _fmt(m, "throughput_samples_per_s", pattern="{:.1f}"),
                          _fmt(m, "step_time_p50_s", 1000), _fmt(m, "step_time_p99_s", 1000),
                          _fmt(m, "data_wait_fraction", pattern="{:.0%}"), _fmt(m, "device_peak_memory_bytes", 1 / MiB),
                          _fmt(m, "host_ram_peak_pss_bytes", 1 / MiB), _fmt(m, "host_ram_peak_rss_bytes", 1 / MiB))
        else:
            table.add_row(_plain(label), _plain(f"{result.status}: {result.reason}"), *["-"] * 7)
    wide_console().print(table)
    if any(r.config.device == "cpu" for r in results):
        print(DEVICE_MEMORY_NOTE)
    busy = [r for r in results if r.status == FINISHED and (r.facts.get("contention") or {}).get("contended")]
    if busy:
        shares = ", ".join(f"{_plain(r.config.describe())} (others used "
                           f"{r.facts['contention'].get('others_share', 0):.0%} of the cores)" for r in busy)
        print(f"suite: warning: measured while other work used the machine: {visible(shares)}. Those figures are "
              "not the machine's, and an audit gives them no verdict: measure again on a quiet machine, or with "
              "--repeats N to see the spread.", file=sys.stderr)


def print_scores_table(scores: Sequence[ConfigScore]) -> None:
    from rich.table import Table

    table = Table(title="scores over repeats")
    for column in ("configuration", "status", "repeats", "score samples/s", "CV", "dropped", "losses identical"):
        table.add_column(column)
    for score in scores:
        table.add_row(_plain(score.config.describe()),
                      _plain(score.status if not score.reason else f"{score.status}: {score.reason}"),
                      str(score.repeats),
                      "-" if score.throughput_score is None else f"{score.throughput_score:.1f}",
                      "-" if score.throughput_cv is None else f"{score.throughput_cv:.1%}",
                      ",".join(map(str, score.dropped_repeats)) or "-", str(score.loss_digests_identical))
    wide_console().print(table)


def print_checks(report: Any) -> None:
    from rich.table import Table

    colours = {"PASS": "green", "FAIL": "red", "INCONCLUSIVE": "magenta", "WARN": "yellow", "SKIP": "dim"}
    table = Table(title=f"audit of {report.target}")
    for column in ("subject", "check", "verdict", "detail"):
        table.add_column(column, overflow="fold")
    for c in report.checks:
        table.add_row(_plain(c.subject), _plain(c.name), f"[{colours[c.verdict]}]{c.verdict}[/]", _plain(c.detail))
    wide_console().print(table)
    counts = ", ".join(f"{sum(c.verdict == v for c in report.checks)} {v}" for v in colours
                       if any(c.verdict == v for c in report.checks))
    print(f"audit verdict: {report.verdict} ({counts})")


def print_compare_table(rows: Sequence[Any], base: Any, ratios: Sequence[float]) -> None:
    from rich.table import Table

    table = Table(title=f"configurations (speed-up over {base.label})")
    table.add_column("configuration", justify="left")
    for column in ("runs", "samples/s", "95% interval", "speed-up", "quality", "p50 ms", "data-wait",
                   "device peak MiB", "host PSS MiB", "host RSS MiB"):
        table.add_column(column, justify="right")
    for row, ratio in zip(rows, ratios, strict=True):
        m = row.metrics
        runs = str(row.runs) + (f" (+{row.unfinished_runs} unfinished)" if row.unfinished_runs else "")
        interval = (f"{m['throughput_ci95_low']:.1f}-{m['throughput_ci95_high']:.1f}"
                    if "throughput_ci95_low" in m and "throughput_ci95_high" in m else "-")
        table.add_row(_plain(row.label + (" [busy host]" if row.contended else "")), runs,
                      _fmt(m, "throughput_samples_per_s", pattern="{:.1f}"), interval, f"{ratio:.2f}x",
                      _fmt(m, "eval_accuracy", pattern="{:.3f}"),
                      _fmt(m, "step_time_p50_s", 1000), _fmt(m, "data_wait_fraction", pattern="{:.0%}"),
                      _fmt(m, "device_peak_memory_bytes", 1 / MiB), _fmt(m, "host_ram_peak_pss_bytes", 1 / MiB),
                      _fmt(m, "host_ram_peak_rss_bytes", 1 / MiB))
    wide_console().print(table)
    if any(row.config.device == "cpu" for row in rows):
        print(DEVICE_MEMORY_NOTE)
    if any(row.contended for row in rows):
        print("[busy host]: other processes used the cores (or the hypervisor stole them) while it was measured; "
              "its figures are not the machine's", file=sys.stderr)
    print("quality: eval_accuracy, the mean image<->text retrieval recall@1 over the held-out pairs")


def print_tune_table(outcome: Any) -> None:
    """Every point of a tune sweep with its spread (95 % interval, as ± % of its throughput) and busy-host flag."""
    from rich.table import Table

    table = Table(title="suite tune: every setting, with its spread")
    for column in ("setting", "status", "samples/s", "95% interval", "spread", "data-wait", "host PSS MiB", "host",
                   "vs best (equivalence)", "pick"):
        table.add_column(column, justify="left" if column in ("setting", "status", "pick", "vs best (equivalence)")
                         else "right")
    for point in outcome.points:
        finished = point.status == FINISHED and point.throughput_samples_per_s is not None
        has_interval = finished and point.ci_low is not None and point.ci_high is not None
        pick = ", ".join(name for name, chosen in (("best", point is outcome.best),
                                                   ("recommended", point is outcome.recommended)) if chosen)
        table.add_row(
            point.label, _plain(point.status if finished else f"{point.status}: {point.reason}"),
            f"{point.throughput_samples_per_s:.1f}" if finished else "-",
            f"{point.ci_low:.1f}-{point.ci_high:.1f}" if has_interval else "-",
            f"±{(point.ci_high - point.ci_low) / 2 / point.throughput_samples_per_s:.0%}" if has_interval else "-",
            f"{point.data_wait_fraction:.0%}" if finished and point.data_wait_fraction is not None else "-",
            f"{point.host_ram_peak_pss_bytes / MiB:.0f}" if finished and point.host_ram_peak_pss_bytes else "-",
            "BUSY" if point.contended else "quiet", _plain(point.vs_best or "-"), pick)
    wide_console().print(table)


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
