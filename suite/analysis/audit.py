"""Reproducibility audits.

``suite audit TARGET`` reads a recorded matrix (a results directory or an MLflow run id), checks its
records, re-runs every configuration from its manifest alone, and gives a verdict per check:

* ``config``: the configuration in the run's manifest is the one in results.json, field by field;
* ``record``: every headline (throughput, its interval, step-time percentiles, data-wait, steps, wall time) is what
  the run's own stored per-step times and batch size give, and the manifest's facts (device, fingerprints) are
  results.json's: a hand edit or a bug is "record inconsistent" (FAIL);
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

import json
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from suite.analysis.equivalence import DEFAULT_TOLERANCE, FAIL, INCONCLUSIVE, PASS, ratio_test
from suite.config import RunConfig
from suite.errors import ConfigError, SuiteError
from suite.fileio import read_record_text
from suite.records.environment import git_state, package_versions
from suite.records.manifest import MANIFEST_FILE, config_from_manifest, load_manifest
from suite.records.results import FINISHED, RunResult
from suite.records.store import ResultsStore

WARN, SKIP = "WARN", "SKIP"
DEFAULT_LOSS_RTOL = 1e-2
DEFAULT_THROUGHPUT_TOLERANCE = DEFAULT_TOLERANCE
#: ``suite audit``'s exit status per verdict.
EXIT_STATUS = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}
#: Headlines recomputed from the stored step times, and the relative difference that is an inconsistency.
RECOMPUTED = ("throughput_samples_per_s", "throughput_ci95_low", "throughput_ci95_high", "step_time_p50_s",
              "step_time_p90_s", "step_time_p99_s", "measured_steps", "measured_wall_s", "data_wait_fraction")
CONSISTENCY_RTOL = 1e-6


@dataclass(frozen=True)
class Check:
    subject: str  # a configuration id, or "matrix"
    name: str
    verdict: str
    detail: str


@dataclass
class AuditReport:
    target: str
    checks: list[Check] = field(default_factory=list)
    audited_run_ids: list[str] = field(default_factory=list)
    mlflow_audit_run_id: str | None = None

    @property
    def verdict(self) -> str:
        """FAIL when any check failed, else INCONCLUSIVE when any could not decide, else PASS."""
        verdicts = {c.verdict for c in self.checks}
        return FAIL if FAIL in verdicts else INCONCLUSIVE if INCONCLUSIVE in verdicts else PASS

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.verdict]

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "verdict": self.verdict, "passed": self.passed,
                "audited_run_ids": self.audited_run_ids, "checks": [asdict(c) for c in self.checks]}


@dataclass(frozen=True)
class Record:
    """What the record checks need from one run, ours or published."""

    subject: str
    batch_size_logged: int | None
    batch_size_used: int | None
    warmup_steps_excluded: int | None
    loader_requested: str | None
    loader_ran: str | None
    workers_requested: int | None
    workers_effective: int | None
    prefetch_requested: int | None = None
    prefetch_effective: int | None = None
    prefetch_observed: bool = False  # whether the prefetch factor that ran was recorded


# --- record checks (ours and published alike) ----------------------------------------------------
def check_batch_size(records: Sequence[Record]) -> list[Check]:
    checks = []
    for r in records:
        if r.batch_size_used is None:
            checks.append(Check(r.subject, "batch_size", FAIL, f"logged {r.batch_size_logged}, used: not recorded"))
        elif r.batch_size_logged != r.batch_size_used:
            checks.append(Check(r.subject, "batch_size", FAIL,
                                f"logged {r.batch_size_logged} but used {r.batch_size_used}"))
        else:
            checks.append(Check(r.subject, "batch_size", PASS, f"logged = used = {r.batch_size_used}"))
    return checks


def check_warmup_accounting(records: Sequence[Record]) -> list[Check]:
    by_value: dict[Any, list[str]] = {}
    for r in records:
        by_value.setdefault(r.warmup_steps_excluded, []).append(r.subject)
    if None in by_value:
        return [Check("matrix", "warmup_accounting", FAIL,
                      f"warm-up exclusion not recorded for {', '.join(by_value[None])}")]
    if len(by_value) > 1:
        parts = "; ".join(f"{v} excluded by {', '.join(s)}" for v, s in sorted(by_value.items()))
        return [Check("matrix", "warmup_accounting", FAIL, f"unequal accounting: {parts}")]
    [value] = by_value
    return [Check("matrix", "warmup_accounting", PASS, f"every configuration excluded {value} warm-up steps")]


def check_loader(records: Sequence[Record]) -> list[Check]:
    checks = []
    for r in records:
        if r.loader_ran != r.loader_requested:
            checks.append(Check(r.subject, "loader", FAIL, f"requested {r.loader_requested!r} but "
                                                          f"{r.loader_ran!r} ran"))
        elif r.workers_effective != r.workers_requested:
            checks.append(Check(r.subject, "loader", FAIL,
                                f"dataloader_num_workers={r.workers_requested} reported but "
                                f"{'it had no effect' if r.workers_effective is None else r.workers_effective} "
                                "in this mode"))
        elif r.prefetch_observed and r.prefetch_effective != _expected_prefetch(r):
            checks.append(Check(r.subject, "loader", FAIL, f"prefetch_factor={r.prefetch_requested} reported but "
                                                          f"{r.prefetch_effective} ran"))
        else:
            checks.append(Check(r.subject, "loader", PASS,
                                f"{r.loader_ran} loader with {r.workers_effective} workers, as requested"))
    return checks


def _expected_prefetch(r: Record) -> int | None:
    """The prefetch factor a DataLoader runs with: none without workers, torch's 2 when not given."""
    if not r.workers_requested:
        return None
    return r.prefetch_requested if r.prefetch_requested is not None else 2


