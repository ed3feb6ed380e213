"""The report as sections (text, tables, charts), rendered to one self-contained HTML file and a Markdown twin.

:func:`sections` decides what is said; :func:`to_html` and :func:`to_markdown` only format it, so both files say
the same. The HTML embeds its charts as SVG data URIs and fetches nothing; the Markdown points to PNG files
written beside it.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Sequence

from suite.analysis import memory_trend
from suite.analysis.bottleneck import CORE_BOUND, INPUT_BOUND, explanations
from suite.analysis.compare import THROUGHPUT, Row
from suite.analysis.host_ram_figures import HOST_RAM_FIGURES, HOST_RAM_NOTE
from suite.analysis.published import Alignment
from suite.config import ENGINE_NOTES, param_text
from suite.config.labels import LABEL_AXES
from suite.figures import (
    DATA_WAIT_FRACTION,
    DEVICE_DECODE_FALLBACKS,
    DEVICE_PEAK_MEMORY_BYTES,
    EVAL_SAMPLES,
    HOST_DEVICE_MEMORY_NOTE,
    STEP_TIME_P50_S,
    STEP_TIME_P99_S,
    THROUGHPUT_CI95_HIGH,
    THROUGHPUT_CI95_LOW,
)
from suite.report.charts import Bar, Chart, grouped_bars, memory_bars
from suite.report.content import ReportContent, baseline_text
from suite.text import html_text, markdown_fence, markdown_literal, visible

MiB = 2**20


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    row_ids: list[str] = field(default_factory=list)  # a data attribute per HTML row (the configuration id)


@dataclass
class Section:
    heading: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    code: str | None = None


def _group(row: Row, rows: Sequence[Row]) -> str:
    """A row's bar group: its device, plus every other named axis (:data:`suite.config.labels.LABEL_AXES`) that
    varies in the report but the chart's own (workers, loader) and the seed."""
    parts = [row.config.device]
    for name, attribute in LABEL_AXES:
        if name in ("device", "workers", "loader", "seed"):
            continue
        if len({getattr(r.config, attribute) for r in rows}) > 1:
            parts.append(f"{name}={param_text(getattr(row.config, attribute))}")
    return " ".join(parts)


def _mib(metrics: dict[str, float], key: str) -> str:
    return f"{metrics[key] / MiB:.0f}" if key in metrics else "-"


def results_table(content: ReportContent) -> Table:
    table = Table(["device", "loader", "workers", "precision", "engine", "samples/s", "95% interval",
                   f"speed-up vs {baseline_text(content.rows[0].config.workload)}", "step p50 ms", "step p99 ms",
                   "data-wait",
                   *(f"{label} MiB" for _, label in HOST_RAM_FIGURES), "device peak MiB", "memory trend",
                   "eval_accuracy", "runs", "host"], [])
    for row in content.rows:
        m, c = row.metrics, row.config
        speedup = content.speedups.get(row.config_id)
        interval = (f"{m['throughput_ci95_low']:.1f} - {m['throughput_ci95_high']:.1f}"
                    if THROUGHPUT_CI95_LOW in m and THROUGHPUT_CI95_HIGH in m else "-")
        device_memory = _mib(m, DEVICE_PEAK_MEMORY_BYTES)
        if row.device_memory_is_host and device_memory != "-":
            device_memory += " (host)"
        extra = [f"prefetch={c.prefetch_factor}"] if c.prefetch_factor is not None else []
        extra += [f"nproc={c.nproc_per_node}"] if c.nproc_per_node > 1 else []
        extra += [f"nodes={c.nnodes}"] if c.nnodes > 1 else []
        table.rows.append([
            c.device, c.loader, str(c.num_workers), c.precision, " ".join([c.engine, *extra]),
            f"{m[THROUGHPUT]:.1f}", interval, "-" if speedup is None else f"{speedup:.2f}x",
            f"{m['step_time_p50_s'] * 1000:.0f}" if STEP_TIME_P50_S in m else "-",
            f"{m['step_time_p99_s'] * 1000:.0f}" if STEP_TIME_P99_S in m else "-",
            f"{m['data_wait_fraction']:.0%}" if DATA_WAIT_FRACTION in m else "-",
            *(_mib(m, key) for key, _ in HOST_RAM_FIGURES), device_memory,
            memory_trend.describe(row.memory_trend, m),
            f"{m['eval_accuracy']:.3f}" if "eval_accuracy" in m else "-",
            str(row.runs) + (f" (+{row.unfinished_runs} unfinished)" if row.unfinished_runs else ""),
            "BUSY" if row.contended else "quiet"])
        table.row_ids.append(row.config_id)
    return table


