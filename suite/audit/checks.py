"""Reproducibility audits.

``suite audit TARGET`` reads a recorded matrix (a results directory or an MLflow run id), checks its
records, re-runs every configuration from its manifest alone, and gives a verdict per check:

* ``complete``: the folder's matrix has ended (INCONCLUSIVE while it still runs, or when a runner that died left
  it RUNNING: its records may lack runs);
* ``config``: the configuration in the run's manifest is the one in results.json, field by field;
* ``record``: every headline (throughput, its interval, step-time percentiles, data-wait, steps, wall time) is what
  the run's own stored per-step times and batch size give, and the manifest's facts (device, fingerprints) are
  results.json's: a hand edit or a bug is "record inconsistent" (FAIL);
* ``memory_trend``: the memory trend (verdict, growth and interval, host and device) is what the run's stored
  memory samples give when fitted again; a record without them is INCONCLUSIVE;
* ``witnesses``: every figure and fact against the witnesses the catalogue of figures declares for it (a copy in
  mlperf.log, the manifest or another fact, the raw readings it derives from, a physical bound) and the whole record
  against its run folder's own result.json (:mod:`suite.audit.witnesses`): any disagreement is FAIL;
* ``listing`` (the matrix): no run listed twice, every run folder's record listed;
* ``batch_size``: the batch size logged is the batch size used;
* ``warmup_accounting``: every configuration excluded the same warm-up steps;
* ``loader``: the loader, worker count and prefetch factor observed while it ran (the built pipeline, the
  DataLoader that ran) are the ones requested, and no knob is reported that had no effect;
* ``rerun``: the configuration runs again from its manifest;
* ``inputs``: the re-run read the same data, initial weights and tokenizer (fingerprints); with ``--no-rerun``,
  ``inputs_now``: the fingerprints recomputed now from the files, the tokenizer and the model built from the seed;
* ``loss_digest``: bit-identical loss trajectory on the same device kind, else within ``loss_rtol``;
* ``throughput``: an equivalence test on the ratio re-run / recorded (:mod:`suite.analysis.equivalence`): PASS
  when its 90 % interval lies inside the declared tolerance, FAIL when wholly outside, INCONCLUSIVE otherwise, and
  INCONCLUSIVE whatever the numbers when either run was measured under contention (checked first);
* ``environment``: which package versions and which commit differ from the manifest (a warning, not a failure).

The same record checks run on published results (``reference/*.json``), which shows the flaws of the
original benchmark on its own numbers. Verdicts per check: PASS, FAIL, INCONCLUSIVE, WARN, SKIP. The audit's own
verdict: FAIL when any check fails, else INCONCLUSIVE when any is inconclusive, else PASS (``suite audit`` exits
0, 1, 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from suite.analysis.equivalence import FAIL, INCONCLUSIVE, PASS
from suite.audit.record_checks import (
    check_batch_size,
    check_config,
    check_convergence,
    check_inputs_now,
    check_loader,
    check_memory_trend,
    check_record_consistency,
    record_checks,
    record_of,
)
from suite.audit.rerun import compare_rerun, environment_check, recorded_repeats
from suite.audit.verdicts import (
    DEFAULT_LOSS_RTOL,
    DEFAULT_THROUGHPUT_TOLERANCE,
    SKIP,
    WARN,
    AuditReport,
    Check,
    verdicts_by_check,
)
from suite.audit.witnesses import Evidence, check_listing, check_witnesses
from suite.errors import ConfigError, SuiteError
from suite.results.manifest import config_from_manifest
from suite.results.record import FINISHED, RUNNING, RunResult
from suite.results.store import ResultsStore
from suite.run.launch import launch
from suite.tracking.reading import matrix_records
from suite.workload import catalogue_of

if TYPE_CHECKING:
    from suite.run.launch import Progress
    from suite.tracking.mlflow_gateway import MlflowGateway


# --- loading a recorded matrix ------------------------------------------------------------------------
@dataclass
class Recorded:
    results: list[RunResult]
    manifests: list[dict[str, Any] | None]
    scores: list[dict[str, Any]]
    #: why the records are not a whole matrix (still running, or left RUNNING by a runner that died); "" when whole
    incomplete: str = ""
    #: each run with what else the folder holds of it (its log, its run folder's copy), in the order of ``results``
    evidence: list[Evidence] = field(default_factory=list)
    #: the matrix's listing against its run folders (see :func:`check_listing`); ``None`` for an MLflow run
    listing: Check | None = None


def load_directory(target: Path) -> Recorded:
    """A results folder's runs, with each run's manifest from the same folder (wherever it was copied)."""
    store = ResultsStore(target)
    results = store.results()
    if not results:
        raise SuiteError(f"{target / 'results.json'} lists no runs: nothing to audit")
    read: dict[Any, dict[str, Any] | None] = {}  # each run folder's manifest read once, however many records name it
    manifests = []
    for result in results:
        folder = store.run_folder(result)
        if folder not in read:
            read[folder] = store.manifest_of(result)
        manifests.append(read[folder])
    incomplete = ""
    if store.matrix().status == RUNNING:
        incomplete = (f"the matrix is still running (another process holds {target}): its records are incomplete; "
                      "audit it when it has ended" if store.in_use() else
                      f"the matrix was left RUNNING by a runner that is gone: its records may be incomplete; run "
                      f"suite recover {target} first")
    evidence = []
    for result, manifest in zip(results, manifests, strict=True):
        log = store.mlperf_log_of(result)
        try:
            copy = store.folder_record_of(result)
        except (SuiteError, ValueError) as exc:  # an unreadable copy is a witness that contradicts: said by the check
            copy, unreadable = None, str(exc)
        else:
            unreadable = ""
        evidence.append(Evidence(result, manifest, log if log is not None and log.is_file() else None,
                                 None if copy is None else copy.to_dict(), unreadable_copy=unreadable))
    return Recorded(results, manifests, store.scores(), incomplete, evidence,
                    check_listing(store, results, ended=not incomplete))


def load_mlflow_run(gateway: MlflowGateway, run_id: str) -> Recorded:
    """A matrix run's (or one configuration run's) records, from its MLflow artifacts."""
    results, manifests, scores = matrix_records(gateway, run_id)
    return Recorded(results, manifests, scores, evidence=[Evidence(r, m) for r, m in zip(results, manifests,
                                                                                        strict=True)])


def audit_recorded(recorded: Recorded, target: str, store: ResultsStore | None, rerun: bool = True,
                   loss_rtol: float = DEFAULT_LOSS_RTOL, throughput_tolerance: float = DEFAULT_THROUGHPUT_TOLERANCE,
                   progress: Progress | None = None, loaders: Any = None) -> AuditReport:
    """Record checks on every run; with ``rerun``, each configuration run again into ``store`` (the audit's
    own results folder) and compared with its first recorded run; with ``loaders`` (a
    :class:`~suite.audit.loaders.LoaderAudit`), every loader against the reference (:mod:`.loaders`)."""
    report = _audit_records(recorded, target, store, rerun, loss_rtol, throughput_tolerance, progress)
    if loaders is not None:
        from suite.audit.loaders import loader_checks

        if store is None:
            raise ValueError("the loader comparison needs a results folder (store)")
        configs = [r.config for r in recorded.results]
        report.checks += loader_checks(configs, store, progress, loaders, ["suite", "audit", target, "--loaders"])
    return report


def _audit_records(recorded: Recorded, target: str, store: ResultsStore | None, rerun: bool, loss_rtol: float,
                   throughput_tolerance: float, progress: Progress | None) -> AuditReport:

    report = AuditReport(target=target, audited_run_ids=[r.mlflow_run_id for r in recorded.results if r.mlflow_run_id])
    if recorded.incomplete:
        report.checks.append(Check("matrix", "complete", INCONCLUSIVE, recorded.incomplete))
    if recorded.listing is not None:
        report.checks.append(recorded.listing)
    computed: dict[tuple[Any, ...], dict[str, str]] = {}
    for result, manifest, evidence in zip(recorded.results, recorded.manifests, recorded.evidence, strict=True):
        config = result.config
        subject = config.config_id + (f" repeat {result.repeat}" if result.repeat else "")
        report.checks.append(check_config(subject, result.config.to_dict(), manifest))
        report.checks.append(check_record_consistency(subject, result, manifest))
        report.checks.append(check_memory_trend(subject, result))
        report.checks.append(check_witnesses(subject, evidence, catalogue_of(config.workload)))
        if not rerun and result.status == FINISHED:
            report.checks.append(check_inputs_now(subject, config, manifest, computed))
    report.checks += record_checks([record_of(r, m) for r, m in zip(recorded.results, recorded.manifests, strict=True)])
    report.checks.append(environment_check(recorded.manifests))
    report.checks += check_convergence(recorded.results, recorded.manifests)
    if not rerun:
        report.checks.append(Check("matrix", "rerun", SKIP, "re-runs not requested (--no-rerun): the inputs were "
                                                            "recomputed instead (inputs_now)"))
        return report
    if store is None:
        raise ValueError("re-runs need a results folder (store)")
    seen: set[str] = set()
    for result, manifest in zip(recorded.results, recorded.manifests, strict=True):
        config_id = result.config.config_id
        if config_id in seen:  # one re-run per configuration, compared with its first repeat
            continue
        seen.add(config_id)
        if manifest is None:
            report.checks.append(Check(config_id, "rerun", FAIL, "no manifest recorded: cannot re-run"))
            continue
        if result.status != FINISHED:
            report.checks.append(Check(config_id, "rerun", SKIP, f"recorded run {result.status}: nothing to compare"))
            continue
        try:
            config = config_from_manifest(manifest)
        except ConfigError as exc:
            report.checks.append(Check(config_id, "rerun", FAIL, f"the manifest's config cannot run: {exc}"))
            continue
        new = launch(config, store, progress, command=["suite", "audit", target])
        store.record(new)
        new_manifest = store.manifest_of(new) or {}
        rerun_record = record_of(new, new_manifest or None, label=" (re-run)")
        report.checks += [*check_batch_size([rerun_record]), *check_loader([rerun_record])]
        report.checks += compare_rerun(result, manifest, new, new_manifest, throughput_tolerance, loss_rtol,
                                       recorded_repeats(config_id, recorded.scores))
    return report


def log_audit_to_mlflow(report: AuditReport, gateway: MlflowGateway, experiment: str, artifact: Path) -> str:
    """Record the audit as an MLflow run linked to the audited runs (:func:`suite.tracking.side_runs.log_audit`);
    returns its run id."""
    from suite.tracking.side_runs import log_audit

    counts = {v: sum(c.verdict == v for c in report.checks) for v in (PASS, FAIL, INCONCLUSIVE, WARN, SKIP)}
    return log_audit(gateway, experiment, report, counts, verdicts_by_check(report.checks), artifact)