def check_config(subject: str, recorded: dict[str, Any], manifest: dict[str, Any] | None) -> Check:
    """The manifest's configuration is results.json's, field by field."""
    if manifest is None:
        return Check(subject, "config", FAIL, "no manifest recorded for this run")
    listed = manifest.get("config") or {}
    differing = [f"{name}: results.json {recorded.get(name)!r}, manifest {listed.get(name)!r}"
                 for name in sorted(set(recorded) | set(listed)) if recorded.get(name) != listed.get(name)]
    if differing:
        return Check(subject, "config", FAIL, "manifest and results.json differ: " + "; ".join(differing))
    return Check(subject, "config", PASS, "manifest and results.json record the same configuration")


def check_record_consistency(subject: str, result: RunResult, manifest: dict[str, Any] | None) -> Check:
    """Every headline recomputed from the run's own stored step times, data waits and batch size, and the manifest's
    facts against results.json's: any difference is "record inconsistent" (a hand edit, or a bug)."""
    from suite.records.results import StepStats

    if result.status != FINISHED:
        return Check(subject, "record", SKIP, f"the run {result.status}: no headline to check")
    facts, metrics = result.facts, result.metrics
    problems = _manifest_disagreements(result, manifest)
    steps, waits = facts.get("step_times_s"), facts.get("data_wait_s")
    batch = result.config.batch_size
    if not steps or batch is None:
        if problems:
            return Check(subject, "record", FAIL, "record inconsistent: " + "; ".join(problems))
        return Check(subject, "record", INCONCLUSIVE, "no per-step times stored (a record of an older suite): the "
                                                      "headlines cannot be recomputed")
    stats = StepStats(tuple(steps), tuple(waits) if waits else tuple(0.0 for _ in steps), batch)
    names = [n for n in RECOMPUTED if n != "data_wait_fraction" or waits]
    if (facts.get("world_size") or 1) > 1:  # aggregated over ranks: rank 0's steps give only its own figures
        names = [n for n in names if n.startswith("step_time_") or n == "measured_steps"]
    for name in names:
        recorded, again = metrics.get(name), float(getattr(stats, name))
        if recorded is None:
            problems.append(f"{name} is missing")
        elif abs(recorded - again) > CONSISTENCY_RTOL * max(abs(again), 1e-12):
            problems.append(f"{name} is {recorded:.6g} but its {len(steps)} stored step times and batch {batch} give "
                            f"{again:.6g}")
    if problems:
        return Check(subject, "record", FAIL, "record inconsistent: " + "; ".join(problems))
    left = "" if waits else " (data waits not stored: data_wait_fraction not checked)"
    return Check(subject, "record", PASS, f"{len(names)} headline figures recomputed from {len(steps)} stored step "
                                          f"times: all agree{left}")


