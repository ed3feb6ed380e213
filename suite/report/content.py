"""What a report says, gathered once from a results folder or an MLflow matrix run.

:class:`ReportContent` holds the rows (one per configuration id, as ``suite compare``), the speed-ups a published
benchmark shows (each row over its workload's baseline, by default workers 0 with the CPU loader, of its own device,
precision and engine), the published figures
lined up with the measured ones (:func:`suite.analysis.published.align`), audit verdicts when there are any,
and provenance (commit, versions, fingerprints, the command to reproduce). The renderers
(:mod:`suite.report.render`) only format it.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from suite.analysis.compare import THROUGHPUT, Row, nothing_comparable, rows_from_results
from suite.analysis.published import (
    Alignment,
    align,
    load_reference,
    measured_table,
    reference_table,
    refuse_other_workload,
)
from suite.config.run import describe_fields
from suite.errors import SuiteError
from suite.figures import THROUGHPUT_CI95_HIGH, THROUGHPUT_CI95_LOW
from suite.redact import redact_argv
from suite.results.files import AUDIT_FILE, read_audit_checks
from suite.results.record import FINISHED, RunResult, dataset_warning, differing_datasets
from suite.results.store import ResultsStore
from suite.tracking.reading import matrix_run_view
from suite.workload import workload_class_or_base

if TYPE_CHECKING:
    from suite.tracking.mlflow_gateway import MlflowGateway

#: Manifest fields shown as provenance, in this order.
FINGERPRINTS = ("dataset_fingerprint", "tokenizer_sha256", "initial_weights_sha256")


@dataclass(frozen=True)
class AuditCheck:
    subject: str
    name: str
    verdict: str
    detail: str


@dataclass
class ReportContent:
    """Everything a report shows; see the module docstring."""

    title: str
    source: str  # the results folder or "MLflow run <id> at <uri>"
    rows: list[Row]
    speedups: dict[str, float | None]  # config_id -> over workers 0, CPU loader, same device/precision/engine
    status: str
    reason: str | None
    command: str
    provenance: dict[str, str]
    versions: dict[str, str]
    reference_title: str | None = None
    reference_url: str | None = None
    reference_shape: str | None = None
    alignment: Alignment | None = None
    alignment_error: str | None = None
    audit: list[AuditCheck] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)  # "label: STATUS: reason"
    dataset_warning: str = ""  # the runs did not all read the same data (records.results.dataset_warning)
    results: list[RunResult] = field(default_factory=list)  # the runs of a results folder (none from MLflow)
    generated_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S %Z"))

    @property
    def best(self) -> Row:
        return max(self.rows, key=lambda r: r.metrics[THROUGHPUT])

    @property
    def contended(self) -> list[Row]:
        return [r for r in self.rows if r.contended]

    def headline(self) -> str:
        """One sentence: the best configuration, and its speed-up over its own baseline, stated as a speed-up only
        when their 95 % intervals separate (else: no significant difference)."""
        best = self.best
        text = f"Best: {best.label} at {best.metrics[THROUGHPUT]:.1f} samples/s"
        speedup = self.speedups.get(best.config_id)
        base = baseline_of(best, self.rows)
        if speedup is None or base is None or base is best:
            return text + "."
        baseline = baseline_text(best.config.workload)
        if intervals_separate(best, base):
            return text + f", {speedup:.2f}x over {baseline} on the same device (95 % intervals apart)."
        return text + (f"; no significant difference from {baseline} on the same device ({speedup:.2f}x, "
                       "but their 95 % intervals overlap or were not recorded).")


def baseline_of(row: Row, rows: Sequence[Row]) -> Row | None:
    """The row of ``row``'s workload's speed-up baseline (:attr:`suite.workload.Workload.speedup_baseline`: its
    published benchmark's, no loader workers with the CPU loader) with otherwise ``row``'s axes (device, precision,
    engine, processes, batch...); ``None`` where it was not run."""
    import dataclasses

    base_config = dataclasses.replace(row.config, **workload_class_or_base(row.config.workload).speedup_baseline)
    return next((r for r in rows if r.config_id == base_config.config_id), None)


def baseline_text(workload: str) -> str:
    """The workload's speed-up baseline as a configuration is described (``workers=0 loader=cpu``)."""
    return describe_fields(workload_class_or_base(workload).speedup_baseline)


def intervals_separate(faster: Row, slower: Row) -> bool:
    """Whether ``faster``'s 95 % throughput interval lies wholly above ``slower``'s (both recorded)."""
    low, high = faster.metrics.get(THROUGHPUT_CI95_LOW), slower.metrics.get(THROUGHPUT_CI95_HIGH)
    return low is not None and high is not None and low > high


def baseline_speedups(rows: Sequence[Row]) -> dict[str, float | None]:
    """Each row's throughput over its :func:`baseline_of` row, as a published benchmark's table; ``None`` where that
    row was not run."""
    out: dict[str, float | None] = {}
    for row in rows:
        base = baseline_of(row, rows)
        out[row.config_id] = row.metrics[THROUGHPUT] / base.metrics[THROUGHPUT] if base else None
    return out


def _alignment(rows: Sequence[Row], reference: str | None, content: ReportContent) -> None:
    """The published figures beside the measured ones: ``reference`` names them, ``None`` takes the workload's own
    (:attr:`suite.workload.Workload.published_reference`), ``""`` none. Figures published for another workload are
    never set beside these rows."""
    workload = rows[0].config.workload
    if reference is None:
        reference = workload_class_or_base(workload).published_reference
    if not reference:
        return
    path, data = load_reference(reference)
    try:
        refuse_other_workload(path, data, {r.config.workload for r in rows})
    except SuiteError as exc:
        content.alignment_error = str(exc)
        return
    content.reference_title = data.get("title", path.stem)
    content.reference_url = (data.get("source") or {}).get("url")
    shape = data.get("workload") or {}
    content.reference_shape = (f"{shape.get('model', '?')}, {shape.get('devices', '?')} devices, batch "
                               f"{shape.get('per_device_batch_size', '?')} per device, "
                               f"{data['suite_config'].get('precision')} {data['suite_config'].get('engine')}")
    try:
        content.alignment = align(reference_table(data), measured_table(rows))
    except SuiteError as exc:  # two measured rows on one cell: say so instead of picking one
        content.alignment_error = str(exc)


def from_folder(folder: Path, reference: str | None, audits: Sequence[Path] = ()) -> ReportContent:
    """The report of a results folder (``suite run``, ``suite tune`` or ``suite audit`` output)."""

    store = ResultsStore(folder)
    matrix = store.matrix()
    results = store.results()
    rows = rows_from_results(results)
    if not rows:
        raise nothing_comparable(results, folder, "report")
    fingerprints: dict[str, str] = {}
    for result in results:
        manifest = store.manifest_of(result) or {}
        for key in FINGERPRINTS:
            if manifest.get(key) and key not in fingerprints:
                fingerprints[key] = fingerprint_text(manifest[key])
    content = _content(rows, str(folder), matrix.status, matrix.reason, matrix.command, matrix.tags, fingerprints,
                       reference)
    content.unfinished = [f"{r.config.describe()}: {r.status}: {r.reason}" for r in results
                          if r.status != FINISHED]
    content.results = results
    content.dataset_warning = dataset_warning(differing_datasets(results))
    for audit in [*audits, *([folder / AUDIT_FILE] if (folder / AUDIT_FILE).is_file() else [])]:
        content.audit += read_audit(audit)
    return content


def read_audit(path: Path) -> list[AuditCheck]:
    """The checks of ``suite audit``'s audit.json (or of the folder holding it)."""
    return [AuditCheck(*check) for check in read_audit_checks(path)]


def fingerprint_text(value: Any) -> str:
    """A fingerprint as people read it: a digest as it is; a dataset's (a mapping: its method and digest or its
    hub id and revision) as ``key value`` pairs, not a Python dict."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items() if v not in (None, ""))
    return str(value)


def from_mlflow(gateway: MlflowGateway, run_id: str, reference: str | None) -> ReportContent:
    """The report of an MLflow matrix run (its configuration runs, its tags, the audits linked to it)."""
    view = matrix_run_view(gateway, run_id)
    if not view.rows:
        raise SuiteError(f"no configuration of MLflow run {run_id} finished: nothing to report")
    fingerprints = {k: fingerprint_text(view.manifest[k]) for k in FINGERPRINTS if view.manifest.get(k)}
    content = _content(view.rows, f"MLflow run {run_id} at {gateway.tracking_uri}", view.status, view.reason,
                       shlex.split(view.command) or ["suite", "run"], view.tags, fingerprints, reference)
    content.audit.extend(AuditCheck(*check) for check in view.audit_checks)
    return content


def _content(rows: list[Row], source: str, status: str, reason: str | None, command: Sequence[str],
             tags: dict[str, str], fingerprints: dict[str, str], reference: str | None) -> ReportContent:
    first = rows[0].config
    devices = ", ".join(dict.fromkeys(r.config.device for r in rows))
    provenance = {"commit": tags.get("git_commit", "unknown") + (" (uncommitted changes)"
                                                                if tags.get("git_dirty") == "true" else ""),
                  "host": f"{tags.get('host.hostname', '?')}: {tags.get('host.cpu_model', '?')}, "
                          f"{tags.get('host.logical_cores', '?')} logical cores, {tags.get('host.platform', '?')}",
                  "dataset": first.dataset or "synthetic (generated here)", "weights": first.weights or "random init",
                  **fingerprints}
    versions = {k.removeprefix("version."): v for k, v in sorted(tags.items()) if k.startswith("version.")
                and v != "absent"}
    content = ReportContent(title=f"{first.workload}/{first.preset} on {devices}", source=source, rows=rows,
                            speedups=baseline_speedups(rows), status=status, reason=reason,
                            command=shlex.join(redact_argv(command)), provenance=provenance, versions=versions)
    _alignment(rows, reference, content)
    return content
