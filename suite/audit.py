"""Reproducibility audits.

``suite audit TARGET`` reads a recorded matrix (a results directory or an MLflow run id), checks its
records, re-runs every configuration from its manifest alone, and gives a verdict per check:

* ``batch_size``: the batch size logged is the batch size used;
* ``warmup_accounting``: every configuration excluded the same warm-up steps;
* ``loader``: the loader that ran is the loader requested, and no knob is reported that had no effect;
* ``rerun``: the configuration runs again from its manifest;
* ``inputs``: the re-run read the same data, initial weights and tokenizer (fingerprints);
* ``loss_digest``: bit-identical loss trajectory on the same device kind, else within ``loss_rtol``;
* ``throughput``: the re-run's throughput is within the recorded noise band;
* ``environment``: which package versions differ from the manifest (a warning, not a failure).

The same record checks run on published results (``reference/*.json``), which shows the flaws of the
original benchmark on its own numbers. Verdicts: PASS, FAIL, WARN, SKIP; any FAIL fails the audit.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from suite.config import RunConfig
from suite.environment import package_versions
from suite.errors import SuiteError
from suite.manifest import MANIFEST_FILE, config_from_manifest, load_manifest
from suite.results import FINISHED, RunResult

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"
DEFAULT_LOSS_RTOL = 1e-2
DEFAULT_THROUGHPUT_TOLERANCE = 0.10


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
    def passed(self) -> bool:
        return all(c.verdict != FAIL for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "passed": self.passed, "audited_run_ids": self.audited_run_ids,
                "checks": [asdict(c) for c in self.checks]}


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
        else:
            checks.append(Check(r.subject, "loader", PASS,
                                f"{r.loader_ran} loader with {r.workers_effective} workers, as requested"))
    return checks


def record_checks(records: Sequence[Record]) -> list[Check]:
    return [*check_batch_size(records), *check_warmup_accounting(records), *check_loader(records)]


def record_of(result: RunResult, manifest: dict[str, Any] | None, label: str = "") -> Record:
    config = RunConfig.from_dict(result.config)
    subject = config.config_id + (f" repeat {result.repeat}" if result.repeat else "") + label
    facts = result.facts
    loader_ran = manifest["loader"]["ran"] if manifest else facts.get("loader_used")
    return Record(
        subject=subject,
        batch_size_logged=config.batch_size,
        batch_size_used=(manifest["batch_size"]["used"] if manifest else facts.get("batch_size_used")),
        warmup_steps_excluded=(manifest["warmup_steps_excluded"] if manifest else facts.get("warmup_steps_excluded")),
        loader_requested=config.loader,
        loader_ran=loader_ran,
        workers_requested=config.num_workers,
        # the suite's loaders always run the requested workers (they read bytes in "device" mode)
        workers_effective=config.num_workers if loader_ran is not None else None,
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
    data = json.loads(path.read_text())
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


def _manifest_beside(result: RunResult, target: Path) -> dict[str, Any] | None:
    candidates = []
    if result.facts.get("manifest"):
        candidates.append(Path(result.facts["manifest"]))
    if result.facts.get("run_dir"):  # the results folder may have moved since it was recorded
        candidates.append(target / "runs" / Path(result.facts["run_dir"]).name / MANIFEST_FILE)
    for path in candidates:
        if path.is_file():
            return load_manifest(path)
    return None


def load_directory(target: Path) -> Recorded:
    results_file = target / "results.json"
    if not results_file.is_file():
        raise SuiteError(f"{target} holds no results.json")
    results = [RunResult.from_dict(r) for r in json.loads(results_file.read_text())]
    scores_file = target / "scores.json"
    scores = json.loads(scores_file.read_text()) if scores_file.is_file() else []
    return Recorded(results, [_manifest_beside(r, target) for r in results], scores)


def load_mlflow_run(run_id: str, tracking_uri: str) -> Recorded:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        raise SuiteError(f"no MLflow run {run_id!r} at {tracking_uri}: {exc.message.splitlines()[0]}") from exc
    with tempfile.TemporaryDirectory(prefix="suite-audit-") as workdir:  # everything is read into memory

        def fetch(rid: str, name: str) -> Path | None:
            try:
                return Path(client.download_artifacts(rid, name, str(Path(workdir) / rid)))
            except (MlflowException, OSError):
                return None

        if run.data.tags.get("suite.role") == "matrix":
            results_path = fetch(run_id, "results.json")
            if results_path is None:
                raise SuiteError(f"MLflow run {run_id} has no results.json artifact")
            results = [RunResult.from_dict(r) for r in json.loads(results_path.read_text())]
            scores_path = fetch(run_id, "scores.json")
            scores = json.loads(scores_path.read_text()) if scores_path else []
        else:
            result_path = fetch(run_id, "result.json")
            if result_path is None:
                raise SuiteError(f"MLflow run {run_id} has no result.json artifact")
            results, scores = [RunResult.from_dict(json.loads(result_path.read_text()))], []
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
                  noise_band: float, loss_rtol: float) -> list[Check]:
    subject = RunConfig.from_dict(original.config).config_id
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

    before = original.metrics.get("throughput_samples_per_s")
    after = rerun.metrics.get("throughput_samples_per_s")
    if before is None or after is None:
        checks.append(Check(subject, "throughput", SKIP, "no recorded throughput to compare"))
    else:
        ratio = after / before
        checks.append(Check(subject, "throughput", PASS if abs(ratio - 1) <= noise_band else FAIL,
                            f"re-run {after:.1f} vs recorded {before:.1f} samples/s ({ratio - 1:+.1%}; "
                            f"noise band ±{noise_band:.0%})"))
    return checks


def environment_check(manifests: Iterable[dict[str, Any] | None]) -> Check:
    current = package_versions()
    drift: dict[str, tuple[str, str]] = {}
    for manifest in manifests:
        for name, version in (manifest or {}).get("packages", {}).items():
            if current.get(name, "absent") != version:
                drift[name] = (version, current.get(name, "absent"))
    if not drift:
        return Check("matrix", "environment", PASS, "package versions as recorded")
    return Check("matrix", "environment", WARN,
                 "versions differ: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in sorted(drift.items())))


def noise_band_for(config_id: str, scores: Sequence[dict[str, Any]], tolerance: float) -> float:
    """3 x the recorded CV over repeats, never below ``tolerance``."""
    for score in scores:
        if score.get("config_id") == config_id and score.get("throughput_cv") is not None:
            return max(3 * score["throughput_cv"], tolerance)
    return tolerance


def audit_recorded(recorded: Recorded, target: str, output_dir: Path, rerun: bool = True,
                   loss_rtol: float = DEFAULT_LOSS_RTOL, throughput_tolerance: float = DEFAULT_THROUGHPUT_TOLERANCE,
                   progress: Any = None) -> AuditReport:
    from suite.runner import run_isolated

    report = AuditReport(target=target, audited_run_ids=[r.mlflow_run_id for r in recorded.results if r.mlflow_run_id])
    report.checks += record_checks([record_of(r, m) for r, m in zip(recorded.results, recorded.manifests, strict=True)])
    report.checks.append(environment_check(recorded.manifests))
    if not rerun:
        report.checks.append(Check("matrix", "rerun", SKIP, "re-runs not requested (--no-rerun)"))
        return report
    seen: set[str] = set()
    for result, manifest in zip(recorded.results, recorded.manifests, strict=True):
        config_id = RunConfig.from_dict(result.config).config_id
        if config_id in seen:  # one re-run per configuration, compared with its first repeat
            continue
        seen.add(config_id)
        if manifest is None:
            report.checks.append(Check(config_id, "rerun", FAIL, "no manifest recorded: cannot re-run"))
            continue
        if result.status != FINISHED:
            report.checks.append(Check(config_id, "rerun", SKIP, f"recorded run {result.status}: nothing to compare"))
            continue
        config = config_from_manifest(manifest)
        new = run_isolated(config, output_dir, progress, command=["suite", "audit", target])
        new_manifest = load_manifest(new.facts["manifest"])
        rerun_record = record_of(new, new_manifest, label=" (re-run)")
        report.checks += [*check_batch_size([rerun_record]), *check_loader([rerun_record])]
        report.checks += compare_rerun(result, manifest, new, new_manifest,
                                       noise_band_for(config_id, recorded.scores, throughput_tolerance), loss_rtol)
    return report


def _tag_safe(text: str) -> str:
    """MLflow tag keys allow alphanumerics, underscores, dashes, periods, spaces and slashes."""
    return re.sub(r"[^\w\-. /]", "_", text)


def log_audit_to_mlflow(report: AuditReport, tracking_uri: str, experiment: str, artifact: Path) -> str:
    """Record the audit as an MLflow run linked to the audited runs; returns its run id."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from suite.recorders.mlflow_tracking import _artifact_location

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(
        experiment, artifact_location=_artifact_location(tracking_uri, experiment))
    audited_parent = None
    for run_id in report.audited_run_ids[:1]:
        try:
            audited_parent = client.get_run(run_id).data.tags.get("mlflow.parentRunId")
        except Exception:  # noqa: BLE001 - the audited runs may live in another store
            audited_parent = None
    tags = {"suite.role": "audit", "suite.audited_target": report.target[:5000],
            "suite.audited_run_ids": ",".join(report.audited_run_ids)[:5000],
            "suite.verdict": PASS if report.passed else FAIL}
    if audited_parent:
        tags["suite.audited_run_id"] = audited_parent
    run_id = client.create_run(experiment_id, run_name=f"audit-{time.strftime('%Y%m%d-%H%M%S')}",
                               tags=tags).info.run_id
    now = int(time.time() * 1000)
    counts = {v: sum(c.verdict == v for c in report.checks) for v in (PASS, FAIL, WARN, SKIP)}
    check_tags = [RunTag(f"check.{i:03d}.{_tag_safe(c.subject)}.{c.name}"[:250], f"{c.verdict}: {c.detail}"[:5000])
                  for i, c in enumerate(report.checks)]
    client.log_batch(run_id, metrics=[Metric(f"checks_{k.lower()}", float(v), now, 0) for k, v in counts.items()],
                     params=[Param("target", report.target[:500])])
    for start in range(0, len(check_tags), 100):
        client.log_batch(run_id, tags=check_tags[start:start + 100])
    client.log_artifact(run_id, str(artifact))
    client.set_terminated(run_id, status="FINISHED")
    return run_id