#: Facts recorded both in results.json and in the manifest (the manifest's key, where in the result's facts).
_MIRRORED = (("dataset_fingerprint", ("workload", "dataset_fingerprint")),
             ("initial_weights_sha256", ("workload", "initial_weights_sha256")),
             ("tokenizer_sha256", ("workload", "tokenizer_sha256")),
             ("device_name", ("device", "device_name")))


def _manifest_disagreements(result: RunResult, manifest: dict[str, Any] | None) -> list[str]:
    if manifest is None:
        return []
    problems = []
    for key, (section, name) in _MIRRORED:
        in_manifest = (manifest.get("device") or {}).get(name) if section == "device" else manifest.get(key)
        in_result = (result.facts.get(section) or {}).get(name)
        if in_manifest != in_result:
            problems.append(f"{key}: manifest {_short(in_manifest)}, results.json {_short(in_result)}")
    return problems


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:20] + "...'"


def check_inputs_now(subject: str, config: RunConfig, manifest: dict[str, Any] | None,
                     computed: dict[tuple[Any, ...], dict[str, str]]) -> Check:
    """The recorded fingerprints against the ones computed now (the workload's :meth:`input_fingerprints`: the
    dataset's files, the tokenizer, the model built from the seed), without training. ``computed`` caches them per
    inputs (dataset, preset, weights, tokenizer, seed)."""
    from suite.registry import load_workload

    if manifest is None:
        return Check(subject, "inputs_now", FAIL, "no manifest recorded for this run")
    key = (config.workload, config.dataset, config.preset, config.weights, config.tokenizer, config.seed,
           config.skip_bad_samples, config.max_image_pixels, config.max_image_bytes, config.max_caption_bytes)
    if key not in computed:
        try:
            computed[key] = load_workload(config.workload).input_fingerprints(config)
        except NotImplementedError as exc:
            computed[key] = {"unavailable": str(exc) or f"workload {config.workload} cannot recompute its inputs"}
        except Exception as exc:  # noqa: BLE001 - inputs that cannot be read now: said, and a failure
            computed[key] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}
    now = computed[key]
    if "unavailable" in now:
        return Check(subject, "inputs_now", SKIP, now["unavailable"])
    if "error" in now:
        return Check(subject, "inputs_now", FAIL, f"the inputs cannot be read now: {now['error']}")
    differing = [f"{name}: recorded {_short(manifest.get(name))}, now {_short(value)}" for name, value in now.items()
                 if manifest.get(name) != value]
    if differing:
        return Check(subject, "inputs_now", FAIL, "differ: " + "; ".join(differing))
    return Check(subject, "inputs_now", PASS, f"{', '.join(now)} recomputed now: as recorded")


def record_checks(records: Sequence[Record]) -> list[Check]:
    return [*check_batch_size(records), *check_warmup_accounting(records), *check_loader(records)]


def record_of(result: RunResult, manifest: dict[str, Any] | None, label: str = "") -> Record:
    """What ran, as observed by the run (the pipeline built, the DataLoader that ran), beside what was asked."""
    config = result.config
    subject = config.config_id + (f" repeat {result.repeat}" if result.repeat else "") + label
    facts = result.facts
    return Record(
        subject=subject,
        batch_size_logged=config.batch_size,
        batch_size_used=(manifest["batch_size"]["used"] if manifest else facts.get("batch_size_used")),
        warmup_steps_excluded=(manifest["warmup_steps_excluded"] if manifest else facts.get("warmup_steps_excluded")),
        loader_requested=config.loader,
        loader_ran=facts.get("loader_used"),
        workers_requested=config.num_workers,
        workers_effective=facts.get("num_workers_used"),
        prefetch_requested=config.prefetch_factor,
        prefetch_effective=facts.get("prefetch_factor_used"),
        prefetch_observed="prefetch_factor_used" in facts,
    )


# --- published records -----------------------------------------------------------------------------
def reference_records(data: dict[str, Any]) -> list[Record]:
    """Records of a published table (``reference/*.json``), with the accounting it documents."""
    stated = data["workload"]["per_device_batch_size"]
    in_command = data["workload"].get("per_device_batch_size_in_command", stated)
    records = []
    for row in data["results"]:
        records.append(Record(
            subject=f"{row['device']}-nw{row['dataloader_num_workers']}-{row['loader']}",
            batch_size_logged=stated, batch_size_used=in_command,
            warmup_steps_excluded=row.get("warmup_steps_excluded"),
            loader_requested=row["loader"], loader_ran=row.get("loader_ran", row["loader"]),
            workers_requested=row["dataloader_num_workers"],
            workers_effective=row.get("dataloader_num_workers_effective", row["dataloader_num_workers"]),
        ))
    return records


