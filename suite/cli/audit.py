"""``suite audit``: a recorded matrix (folder or MLflow run) or a published table checked, its verdict printed, written
and logged to MLflow."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from suite.audit.loaders import LoaderAudit
from suite.audit.record_checks import audit_reference
from suite.cli.display import PlainProgress, RichProgress, stamp
from suite.cli.tables import print_checks
from suite.errors import ConfigError, SuiteError
from suite.results.files import MatrixInfo
from suite.results.store import ResultsStore
from suite.tracking.stores import normalize_uri


def _load_recorded(target: str, gateway: Any) -> Any:
    from suite.audit.checks import load_directory, load_mlflow_run

    path = Path(target)
    if path.is_dir():
        return load_directory(path)
    if path.suffix == ".json" or "/" in target:
        raise SuiteError(f"no such results folder: {target}")
    return load_mlflow_run(gateway, target)


def _loader_audit(args: argparse.Namespace) -> Any:
    if not args.loaders:
        return None

    return LoaderAudit(images=args.loader_images, steps=args.loader_steps,
                       pixel_tolerance=args.loader_pixel_tolerance, loss_rtol=args.loader_loss_rtol)


def cmd_audit(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from suite.audit.checks import audit_recorded, log_audit_to_mlflow
    from suite.tracking.mlflow_gateway import MlflowGateway

    if args.calibrate:
        from suite.analysis.equivalence import calibrate

        print(json.dumps(calibrate(pairs=args.pairs, steps=args.steps, tolerance=args.throughput_tolerance),
                         indent=2))
        return 0
    if args.target is None:
        raise ConfigError("suite audit needs a TARGET (a results folder, an MLflow run id or a reference file), "
                          "or --calibrate")
    target = Path(args.target)
    if target.is_file():
        report = audit_reference(target)
        print_checks(report)
        return report.exit_status
    gateway = MlflowGateway(args.tracking_uri)
    recorded = _load_recorded(args.target, gateway)
    workload = recorded.results[0].config.workload
    output = args.output or Path("suite-results") / f"audit-{stamp()}"
    store = ResultsStore.create(output, MatrixInfo(name=f"audit-{stamp()}", workload=workload, kind="audit",
                                                   command=["suite", *argv],
                                                   tracking_uri=normalize_uri(gateway.tracking_uri)))
    try:
        display = PlainProgress() if args.no_progress else RichProgress(len(recorded.results))
        with display:
            report = audit_recorded(recorded, args.target, store, rerun=not args.no_rerun, loss_rtol=args.loss_rtol,
                                    throughput_tolerance=args.throughput_tolerance, progress=display,
                                    loaders=_loader_audit(args))
        audit_file = store.write_json("audit.json", {**report.as_dict(),
                                                     "throughput_tolerance": args.throughput_tolerance})
        store.finish("FINISHED", None if report.passed else f"audit verdict {report.verdict}")
    finally:
        store.release()
    run_id = log_audit_to_mlflow(report, gateway, workload, audit_file)
    print_checks(report)
    print(f"audit: {audit_file}\nmlflow audit run: {run_id}")
    return report.exit_status
