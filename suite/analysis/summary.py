"""One-line summaries of runs and of a matrix's time, as the terminal and MLflow descriptions show them."""

from __future__ import annotations

from typing import Sequence

from suite.analysis.host_ram_figures import HOST_RAM_FIGURES
from suite.analysis.timeline import TIMELINE
from suite.figures import DATA_WAIT_FRACTION, IN_WINDOW_S, STEP_TIME_P50_S, THROUGHPUT_SAMPLES_PER_S
from suite.meters.setup import metric_name
from suite.results.record import FINISHED, RunResult
from suite.text import visible

MiB = 2**20


def summary_line(result: RunResult) -> str:
    label = result.config.describe()
    if result.status != FINISHED:
        return f"  {label}: {result.status}: {visible(result.reason)}"
    if result.recorded_elsewhere:
        return f"  {label}: ran its share on this node; {result.facts.get('recorded_by')} recorded it"
    m = result.metrics
    parts = []  # what the run recorded of its headline figures
    if THROUGHPUT_SAMPLES_PER_S in m:
        parts.append(f"{m['throughput_samples_per_s']:.1f} samples/s")
    if STEP_TIME_P50_S in m:
        parts.append(f"p50 {m['step_time_p50_s'] * 1000:.0f} ms")
    if DATA_WAIT_FRACTION in m:
        parts.append(f"data-wait {m['data_wait_fraction']:.0%}")
    parts += [f"{label} {m[key] / MiB:.0f} MiB" for key, label in HOST_RAM_FIGURES if key in m]
    setup = setup_text(m)
    if setup:
        parts.append(setup)
    return f"  {label}: " + ", ".join(parts)


#: The set-up phases a summary line names (the largest first), out of suite.meters.setup.SETUP_PHASES.
#: Imports are left out: in a process started ahead of its turn they happen before the first-step latency starts.
_SUMMARY_PHASES = ("device", "dataset", "fingerprint", "tokenization", "model", "loader_start")


def setup_text(metrics: dict[str, float]) -> str:
    """"first step after 2.1 s (model 0.4, tokenization 0.2...)": the first-step latency and its largest phases."""
    if metric_name("first_step") not in metrics:
        return ""
    phases = sorted(((metrics[metric_name(p)], p) for p in _SUMMARY_PHASES if metric_name(p) in metrics), reverse=True)
    detail = ", ".join(f"{name} {seconds:.1f}" for seconds, name in phases[:3] if seconds >= 0.05)
    return f"first step after {metrics[metric_name('first_step')]:.1f} s" + (f" ({detail} s)" if detail else "")


def timing_line(results: Sequence[RunResult], timing: dict[str, float]) -> str:
    """Where the matrix's time went: the share in warm-up + measured windows, the median first-step latency and the
    parts outside the windows."""
    if not timing:
        return "time: not measured"
    line = (f"time: {timing['in_window_s']:.1f} s of the matrix's {timing['matrix_wall_s']:.1f} s in warm-up + "
            f"measured windows ({timing['in_window_fraction']:.0%})")
    outside = [f"{timing[key]:.1f} s {words}" for key, words in TIMELINE if key in timing and key != IN_WINDOW_S]
    if outside:
        line += f"; outside them: {', '.join(outside)}"
    firsts = sorted(r.metrics["setup_first_step_s"] for r in results if "setup_first_step_s" in r.metrics)
    if firsts:
        line += f"; first step after {firsts[len(firsts) // 2]:.1f} s (median over configurations)"
    if "setup_mlflow_s" in timing:
        line += f"; MLflow set-up {timing['setup_mlflow_s']:.1f} s"
    return line