def published_tables(alignment: Alignment) -> tuple[Table, Table]:
    """Absolute samples/s per (loader, workers) and the ratios per kind, a column per published and measured
    series, the reason beside each missing ratio (also what ``suite compare --reference`` prints)."""
    pub, mea = alignment.published_series, alignment.measured_series
    absolute = Table(["loader", "workers", *[f"{s.label} (published)" for s in pub],
                      *[f"{s.label} (measured)" for s in mea]], [])
    for (loader, workers), values in alignment.absolute.items():
        absolute.rows.append([loader, str(workers), *[f"{values[s]:.1f}" if s in values else "-" for s in pub],
                              *[f"{values[s]:.1f}" if s in values else "-" for s in mea]])
    ratios = Table(["ratio", *[f"{s.label} (published)" for s in pub], *[f"{s.label} (measured)" for s in mea],
                    "why a figure is missing"], [])
    for ratio in alignment.ratios:
        cells = [f"{ratio.published[s]:.2f}x" if s in ratio.published else "-" for s in pub]
        cells += [f"{ratio.measured[s]:.2f}x" if s in ratio.measured else "-" for s in mea]
        why = []
        for side, series_list in (("published", pub), ("measured", mea)):
            by_reason: dict[str, list[str]] = {}
            for series in series_list:
                if series in ratio.why:
                    by_reason.setdefault(ratio.why[series], []).append(series.label)
            for reason, labels in by_reason.items():
                who = side if len(labels) == len(series_list) else f"{side} {', '.join(labels)}"
                why.append(f"{who}: {reason}")
        ratios.rows.append([ratio.kind.label, *cells, "; ".join(why) or "-"])
    return absolute, ratios


def _published_sections(content: ReportContent) -> list[Section]:
    if content.alignment_error:
        return [Section("Published figures", [f"Not lined up: {content.alignment_error}"])]
    alignment = content.alignment
    if alignment is None:
        return []
    intro = [f"{content.reference_title} ({content.reference_url}): {content.reference_shape}. "
             f"{measured_shape(content.rows)} Absolute samples/s compare only where the device and the shape match; "
             "ratios (workers N vs 0, on-device decode vs the CPU loader) compare across machines."]
    absolute, ratios = published_tables(alignment)
    bars = [Bar(s.device, loader, workers, values[s]) for (loader, workers), values in alignment.absolute.items()
            for s in alignment.published_series if s in values]
    chart = grouped_bars("published", "Published throughput (samples/s, 8 devices)", bars, "samples/s")
    return [Section("Published figures beside the measured ones", intro, [absolute], [chart]),
            Section("Ratios: published and measured on the same row", [
                "Each row compares two settings on one device; '-' is a figure that side did not run (the last "
                "column says which run is missing)."], [ratios])]