def audit_reference(path: Path) -> AuditReport:
    try:
        data = json.loads(read_record_text(path))
    except (OSError, ValueError) as exc:
        raise SuiteError(f"cannot read published results {path}: {exc}") from None
    report = AuditReport(target=str(path), checks=record_checks(reference_records(data)))
    report.checks.append(Check("matrix", "rerun", SKIP, "published results carry no manifest: nothing to re-run"))
    report.checks.append(Check("matrix", "environment", SKIP, "software versions are not recorded per result"))
    return report


# --- loading a recorded matrix ------------------------------------------------------------------------
@dataclass
class Recorded:
    results: list[RunResult]
    manifests: list[dict[str, Any] | None]
    scores: list[dict[str, Any]]


def load_directory(target: Path) -> Recorded:
    """A results folder's runs, with each run's manifest from the same folder (wherever it was copied)."""
    store = ResultsStore(target)
    results = store.results()
    if not results:
        raise SuiteError(f"{target / 'results.json'} lists no runs: nothing to audit")
    return Recorded(results, [store.manifest_of(r) for r in results], store.scores())


def load_mlflow_run(gateway: Any, run_id: str) -> Recorded:
    """A matrix run's (or one configuration run's) records, from its MLflow artifacts."""
    from suite.recorders import mlflow_gateway as tags
    from suite.records.store import read_results_file, read_scores_file, validate_result

    run = gateway.get_run(run_id)
    with tempfile.TemporaryDirectory(prefix="suite-audit-") as workdir:  # everything is read into memory
        def fetch(rid: str, name: str) -> Path | None:
            return gateway.download_artifact(rid, name, Path(workdir) / rid)

        if run.data.tags.get(tags.ROLE) == "matrix":
            results_path = fetch(run_id, "results.json")
            if results_path is None:
                raise SuiteError(f"MLflow run {run_id} has no results.json artifact")
            results = read_results_file(results_path)
            scores_path = fetch(run_id, "scores.json")
            scores = read_scores_file(scores_path) if scores_path else []
        else:
            result_path = fetch(run_id, "result.json")
            if result_path is None:
                raise SuiteError(f"MLflow run {run_id} has no result.json artifact")
            results, scores = [validate_result(json.loads(read_record_text(result_path)), str(result_path))], []
            results[0].mlflow_run_id = run_id
        manifests = []
        for result in results:
            path = fetch(result.mlflow_run_id, MANIFEST_FILE) if result.mlflow_run_id else None
            manifests.append(load_manifest(path) if path else None)
    return Recorded(results, manifests, scores)


# --- re-run checks -------------------------------------------------------------------------------------
def _max_rel_diff(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True)), default=0.0)


def compare_rerun(original: RunResult, manifest: dict[str, Any], rerun: RunResult, rerun_manifest: dict[str, Any],
                  tolerance: float, loss_rtol: float, recorded_repeats: Sequence[float] | None = None) -> list[Check]:
    subject = original.config.config_id
    if rerun.status != FINISHED:
        return [Check(subject, "rerun", FAIL, f"the re-run {rerun.status}: {rerun.reason}")]
    checks = [Check(subject, "rerun", PASS, "re-ran from the manifest alone")]

    differing = [name for name in ("dataset_fingerprint", "initial_weights_sha256", "tokenizer_sha256")
                 if manifest.get(name) != rerun_manifest.get(name)]
    checks.append(Check(subject, "inputs", FAIL if differing else PASS,
                        f"differ: {', '.join(differing)}" if differing else "same data, initial weights and tokenizer"))

    same_kind = (manifest.get("device", {}).get("device_name") == rerun.facts.get("device", {}).get("device_name"))
    if original.loss_digest == rerun.loss_digest:
        checks.append(Check(subject, "loss_digest", PASS, f"bit-identical trajectory ({rerun.loss_digest[:12]})"))
    elif same_kind:
        checks.append(Check(subject, "loss_digest", FAIL, "trajectory differs on the same device kind "
                                                          f"(max relative difference "
                                                          f"{_max_rel_diff(rerun.losses, original.losses):.3g})"))
    else:
        diff = _max_rel_diff(rerun.losses, original.losses)
        checks.append(Check(subject, "loss_digest", PASS if diff <= loss_rtol else FAIL,
                            f"other device kind: max relative difference {diff:.3g} (tolerance {loss_rtol})"))

    checks.append(throughput_check(subject, original, rerun, tolerance, recorded_repeats))
    return checks


