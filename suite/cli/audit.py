"""``suite audit``: a recorded matrix (folder or MLflow run) or a published table checked, its verdict printed, written
and logged to MLflow."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import suite.cli.options as options
from suite.analysis.equivalence import FAIL
from suite.audit import loaders as loader_audit
from suite.audit.loaders import LoaderAudit
from suite.audit.record_checks import audit_reference
from suite.audit.verdicts import DEFAULT_LOSS_RTOL, DEFAULT_THROUGHPUT_TOLERANCE, AuditReport, Check
from suite.cli.display import PlainProgress, RichProgress, stamp, warn_unusable
from suite.cli.tables import print_checks
from suite.errors import ConfigError, RecordEdited, SuiteError
from suite.fileio import dumps_json
from suite.redact import redact_argv
from suite.results.files import AUDIT_FILE, MatrixInfo
from suite.results.store import ResultsStore
from suite.tracking.stores import normalize_uri

if TYPE_CHECKING:
    from suite.tracking.mlflow_gateway import MlflowGateway


def add_parsers(sub: Any) -> None:
    """``suite audit``."""
    audit = sub.add_parser(
        "audit", help="re-run a recorded matrix from its manifests and give a verdict per check",
        description="Audit TARGET: a results folder, an MLflow run id (matrix or configuration), or a "
                    "published-results file (reference/*.json). Checks: the manifest's config is results.json's, "
                    "every headline recomputed from the stored step times, batch size logged = used, equal warm-up "
                    "accounting, loader/workers/prefetch observed = requested, re-run from the manifest with "
                    "identical inputs (with --no-rerun: the inputs' fingerprints recomputed now), loss digest "
                    "(bit-identical on the same device kind, else within --loss-rtol), throughput equivalence "
                    "(the 90 % interval of the ratio re-run/recorded inside +-tolerance: PASS; wholly outside: "
                    "FAIL; else, or on a contended run, INCONCLUSIVE), package and commit drift (WARN). Exit "
                    "status: 0 PASS, 1 FAIL (any check failed), 3 INCONCLUSIVE (none failed, one could not "
                    "decide). --calibrate prints the throughput test's error rates on synthetic series instead.")
    audit.add_argument("target", nargs="?", help="results folder, MLflow run id, or reference JSON file")
    options.add_tracking_option(audit, " of the target run and of the audit record")
    options.add_output_option(audit, "./suite-results/audit-<time>: a results folder of the re-runs, with audit.json")
    audit.add_argument("--no-rerun", action="store_true", help="check the records only")
    audit.add_argument("--loss-rtol", type=float, default=DEFAULT_LOSS_RTOL,
                       help="relative loss tolerance across device kinds (default: %(default)s)")
    audit.add_argument("--throughput-tolerance", type=options.float_above(0.0), default=DEFAULT_THROUGHPUT_TOLERANCE,
                       help="the declared equivalence band of the throughput ratio re-run/recorded, relative "
                            "(default: %(default)s, i.e. +-10 %%); recorded in the audit")
    audit.add_argument("--loaders", action="store_true",
                       help="also compare every loader the device runs with the reference loader on the same images: "
                            "model input (mean |difference|, PSNR, channel means/stds) and the first training "
                            "steps' losses")
    audit.add_argument("--loader-images", type=options.int_at_least(1), default=loader_audit.DEFAULT_IMAGES,
                       help="--loaders: images compared (default: %(default)s)")
    audit.add_argument("--loader-steps", type=options.int_at_least(1), default=loader_audit.DEFAULT_STEPS,
                       help="--loaders: training steps compared (default: %(default)s)")
    audit.add_argument("--loader-pixel-tolerance", type=options.float_above(0.0),
                       default=loader_audit.DEFAULT_PIXEL_TOLERANCE,
                       help="--loaders: largest mean |difference| of the model input, normalized units "
                            "(default: %(default)s)")
    audit.add_argument("--loader-loss-rtol", type=options.float_above(0.0), default=loader_audit.DEFAULT_LOSS_RTOL,
                       help="--loaders: largest relative difference of the first losses (default: %(default)s)")
    audit.add_argument("--calibrate", action="store_true",
                       help="no audit: the throughput test's false-FAIL and false-PASS rates over synthetic "
                            "step-time series (AR(1), drift, spikes, between-run shifts), as JSON")
    audit.add_argument("--pairs", type=options.int_at_least(10), default=1000, help="--calibrate: pairs of runs "
                                                                                "(default: %(default)s)")
    audit.add_argument("--steps", type=options.int_at_least(2), default=30, help="--calibrate: measured steps per run "
                                                                              "(default: %(default)s)")
    options.add_progress_option(audit)
    audit.set_defaults(func=cmd_audit)



def _load_recorded(target: str, gateway: MlflowGateway) -> Any:
    from suite.audit.checks import load_directory, load_mlflow_run

    path = Path(target)
    if path.is_dir():
        return load_directory(path)
    if path.suffix == ".json" or "/" in target:
        raise SuiteError(f"no such results folder: {target}")
    return load_mlflow_run(gateway, target)


def _workload_of(folder: Path) -> str:
    """The workload a results folder's matrix.json names (its records could not be read)."""
    try:
        return ResultsStore(folder).matrix().workload
    except SuiteError:
        return "unknown"


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

        print(dumps_json(calibrate(pairs=args.pairs, steps=args.steps, tolerance=args.throughput_tolerance),
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
    try:
        recorded = _load_recorded(args.target, gateway)
    except RecordEdited as exc:  # issue 49: a record contradicting itself is a forgery or a corruption: FAIL
        recorded, edited = None, AuditReport(args.target, [Check("matrix", "record", FAIL,
                                                                 f"record inconsistent: {exc}")])
    if recorded is not None:
        warn_unusable(recorded.results, args.target)
    workload = recorded.results[0].config.workload if recorded is not None else _workload_of(target)
    output = args.output or Path("suite-results") / f"audit-{stamp()}"
    store = ResultsStore.create(output, MatrixInfo(name=f"audit-{stamp()}", workload=workload, kind="audit",
                                                   command=["suite", *redact_argv(argv)],
                                                   tracking_uri=normalize_uri(gateway.tracking_uri)))
    try:
        if recorded is None:
            report = edited
        else:
            # progress bars only for what runs (--no-rerun runs nothing: its bars stayed empty), and on a terminal
            display = PlainProgress() if args.no_progress or args.no_rerun or not sys.stderr.isatty() \
                else RichProgress(len(recorded.results))
            with display:
                report = audit_recorded(recorded, args.target, store, rerun=not args.no_rerun,
                                        loss_rtol=args.loss_rtol, throughput_tolerance=args.throughput_tolerance,
                                        progress=display, loaders=_loader_audit(args))
        audit_file = store.write_json(AUDIT_FILE, {**report.as_dict(),
                                                     "throughput_tolerance": args.throughput_tolerance})
        store.finish("FINISHED", None if report.passed else f"audit verdict {report.verdict}")
    finally:
        store.release()
    run_id = log_audit_to_mlflow(report, gateway, workload, audit_file)
    print_checks(report)
    print(f"audit: {audit_file}\nmlflow audit run: {run_id}")
    return report.exit_status
