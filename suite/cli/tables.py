"""Tables the CLI prints: results, scores, audit checks, comparisons and tuning sweeps (rich, as wide as the data)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Sequence

from suite.analysis import memory_trend
from suite.analysis.bottleneck import explanations
from suite.analysis.host_ram_figures import HOST_RAM_FIGURES, HOST_RAM_NOTE
from suite.analysis.scoring import ConfigScore
from suite.cli.display import MiB, narrow, say, wide_console, wrapped
from suite.config import ENGINE_NOTES
from suite.figures import (
    DATA_WAIT_FRACTION,
    DEVICE_PEAK_MEMORY_BYTES,
    HOST_DEVICE_MEMORY_NOTE,
    STEP_TIME_P50_S,
    STEP_TIME_P99_S,
    THROUGHPUT_CI95_HIGH,
    THROUGHPUT_CI95_LOW,
    THROUGHPUT_SAMPLES_PER_S,
    device_memory_is_host,
)
from suite.meters.contention import interference
from suite.results.record import FINISHED, RunResult
from suite.text import visible

if TYPE_CHECKING:
    from suite.analysis.tune import TuneOutcome


def _plain(text: str) -> Any:
    """A table cell shown as it is: reasons and labels may hold brackets (gloo's "[.../pair.cc:553]") that rich
    would read as markup."""
    from rich.text import Text

    return Text(visible(text))


def _fmt(metrics: dict[str, float], key: str, scale: float = 1.0, pattern: str = "{:.0f}") -> str:
    return pattern.format(metrics[key] * scale) if key in metrics else "-"


#: one column for the host RAM figures, in :data:`HOST_RAM_FIGURES`' order ("host MiB anon/PSS/RSS": the tables
#: stay as wide as they were with two of them)
_HOST_RAM_COLUMN = "host MiB " + "/".join(label.removeprefix("host ") for _, label in HOST_RAM_FIGURES)


def _host_ram_cells(metrics: dict[str, float]) -> list[str]:
    return [_fmt(metrics, key, 1 / MiB) for key, _ in HOST_RAM_FIGURES]


def _host_ram_cell(metrics: dict[str, float]) -> str:
    return "/".join(_host_ram_cells(metrics))


def print_results_table(results: Sequence[RunResult]) -> None:
    """One row per run: the headline metrics, or the failure reason."""
    from rich.table import Table

    if narrow():
        _print_results_blocks(results)
        return
    table = Table(title="results")
    table.add_column("configuration", no_wrap=True)
    table.add_column("status", overflow="fold", max_width=60)
    for column in ("samples/s", "p50 ms", "p99 ms", "data-wait", "device peak MiB", _HOST_RAM_COLUMN, "memory"):
        table.add_column(column, justify="right")
    for result in results:
        label = result.config.describe() + (f" #{result.repeat}" if result.repeat else "")
        m = result.metrics
        if result.status == FINISHED:
            table.add_row(_plain(label), result.status, _fmt(m, THROUGHPUT_SAMPLES_PER_S, pattern="{:.1f}"),
                          _fmt(m, STEP_TIME_P50_S, 1000), _fmt(m, STEP_TIME_P99_S, 1000),
                          _fmt(m, DATA_WAIT_FRACTION, pattern="{:.0%}"), _fmt(m, DEVICE_PEAK_MEMORY_BYTES, 1 / MiB),
                          _host_ram_cell(m), memory_trend.describe(memory_trend.recorded_verdict(result.facts), m))
        else:
            table.add_row(_plain(label), _plain(f"{result.status}: {result.reason}"), *["-"] * 7)
    wide_console().print(table)
    _print_results_notes(results)


def _print_results_blocks(results: Sequence[RunResult]) -> None:
    """The results table for a narrow terminal: per run, its configuration, then its figures, wrapped."""
    say("results")
    for result in results:
        label = visible(result.config.describe()) + (f" #{result.repeat}" if result.repeat else "")
        m = result.metrics
        if result.status != FINISHED:
            say(f"  {label}: {result.status}: {visible(result.reason)}")
            continue
        say(f"  {label}:\n    {_fmt(m, 'throughput_samples_per_s', pattern='{:.1f}')} samples/s, "
            f"p50 {_fmt(m, 'step_time_p50_s', 1000)} ms, p99 {_fmt(m, 'step_time_p99_s', 1000)} ms, "
            f"data-wait {_fmt(m, 'data_wait_fraction', pattern='{:.0%}')}, device peak "
            f"{_fmt(m, 'device_peak_memory_bytes', 1 / MiB)} MiB, "
            + "".join(f"{label} {cell} MiB, " for (_, label), cell in zip(HOST_RAM_FIGURES, _host_ram_cells(m)))
            + f"memory {memory_trend.describe(memory_trend.recorded_verdict(result.facts), m)}")
    _print_results_notes(results)


def _print_results_notes(results: Sequence[RunResult]) -> None:
    if any(r.status == FINISHED for r in results):
        say(HOST_RAM_NOTE)
    if any(device_memory_is_host(r.facts) for r in results):
        say(HOST_DEVICE_MEMORY_NOTE)
    for engine in sorted({r.config.engine for r in results} & set(ENGINE_NOTES)):
        say(ENGINE_NOTES[engine])
    finished = [r for r in results if r.status == FINISHED]
    said = [(r, text) for r, text in zip(finished, explanations([(r.config, r.metrics) for r in finished]),
                                         strict=True) if text]
    if said:
        say("what bounded each configuration (cores used in its measured window):")
        for result, text in said:
            print(wrapped(f"{visible(result.config.describe())}: {text}", indent="  "))
    busy = [r for r in results if r.status == FINISHED and (r.facts.get("contention") or {}).get("contended")]
    if busy:
        shares = ", ".join(f"{_plain(r.config.describe())} ({_interference(r.facts['contention'])})" for r in busy)
        say(f"suite: warning: measured while the machine was not the configuration's alone: {visible(shares)}. "
            "Those figures are not the machine's, and an audit gives them no verdict: measure again on a quiet "
            "machine, or with --repeats N to see the spread.", file=sys.stderr)


def _interference(contention: dict[str, Any]) -> str:
    """What the recorded contention says took the machine (``facts.contention``)."""
    return interference(contention.get("others_share", 0.0), contention.get("steal_share", 0.0),
                        contention.get("paused_share", 0.0)) or "contended"


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


#: Checks shown one per line before the terminal's table keeps only those that are not PASS (audit.json has all).
CHECKS_SHOWN = 60


def print_checks(report: Any) -> None:
    """The audit's checks as a table, then its verdict and counts. Past :data:`CHECKS_SHOWN` checks (a matrix of
    thousands of runs), the PASS ones are counted per check instead of listed, and at most that many others are
    listed: the terminal gets a bounded table, ``audit.json`` every check."""
    from rich.table import Table

    colours = {"PASS": "green", "FAIL": "red", "INCONCLUSIVE": "magenta", "WARN": "yellow", "SKIP": "dim"}
    table = Table(title=f"audit of {report.target}")
    for column in ("subject", "check", "verdict", "detail"):
        table.add_column(column, overflow="fold")
    checks = report.checks
    if len(checks) > CHECKS_SHOWN:
        passed: dict[str, int] = {}
        for c in checks:
            if c.verdict == "PASS":
                passed[c.name] = passed.get(c.name, 0) + 1
        others = [c for c in checks if c.verdict != "PASS"]
        for name, count in passed.items():
            table.add_row(f"{count} subjects", _plain(name), f"[{colours['PASS']}]PASS[/]",
                          "each as listed in audit.json")
        checks = others[:CHECKS_SHOWN]
        if len(others) > CHECKS_SHOWN:
            table.caption = f"and {len(others) - CHECKS_SHOWN} more checks that did not pass: see audit.json"
    for c in checks:
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
                   "device peak MiB", _HOST_RAM_COLUMN, "memory"):
        table.add_column(column, justify="right")
    for row, ratio in zip(rows, ratios, strict=True):
        m = row.metrics
        runs = str(row.runs) + (f" (+{row.unfinished_runs} unfinished)" if row.unfinished_runs else "")
        interval = (f"{m['throughput_ci95_low']:.1f}-{m['throughput_ci95_high']:.1f}"
                    if THROUGHPUT_CI95_LOW in m and THROUGHPUT_CI95_HIGH in m else "-")
        table.add_row(_plain(row.label + (" [busy host]" if row.contended else "")), runs,
                      _fmt(m, THROUGHPUT_SAMPLES_PER_S, pattern="{:.1f}"), interval, f"{ratio:.2f}x",
                      _fmt(m, "eval_accuracy", pattern="{:.3f}"),
                      _fmt(m, STEP_TIME_P50_S, 1000), _fmt(m, DATA_WAIT_FRACTION, pattern="{:.0%}"),
                      _fmt(m, DEVICE_PEAK_MEMORY_BYTES, 1 / MiB), _host_ram_cell(m),
                      memory_trend.describe(row.memory_trend, m))
    wide_console().print(table)
    print(HOST_RAM_NOTE)
    if any(row.device_memory_is_host for row in rows):
        print(HOST_DEVICE_MEMORY_NOTE)
    for engine in sorted({row.config.engine for row in rows} & set(ENGINE_NOTES)):
        print(ENGINE_NOTES[engine])
    if any(row.contended for row in rows):
        print("[busy host]: other processes used the cores (or the hypervisor stole them) while it was measured; "
              "its figures are not the machine's", file=sys.stderr)
    print("quality: eval_accuracy, the mean image<->text retrieval recall@1 over the held-out pairs")


def print_tune_table(outcome: TuneOutcome) -> None:
    """Every point of a tune sweep with its spread (95 % interval, as ± % of its throughput) and busy-host flag."""
    from rich.table import Table

    table = Table(title="suite tune: every setting, with its spread")
    for column in ("setting", "status", "samples/s", "95% interval", "spread", "data-wait", "host anon MiB",
                   "host", "vs best (equivalence)", "pick"):
        table.add_column(column, justify="left" if column in ("setting", "status", "pick", "vs best (equivalence)")
                         else "right")
    for point in outcome.points:
        finished = point.status == FINISHED and point.throughput_samples_per_s is not None
        low, high, rate = point.ci_low, point.ci_high, point.throughput_samples_per_s
        interval = (low, high, rate) if finished and low is not None and high is not None and rate else None
        pick = ", ".join(name for name, chosen in (("best", point is outcome.best),
                                                   ("recommended", point is outcome.recommended)) if chosen)
        table.add_row(
            point.label, _plain(point.status if finished else f"{point.status}: {point.reason}"),
            f"{point.throughput_samples_per_s:.1f}" if finished else "-",
            f"{interval[0]:.1f}-{interval[1]:.1f}" if interval else "-",
            f"±{(interval[1] - interval[0]) / 2 / interval[2]:.0%}" if interval else "-",
            f"{point.data_wait_fraction:.0%}" if finished and point.data_wait_fraction is not None else "-",
            f"{point.host_ram_peak_pss_anon_bytes / MiB:.0f}" if finished and point.host_ram_peak_pss_anon_bytes
            else "-",
            "BUSY" if point.contended else "quiet", _plain(point.vs_best or "-"), pick)
    wide_console().print(table)