def _contention_text(result: RunResult) -> str:
    contention = result.facts.get("contention")
    if not contention:
        return "contention not recorded"
    return (f"other processes used {contention['others_share']:.0%} of the cores, steal {contention['steal_share']:.0%}"
            + (" (contended)" if contention["contended"] else ""))


def throughput_check(subject: str, original: RunResult, rerun: RunResult, tolerance: float,
                     recorded_repeats: Sequence[float] | None = None) -> Check:
    """Contention first (either run measured under it, or not recorded: INCONCLUSIVE whatever the numbers), then the
    equivalence test on the ratio re-run / recorded from their stored step times (:func:`ratio_test`); always with
    the numbers."""
    before = original.metrics.get("throughput_samples_per_s")
    after = rerun.metrics.get("throughput_samples_per_s")
    if before is None or after is None:
        return Check(subject, "throughput", SKIP, "no recorded throughput to compare")
    numbers = f"re-run {after:.1f} vs recorded {before:.1f} samples/s ({after / before - 1:+.1%})"
    where = f"recorded: {_contention_text(original)}; re-run: {_contention_text(rerun)}"
    contended = [name for name, result in (("recorded", original), ("re-run", rerun))
                 if (result.facts.get("contention") or {}).get("contended")]
    if contended:
        return Check(subject, "throughput", INCONCLUSIVE,
                     f"{numbers}; the {' and '.join(contended)} run was measured under contention ({where}): no "
                     "verdict on a busy machine's figures; audit on a quiet machine, or with --repeats")
    if "contention" not in original.facts or "contention" not in rerun.facts:
        return Check(subject, "throughput", INCONCLUSIVE, f"{numbers}; contention was not recorded for both runs "
                                                          f"({where}): no verdict")
    steps_before, steps_after = original.facts.get("step_times_s"), rerun.facts.get("step_times_s")
    if not steps_before or not steps_after or len(steps_before) < 2 or len(steps_after) < 2:
        return Check(subject, "throughput", INCONCLUSIVE, f"{numbers}; fewer than two stored step times on a side: "
                                                          "no interval for the ratio, no verdict")
    batch = rerun.facts.get("global_batch_size") or rerun.config.batch_size
    test = ratio_test(steps_before, steps_after, tolerance, recorded_repeats, samples_per_step=batch)
    return Check(subject, "throughput", test.verdict, f"{numbers}; {test.describe()}; neither run contended")


