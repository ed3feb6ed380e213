"""Commands that read records: ``suite audit``, ``suite compare``, ``suite upload``, ``suite recover``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import suite.cli.options as options
from suite.analysis.compare import ResultSet, label_sets, nothing_comparable, rows_from_results, speedups
from suite.analysis.plots import plot
from suite.analysis.published import load_reference, measured_table, reference_table, refuse_other_workload
from suite.cli.display import stamp, warn_unusable, wide_console
from suite.cli.options import looks_like_run_id
from suite.cli.tables import print_compare_table
from suite.errors import SuiteError
from suite.fileio import dumps_json
from suite.results.record import dataset_warning, differing_datasets
from suite.results.store import ResultsStore
from suite.text import visible

if TYPE_CHECKING:
    from suite.tracking.mlflow_gateway import MlflowGateway


def add_parsers(sub: Any) -> None:
    """``suite compare``, ``suite report``, ``suite upload`` and ``suite recover``."""
    _add_compare_parser(sub)
    _add_report_parser(sub)
    _add_upload_parsers(sub)


def _add_compare_parser(sub: Any) -> None:
    compare = sub.add_parser(
        "compare", help="configurations side by side with speed-ups and plots; beside published results",
        description="Show configurations side by side, one row per configuration id (every axis: device, workers, "
                    "loader, precision, engine, prefetch, processes, batch, seed, dataset...), with the metrics and "
                    "the speed-up over a baseline, and write PNG plots (throughput, host RAM and device memory vs "
                    "dataloader_num_workers). With --reference, also the published ratios beside the measured "
                    "ones. Nothing is written into MLflow unless --log-plots is given.")
    compare.add_argument("results", nargs="*", default=[], metavar="RESULTS",
                         help="results folders and MLflow matrix run ids, any number: each set's rows are labelled "
                              "with its name and what tells the sets apart (or use --experiment / --filter)")
    compare.add_argument("--experiment", default=None, help="all configuration runs of this MLflow experiment")
    compare.add_argument("--filter", dest="filter_string", default=None,
                         help="MLflow search filter on configuration runs, e.g. \"params.device = 'cpu'\"")
    compare.add_argument("--baseline", default=None,
                         help="configuration the speed-ups are relative to (part of its id or label, e.g. "
                              "nw0-cpu-fp32); default: the first")
    options.add_output_option(compare, "./suite-results/compare-<time> (--plots is the old name)", "--plots")
    compare.add_argument("--json", action="store_true", help="print the rows as JSON (one per configuration id)")
    compare.add_argument("--log-plots", action="store_true",
                         help="also log the plots as artifacts of the MLflow matrix run(s) the rows come from")
    compare.add_argument("--reference", default=None,
                         help="published results set beside the rows (a name under reference/ or a path; see "
                              "`suite list` for each workload's own)")
    options.add_tracking_option(compare)
    compare.set_defaults(func=cmd_compare)


def _add_report_parser(sub: Any) -> None:
    report = sub.add_parser(
        "report", help="one shareable page (HTML + Markdown) of a matrix: the published benchmark's table and chart "
                       "for your hardware",
        description="Write report.html (self-contained: charts embedded, nothing fetched) and report.md (with PNG "
                    "charts beside it) for a results folder or an MLflow matrix run: throughput per device x "
                    "dataloader_num_workers x loader with intervals and speed-ups, step-time percentiles, "
                    "data-wait, host RAM and device memory, quality, busy-host flags, the published figures and "
                    "ratios beside the measured ones, audit verdicts, and provenance with the command to "
                    "reproduce.")
    report.add_argument("target", help="results folder or MLflow matrix run id")
    options.add_output_option(report, "the results folder itself; ./suite-results/report-<run id> for an MLflow run")
    report.add_argument("--reference", default=None,
                        help="published results set beside the measured ones (name under reference/ or path; 'none' "
                             "to leave out; default: the workload's own, where it publishes some)")
    report.add_argument("--audit", type=Path, action="append", default=[], metavar="AUDIT",
                        help="an audit folder (or its audit.json) whose verdicts the report shows; repeatable "
                             "(audits recorded in MLflow against the matrix run are found by themselves)")
    report.add_argument("--screenshot", type=Path, default=None, metavar="PNG",
                        help="also render the page in headless Chromium to this PNG")
    options.add_tracking_option(report)
    report.set_defaults(func=cmd_report)


def _add_upload_parsers(sub: Any) -> None:
    upload = sub.add_parser(
        "upload", help="record a results folder into MLflow (its own store or another), without duplicates",
        description="Repair what a crash left in the results folder (as `suite recover`), then record its runs "
                    "into MLflow: for a matrix whose tracking server was unreachable, or to copy it to another "
                    "store. Runs already recorded are found by their uids and not duplicated; runs left RUNNING "
                    "are completed or marked KILLED. The folder's MLflow run ids are rewritten only for its own "
                    "store.")
    upload.add_argument("directory", type=Path, help="results folder written by `suite run`")
    options.add_tracking_option(upload, " (default: the store the matrix recorded into)")
    upload.set_defaults(func=cmd_upload)

    recover = sub.add_parser(
        "recover", help="finish what a crash (kill -9, full disk, dead server) left in a results folder and MLflow",
        description="Repair a results folder whose runner died or could not write: runs from a rescue file "
                    "(--from) or from runs/*/result.json that results.json lacks are recorded, started runs with "
                    "no result become KILLED, a matrix left RUNNING becomes KILLED; then its own MLflow store is "
                    "brought up to date (runs left RUNNING completed or KILLED, missing runs recorded). "
                    "Idempotent.")
    recover.add_argument("directory", type=Path, help="results folder written by `suite run`")
    recover.add_argument("--from", dest="rescue", type=Path, default=None, metavar="RESCUE",
                         help="rescue file printed by `suite run` when the results folder could not be written")
    options.add_tracking_option(recover, " (default: the store the matrix recorded into)")
    recover.set_defaults(func=cmd_recover)


def cmd_report(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from suite.report import write_report
    from suite.report.content import from_folder, from_mlflow

    reference = "" if (args.reference or "").lower() == "none" else args.reference  # None: the workload's own
    target = Path(args.target)
    if target.is_dir():
        content = from_folder(target, reference, args.audit)
        warn_unusable(content.results, target / "results.json")
        folder = args.output or target
    elif "/" in args.target or target.suffix:
        raise SuiteError(f"no such results folder: {args.target}")
    else:
        from suite.tracking.mlflow_gateway import MlflowGateway

        content = from_mlflow(MlflowGateway(args.tracking_uri), args.target, reference)
        folder = args.output or Path("suite-results") / f"report-{args.target}"
    files = write_report(content, folder)
    print(f"report: {files.html}\nmarkdown: {files.markdown}")
    if args.screenshot is not None:
        from suite.report.browser import screenshot

        print(f"screenshot: {screenshot(files.html, args.screenshot)}")
    return 0


def cmd_upload(args: argparse.Namespace, argv: Sequence[str]) -> int:
    return _upload(args.directory, args.tracking_uri, None)


def cmd_recover(args: argparse.Namespace, argv: Sequence[str]) -> int:
    return _upload(args.directory, args.tracking_uri, args.rescue)


def _upload(directory: Path, tracking_uri: str | None, rescue: Path | None) -> int:
    from suite.tracking.upload import upload

    report = upload(directory, tracking_uri, rescue)
    for line in report.repairs:
        print(f"repaired: {line}")
    for name in report.still_running:
        print(f"still running: {name} (its process is alive); run this again when it ends")
    print(f"recorded {report.recorded} run(s), {report.already_there} already in MLflow"
          + (f", {report.killed_in_mlflow} left RUNNING marked KILLED" if report.killed_in_mlflow else "")
          + f"; matrix run {report.parent_run_id} at {report.tracking_uri}"
          + ("" if report.ids_written else " (another store: the folder's MLflow run ids are left as they were)"))
    return 0


def cmd_compare(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from suite.tracking.mlflow_gateway import MlflowGateway

    gateway = MlflowGateway(args.tracking_uri)
    rows = _compare_rows(args, gateway)
    base, ratios = speedups(rows, args.baseline) if rows else (None, [])
    if args.json:
        baseline_id = base.config_id if base is not None else None
        print(dumps_json([{**row.as_dict(), "speedup": ratio, "baseline": baseline_id}
                          for row, ratio in zip(rows, ratios, strict=True)], indent=2))
    elif rows:
        print_compare_table(rows, base, ratios)
    if rows and (args.output is not None or not args.json):
        _plots(args, rows, gateway)
    if args.reference and not args.json:
        _print_published(args.reference, rows)
    return 0


def _compare_rows(args: argparse.Namespace, gateway: MlflowGateway) -> list[Any]:
    """The rows ``suite compare`` was asked for: of each results folder and MLflow matrix run named (labelled by set
    where there are several), or of an MLflow experiment or filter."""
    from suite.tracking.reading import matrix_run_set, rows_from_mlflow

    sets = []
    for target in args.results:
        if Path(target).is_dir():
            sets.append(_folder_set(Path(target)))
        elif looks_like_run_id(target):
            sets.append(matrix_run_set(gateway, target))
        else:
            raise SuiteError(f"no such results folder: {target} (nor an MLflow run id: 32 hexadecimal digits)")
    if args.experiment or args.filter_string:
        rows = rows_from_mlflow(gateway, experiment=args.experiment, filter_string=args.filter_string)
        if not rows:
            raise SuiteError("no finished configuration matches: nothing to compare")
        sets.append(ResultSet(args.experiment or "filter", {}, rows))
    if not sets and not args.reference:
        raise SuiteError("give RESULTS (results folders or MLflow run ids), --experiment, --filter or --reference")
    return label_sets(sets)


def _folder_set(folder: Path) -> ResultSet:
    """A results folder's rows (its runs' datasets compared: a file replaced mid-matrix is said), named by the
    folder, with when it started, on which host and at which commit."""
    store = ResultsStore(folder)
    results = store.results()
    if not results:
        raise SuiteError(f"{folder / 'results.json'} lists no runs: nothing to compare")
    changed = dataset_warning(differing_datasets(results))
    if changed:
        print(f"suite: warning: {visible(changed)}", file=sys.stderr)
    warn_unusable(results, folder / "results.json")
    rows = rows_from_results(results)
    if not rows:
        raise nothing_comparable(results, folder, "compare")
    matrix = store.matrix()
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime(matrix.started_at))
    return ResultSet(folder.name or str(folder), {"started": started, "host": matrix.host,
                                                  "commit": matrix.tags.get("git_commit", "")[:10]}, rows)


def _plots(args: argparse.Namespace, rows: list[Any], gateway: MlflowGateway) -> None:
    """The comparison's plots into --output (default: a new folder), and with --log-plots into the rows' MLflow
    matrix runs."""
    folder = args.output or Path("suite-results") / f"compare-{stamp()}"
    if folder.exists() and not folder.is_dir():
        raise SuiteError(f"--output {folder} is a file, not a folder")
    pngs = plot(rows, folder)
    if not args.json:
        print("plots: " + ", ".join(str(p) for p in pngs))
    if args.log_plots:
        parents = sorted({p for row in rows for p in row.matrix_run_ids})
        if not parents:
            raise SuiteError("--log-plots: these rows come from no MLflow matrix run")
        for parent in parents:
            for png in pngs:
                gateway.log_artifact(parent, png, artifact_path="plots")
        if not args.json:
            print(f"plots logged to MLflow run(s): {', '.join(parents)}")


def _print_published(reference: str, rows: list[Any]) -> None:
    """The published figures beside the measured ones: samples/s, then ratios on one row."""
    from rich.table import Table
    from rich.text import Text

    from suite.analysis.published import align
    from suite.report.render import published_tables

    path, data = load_reference(reference)
    refuse_other_workload(path, data, {row.config.workload for row in rows})
    title = data.get("title", path.stem)
    for table, what in zip(published_tables(align(reference_table(data), measured_table(rows))),
                           ("published and measured samples/s", "ratios, published and measured on one row")):
        shown = Table(title=f"{title}: {what}")
        for index, header in enumerate(table.headers):
            why = header.startswith("why")
            shown.add_column(header, justify="left" if index == 0 or why else "right", no_wrap=index == 0,
                             overflow="fold" if why else "ellipsis")
        for cells in table.rows:
            shown.add_row(*(Text(cell) for cell in cells))
        wide_console().print(shown)
