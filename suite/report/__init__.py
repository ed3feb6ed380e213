"""``suite report``: a matrix as the workload's published benchmark showed its own, for the user's hardware, in one
shareable page.

:mod:`.content` gathers what is said (from a results folder or an MLflow matrix run), :mod:`.charts` draws it,
:mod:`.render` formats it as a self-contained HTML file and a Markdown twin, :mod:`.browser` renders the page in
headless Chromium (screenshots, tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from suite.analysis.compare import THROUGHPUT
from suite.errors import SuiteError
from suite.fileio import write_bytes_atomic, write_text_atomic
from suite.report.content import ReportContent
from suite.text import markdown_literal

HTML_NAME = "report.html"
MARKDOWN_NAME = "report.md"


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    markdown: Path
    images: list[Path]


def write_report(content: ReportContent, folder: Path) -> ReportFiles:
    """Write report.html, report.md and the Markdown's PNG charts (``report-<chart>.png``) into ``folder``, each made
    new and renamed into place (a link in the folder is replaced, never written through)."""
    from suite.report.render import sections, to_html, to_markdown

    if folder.exists() and not folder.is_dir():
        raise SuiteError(f"--output {folder} is a file, not a folder")
    parts = sections(content)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        images = []
        for chart in (c for s in parts for c in s.charts):
            image = folder / f"report-{chart.name}.png"
            write_bytes_atomic(image, chart.png)
            images.append(image)
        html_file, markdown_file = folder / HTML_NAME, folder / MARKDOWN_NAME
        write_text_atomic(html_file, to_html(content, parts))
        write_text_atomic(markdown_file, to_markdown(content, parts, image_prefix="report-"))
    except OSError as exc:
        raise SuiteError(f"cannot write the report into {folder}: {exc.strerror or exc}") from None
    return ReportFiles(html_file, markdown_file, images)


def mlflow_summary(content: ReportContent) -> tuple[dict[str, float], str, dict[str, str]]:
    """What a matrix's MLflow run shows a reader: summary metrics (best throughput, configurations measured, the
    best's speed-up over its workload's baseline), a Markdown description with the results table, and
    tags naming the best configuration."""
    from suite.report.render import markdown_table, results_table

    best = content.best
    metrics = {"summary/best_throughput_samples_per_s": best.metrics[THROUGHPUT],
               "summary/configurations_measured": float(len(content.rows))}
    speedup = content.speedups.get(best.config_id)
    if speedup is not None:
        metrics["summary/speedup_best_over_baseline"] = speedup
    lines = [markdown_literal(content.headline()), ""]
    if content.contended:
        busy = ", ".join(r.label for r in content.contended)
        lines += ["**Busy host** while measuring: " + markdown_literal(busy), ""]
    lines += [markdown_table(results_table(content)), "",
              "Full report (charts, published figures, provenance): artifact `report/report.html`."]
    tags = {"suite.best_config_id": best.config_id, "suite.best_configuration": best.label}
    return metrics, "\n".join(lines), tags