def sections(content: ReportContent) -> list[Section]:
    """What the report says, in order; see the module docstring."""
    rows = content.rows
    summary = [content.headline(), f"Source: {content.source}. Matrix status: {content.status}"
               + (f" ({content.reason})" if content.reason else "") + f". Generated {content.generated_at}."]
    if content.contended:
        summary.append("Warning: the host was busy with other work while measuring "
                       + ", ".join(r.label for r in content.contended)
                       + ": those figures are not the machine's (marked BUSY and hatched).")
    summary.append(HOST_RAM_NOTE[0].upper() + HOST_RAM_NOTE[1:] + ".")
    if any(r.device_memory_is_host for r in rows):
        summary.append(HOST_DEVICE_MEMORY_NOTE[0].upper() + HOST_DEVICE_MEMORY_NOTE[1:] + ".")
    for engine in sorted({r.config.engine for r in rows} & set(ENGINE_NOTES)):
        summary.append(ENGINE_NOTES[engine] + ".")
    if content.dataset_warning:
        summary.append("Warning: " + content.dataset_warning + ".")
    fallbacks = [r for r in rows if r.metrics.get(DEVICE_DECODE_FALLBACKS, 0) > 0]
    if fallbacks:
        summary.append("Images decoded on the host, not the device (formats or pixels the device's decoder does not "
                       "decode as the reference does; each run's facts list the reasons): "
                       + ", ".join(f"{r.label}: {r.metrics['device_decode_fallbacks']:.0f} per run" for r in fallbacks)
                       + ".")
    bars = [Bar(_group(r, rows), r.config.loader, r.config.num_workers, r.metrics[THROUGHPUT],
                r.metrics.get(THROUGHPUT_CI95_LOW), r.metrics.get(THROUGHPUT_CI95_HIGH), r.contended)
            for r in rows]
    throughput = grouped_bars("throughput", "Training throughput (samples/s, measured steps; 95 % interval)",
                              bars, "samples/s")
    out = [Section("Summary", summary),
           Section("Throughput by device, loader workers and loader",
                   [f"Speed-up: over {baseline_text(rows[0].config.workload)} and every other axis equal (the "
                    "workload's baseline, as its published benchmark measured). " + measured_shape(rows),
                    *chance_note(rows)],
                   [results_table(content)], [throughput]),
           *_bounded_section(rows),
           Section("Memory", [], [], [memory_bars(rows, lambda r: _group(r, rows))])]
    if content.unfinished:
        out.append(Section("Configurations that did not finish", list(content.unfinished)))
    out += _published_sections(content)
    if content.audit:
        verdicts = Table(["subject", "check", "verdict", "detail"],
                         [[a.subject, a.name, a.verdict, a.detail] for a in content.audit])
        counts = {v: sum(a.verdict == v for a in content.audit) for v in ("FAIL", "INCONCLUSIVE", "PASS")}
        verdict = "FAIL" if counts["FAIL"] else "INCONCLUSIVE" if counts["INCONCLUSIVE"] else "PASS"
        out.append(Section("Audit", [f"Verdict {verdict}: {counts['FAIL']} check(s) failed, {counts['INCONCLUSIVE']} "
                                     f"inconclusive, {counts['PASS']} passed; each with its numbers below."],
                           [verdicts]))
    provenance = Table(["", ""], [[k, str(v)] for k, v in content.provenance.items()]
                       + [[f"version {k}", v] for k, v in content.versions.items()])
    out.append(Section("Provenance", ["To reproduce (same commit and versions):"], [provenance],
                       code=content.command))
    return out


def measured_shape(rows: Sequence[Row]) -> str:
    """What was measured, said beside any published shape (8 devices, batch 48): preset, batch per device,
    devices per configuration."""
    presets = ", ".join(sorted({r.config.preset for r in rows}))
    batches = ", ".join(sorted({str(r.config.batch_size) for r in rows}))
    devices = ", ".join(sorted({str(r.config.nproc_per_node * r.config.nnodes) for r in rows}))
    return f"Measured here: preset {presets}, batch {batches} per device, {devices} device(s) per configuration."


def chance_note(rows: Sequence[Row]) -> list[str]:
    """Where every eval_accuracy is within twice the chance level (1/N for N held-out pairs), a sentence saying
    so: a throughput run of a few steps trains nothing, and its quality figure is not a result."""
    pairs = [r.metrics.get(EVAL_SAMPLES) for r in rows if "eval_accuracy" in r.metrics]
    if not pairs or not all(pairs):
        return []
    chance = 1.0 / min(p for p in pairs if p)
    if any(r.metrics["eval_accuracy"] > 2 * chance for r in rows if "eval_accuracy" in r.metrics):
        return []
    return [f"eval_accuracy is at chance level (1/N = {chance:.3f} for N held-out pairs) on every row: a throughput "
            "run of a few steps trains nothing; a quality result needs --target-quality (time-to-train)."]


