"""``suite export``: every run of results folders and MLflow experiments as one table, CSV and Parquet."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

import suite.cli.options as options
from suite.analysis.export import row_of_result, write_tables
from suite.cli.display import say, stamp, warn_unusable
from suite.errors import SuiteError
from suite.results.store import ResultsStore


def add_parsers(sub: Any) -> None:
    """``suite export``."""
    export = sub.add_parser(
        "export", help="every run of results folders and MLflow experiments as one table (CSV and Parquet)",
        description="Write runs.csv and runs.parquet: one row per configuration run (each repeat its own) of every "
                    "results folder and MLflow experiment named, with its source, ids, status, configuration "
                    "(config.<field>), metrics and facts (facts.<path>).")
    export.add_argument("folders", nargs="*", type=Path, metavar="RESULTS", help="results folders")
    export.add_argument("--experiment", dest="experiments", action="append", default=[], metavar="NAME",
                        help="an MLflow experiment, all its configuration runs (repeatable)")
    options.add_output_option(export, "./suite-results/export-<time>")
    export.add_argument("--tracking-uri", default=None, help="MLflow tracking URI for --experiment")
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if not args.folders and not args.experiments:
        raise SuiteError("give results folders and/or --experiment NAME: nothing to export")
    rows = []
    for folder in args.folders:
        results = ResultsStore(folder).results()
        warn_unusable(results, folder / "results.json")
        rows += [row_of_result(result, str(folder)) for result in results]
    if args.experiments:
        from suite.tracking.mlflow_gateway import MlflowGateway
        from suite.tracking.reading import run_rows

        gateway = MlflowGateway(args.tracking_uri)
        for experiment in args.experiments:
            rows += run_rows(gateway, experiment)
    if not rows:
        raise SuiteError("the sources hold no run: nothing to export")
    output = args.output or Path("suite-results") / f"export-{stamp()}"
    if output.exists() and not output.is_dir():
        raise SuiteError(f"--output {output} is a file, not a folder")
    csv, parquet, count = write_tables(rows, output)
    say(f"{count} run(s) -> {csv}, {parquet}")
    return 0