def environment_check(manifests: Iterable[dict[str, Any] | None]) -> Check:
    """Package versions and the suite's commit now, against the manifests' (a warning: the code or a library
    changed since, which may explain a difference, but is not one)."""
    current = package_versions()
    commit_now = git_state().get("git_commit")
    drift: dict[str, tuple[str, str]] = {}
    for manifest in manifests:
        for name, version in (manifest or {}).get("packages", {}).items():
            if current.get(name, "absent") != version:
                drift[name] = (version, current.get(name, "absent"))
        recorded_commit = ((manifest or {}).get("git") or {}).get("git_commit")
        if recorded_commit and recorded_commit != commit_now:
            drift["suite commit"] = (str(recorded_commit)[:12], str(commit_now)[:12])
    if not drift:
        return Check("matrix", "environment", PASS, "package versions and commit as recorded")
    return Check("matrix", "environment", WARN,
                 "differ: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in sorted(drift.items())))


def recorded_repeats(config_id: str, scores: Sequence[dict[str, Any]]) -> list[float] | None:
    """With repeats, the recorded configuration's throughput per repeat (else ``None``)."""
    for score in scores:
        values = [v for v in score.get("throughput_values") or [] if v == v]
        if score.get("config_id") == config_id and len(values) >= 2:
            return values
    return None


def audit_recorded(recorded: Recorded, target: str, store: ResultsStore | None, rerun: bool = True,
                   loss_rtol: float = DEFAULT_LOSS_RTOL, throughput_tolerance: float = DEFAULT_THROUGHPUT_TOLERANCE,
                   progress: Any = None, loaders: Any = None) -> AuditReport:
    """Record checks on every run; with ``rerun``, each configuration run again into ``store`` (the audit's
    own results folder) and compared with its first recorded run; with ``loaders`` (a
    :class:`~suite.analysis.loaders.LoaderAudit`), every loader against the reference (:mod:`.loaders`)."""
    report = _audit_records(recorded, target, store, rerun, loss_rtol, throughput_tolerance, progress)
    if loaders is not None:
        from suite.analysis.loaders import loader_checks

        if store is None:
            raise ValueError("the loader comparison needs a results folder (store)")
        configs = [r.config for r in recorded.results]
        report.checks += loader_checks(configs, store, progress, loaders, ["suite", "audit", target, "--loaders"])
    return report


def _audit_records(recorded: Recorded, target: str, store: ResultsStore | None, rerun: bool, loss_rtol: float,
                   throughput_tolerance: float, progress: Any) -> AuditReport:
    from suite.run.launch import launch

    report = AuditReport(target=target, audited_run_ids=[r.mlflow_run_id for r in recorded.results if r.mlflow_run_id])
    computed: dict[tuple[Any, ...], dict[str, str]] = {}
    for result, manifest in zip(recorded.results, recorded.manifests, strict=True):
        config = result.config
        subject = config.config_id + (f" repeat {result.repeat}" if result.repeat else "")
        report.checks.append(check_config(subject, result.config.to_dict(), manifest))
        report.checks.append(check_record_consistency(subject, result, manifest))
        if not rerun and result.status == FINISHED:
            report.checks.append(check_inputs_now(subject, config, manifest, computed))
    report.checks += record_checks([record_of(r, m) for r, m in zip(recorded.results, recorded.manifests, strict=True)])
    report.checks.append(environment_check(recorded.manifests))
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


def _verdicts_by_check(checks: Sequence[Check]) -> dict[str, str]:
    """Each check's verdict over its subjects: FAIL if any failed, else INCONCLUSIVE if any, else PASS / WARN / SKIP."""
    order = (FAIL, INCONCLUSIVE, WARN, PASS, SKIP)
    verdicts: dict[str, str] = {}
    for check in checks:
        seen = verdicts.get(check.name)
        if seen is None or order.index(check.verdict) < order.index(seen):
            verdicts[check.name] = check.verdict
    return verdicts


def _tag_safe(text: str) -> str:
    """MLflow tag keys allow alphanumerics, underscores, dashes, periods, spaces and slashes."""
    return re.sub(r"[^\w\-. /]", "_", text)


def log_audit_to_mlflow(report: AuditReport, gateway: Any, experiment: str, artifact: Path) -> str:
    """Record the audit as an MLflow run linked to the audited runs; returns its run id."""
    from suite.recorders import mlflow_gateway as tags

    experiment_id = gateway.experiment_id(experiment)
    audited_parent = None
    for run_id in report.audited_run_ids[:1]:
        try:
            audited_parent = gateway.get_run(run_id).data.tags.get(tags.PARENT_RUN_ID)
        except SuiteError:  # the audited runs may live in another store
            audited_parent = None
    run_tags = {tags.ROLE: "audit", "suite.audited_target": report.target[:5000],
                "suite.audited_run_ids": ",".join(report.audited_run_ids)[:5000],
                "suite.verdict": report.verdict}
    if audited_parent:
        run_tags["suite.audited_run_id"] = audited_parent
    run_id = gateway.create_run(experiment_id, f"audit-{time.strftime('%Y%m%d-%H%M%S')}", run_tags,
                                {"target": report.target[:500]})
    now = int(time.time() * 1000)
    counts = {v: sum(c.verdict == v for c in report.checks) for v in (PASS, FAIL, INCONCLUSIVE, WARN, SKIP)}
    check_tags = {f"check.{i:03d}.{_tag_safe(c.subject)}.{c.name}"[:250]: f"{c.verdict}: {c.detail}"[:5000]
                  for i, c in enumerate(report.checks)}
    check_tags.update({f"suite.verdict.{_tag_safe(name)}"[:250]: verdict  # per check, over its subjects
                       for name, verdict in _verdicts_by_check(report.checks).items()})
    gateway.log(run_id, metrics=[(f"checks_{k.lower()}", float(v), now, 0) for k, v in counts.items()],
                tags=check_tags)
    gateway.log_artifact(run_id, artifact)
    gateway.terminate(run_id, "FINISHED")
    return run_id