def _bounded_section(rows: Sequence[Row]) -> list[Section]:
    """One sentence per configuration on what bounded it (:mod:`suite.analysis.bottleneck`), where the runs
    recorded where the cores went."""
    said = [f"{row.label}: {text}" for row, text in zip(rows, explanations([(r.config, r.metrics) for r in rows]),
                                                         strict=True) if text]
    if not said:
        return []
    rule = (f"Mean cores used in each configuration's measured window by the training process, its loader workers and "
            f"everything else, out of the cores it could run on. Input-bound: it waited for batches more than "
            f"{INPUT_BOUND:.0%} of the time; core-bound: more than {CORE_BOUND:.0%} of the cores were busy; the step's "
            "compute is compared with the same configuration at workers=0.")
    return [Section("What bounded each configuration", [rule, *said])]


# --- HTML ---------------------------------------------------------------------------------------------
_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1400px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f2f2f2; } td:first-child, th:first-child { text-align: left; }
tr.busy td { background: #fff1e6; }
img.chart { max-width: 100%; display: block; margin: 0.8em 0; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
p.warning { color: #a33; }
"""


def _html_table(table: Table) -> str:
    head = "".join(f"<th>{html_text(h)}</th>" for h in table.headers)
    body = []
    for index, cells in enumerate(table.rows):
        attrs = ""
        if index < len(table.row_ids):
            attrs = f' data-config-id="{html_text(table.row_ids[index])}"'
            if cells and cells[-1] == "BUSY":
                attrs += ' class="busy"'
        body.append(f"<tr{attrs}>" + "".join(f"<td>{html_text(c)}</td>" for c in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def to_html(content: ReportContent, parts: Sequence[Section]) -> str:
    """One self-contained page: CSS inline, charts as SVG data URIs, no script, nothing fetched."""
    body = [f"<h1>{html_text(content.title)}</h1>"]
    for section in parts:
        body.append(f"<h2>{html_text(section.heading)}</h2>")
        for text in section.paragraphs:
            css = ' class="warning"' if text.startswith("Warning:") else ""
            body.append(f"<p{css}>{html_text(text)}</p>")
        for chart in section.charts:
            data = base64.b64encode(chart.svg.encode()).decode()
            body.append(f'<img class="chart" alt="{html_text(chart.title)}" data-chart="{chart.name}" '
                        f'src="data:image/svg+xml;base64,{data}">')
        body += [_html_table(t) for t in section.tables]
        if section.code:
            body.append(f"<pre>{html_text(section.code, keep_newlines=True)}</pre>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html_text(content.title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


# --- Markdown -----------------------------------------------------------------------------------------
def to_markdown(content: ReportContent, parts: Sequence[Section], image_prefix: str = "") -> str:
    """The same sections in Markdown; charts as links to ``<image_prefix><chart>.png``. Every text is literal
    (:func:`suite.text.markdown_literal`): file names, paths and reasons from the data cannot become markup or HTML
    in a reader's Markdown renderer; the command sits in a code block no text can close."""
    lines = [f"# {markdown_literal(content.title)}", ""]
    for section in parts:
        lines += [f"## {markdown_literal(section.heading)}", ""]
        for text in section.paragraphs:
            lines += [markdown_literal(text), ""]
        for chart in section.charts:
            lines += [f"![{markdown_literal(chart.title)}]({image_prefix}{chart.name}.png)", ""]
        for table in section.tables:
            lines += [markdown_table(table), ""]
        if section.code:
            fence = markdown_fence(section.code)
            lines += [f"{fence}bash", visible(section.code, keep_newlines=True), fence, ""]
    return "\n".join(lines)


def markdown_table(table: Table) -> str:
    lines = ["| " + " | ".join(markdown_literal(h) for h in table.headers) + " |",
             "|" + "|".join("---" for _ in table.headers) + "|"]
    lines += ["| " + " | ".join(markdown_literal(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)
