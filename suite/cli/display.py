"""What the CLI shows: progress while a matrix runs, and tables of results, scores, checks and comparisons."""

from __future__ import annotations

import sys
import time
from typing import Any, Sequence

from suite.analysis.scoring import ConfigScore
from suite.config import RunConfig
from suite.records.results import FINISHED, RunResult

MiB = 2**20


def wide_console() -> Any:
    from rich.console import Console

    return Console(width=max(Console().width, 160))


class RichProgress:
    """Two bars: configurations of the matrix, and steps of the current configuration."""

    def __init__(self, count: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=self.console)
        self._matrix = self._bars.add_task("configurations", total=count, info="")
        self._steps = self._bars.add_task("steps", total=None, info="")

    def __enter__(self) -> "RichProgress":
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.stop()

    def config_started(self, config: RunConfig, index: int, count: int) -> None:
        self._bars.reset(self._steps, total=None, description=config.describe(), info="starting")

    def event(self, config: RunConfig, event: dict[str, Any]) -> None:
        if "eval_accuracy" in event:
            self._bars.update(self._steps, info=f"eval_accuracy {event['eval_accuracy']:.3f}")
        elif "step" in event:
            self._bars.update(self._steps, completed=event["step"], total=event["total"],
                              info=f"loss {event['loss']:.4f}")
        elif "phase" in event:
            self._bars.update(self._steps, info=event["phase"], total=event.get("total"))

    def config_ended(self, result: RunResult) -> None:
        self._bars.advance(self._matrix)
        self.console.print(summary_line(result), soft_wrap=True)


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


def summary_line(result: RunResult) -> str:
    label = RunConfig.from_dict(result.config).describe()
    if result.status != FINISHED:
        return f"  {label}: {result.status}: {result.reason}"
    m = result.metrics
    parts = [f"{m['throughput_samples_per_s']:.1f} samples/s", f"p50 {m['step_time_p50_s'] * 1000:.0f} ms",
             f"data-wait {m['data_wait_fraction']:.0%}"]
    if "host_ram_peak_pss_bytes" in m:
        parts.append(f"host PSS {m['host_ram_peak_pss_bytes'] / MiB:.0f} MiB")
    if "host_ram_peak_rss_bytes" in m:
        parts.append(f"RSS {m['host_ram_peak_rss_bytes'] / MiB:.0f} MiB")
    return f"  {label}: " + ", ".join(parts)


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
        label = RunConfig.from_dict(result.config).describe() + (f" #{result.repeat}" if result.repeat else "")
        m = result.metrics
        if result.status == FINISHED:
            table.add_row(label, result.status, _fmt(m, "throughput_samples_per_s", pattern="{:.1f}"),
                          _fmt(m, "step_time_p50_s", 1000), _fmt(m, "step_time_p99_s", 1000),
                          _fmt(m, "data_wait_fraction", pattern="{:.0%}"), _fmt(m, "device_peak_memory_bytes", 1 / MiB),
                          _fmt(m, "host_ram_peak_pss_bytes", 1 / MiB), _fmt(m, "host_ram_peak_rss_bytes", 1 / MiB))
        else:
            table.add_row(label, f"{result.status}: {result.reason}", *["-"] * 7)
    wide_console().print(table)


def print_scores_table(scores: Sequence[ConfigScore]) -> None:
    from rich.table import Table

    table = Table(title="scores over repeats")
    for column in ("configuration", "status", "repeats", "score samples/s", "CV", "dropped", "losses identical"):
        table.add_column(column)
    for score in scores:
        table.add_row(RunConfig.from_dict(score.config).describe(),
                      score.status if not score.reason else f"{score.status}: {score.reason}", str(score.repeats),
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
        table.add_row(c.subject, c.name, f"[{colours[c.verdict]}]{c.verdict}[/]", c.detail)
    wide_console().print(table)


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
        table.add_row(row.label + (" [busy host]" if row.contended else ""), runs,
                      _fmt(m, "throughput_samples_per_s", pattern="{:.1f}"), interval, f"{ratio:.2f}x",
                      _fmt(m, "eval_accuracy", pattern="{:.3f}"),
                      _fmt(m, "step_time_p50_s", 1000), _fmt(m, "data_wait_fraction", pattern="{:.0%}"),
                      _fmt(m, "device_peak_memory_bytes", 1 / MiB), _fmt(m, "host_ram_peak_pss_bytes", 1 / MiB),
                      _fmt(m, "host_ram_peak_rss_bytes", 1 / MiB))
    wide_console().print(table)
    if any(row.contended for row in rows):
        print("[busy host]: other processes used the cores (or the hypervisor stole them) while it was measured; "
              "its figures are not the machine's", file=sys.stderr)
    print("quality: eval_accuracy, the mean image<->text retrieval recall@1 over the held-out pairs")


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
