"""Checks of what was recorded, without running anything: configuration, headlines recomputed from the stored step
times, batch size, warm-up accounting, the loader that ran, the inputs recomputed now; on our runs and on published
results alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from suite.analysis.equivalence import FAIL, INCONCLUSIVE, PASS, same_figure
from suite.audit.verdicts import SKIP, AuditReport, Check, Record
from suite.config import RunConfig
from suite.errors import SuiteError
from suite.figures import (
    DATA_WAIT_FRACTION,
    MEASURED_STEPS,
    MEASURED_WALL_S,
    STEP_TIME_P50_S,
    STEP_TIME_P90_S,
    STEP_TIME_P99_S,
    STEPS_TO_TARGET,
    THROUGHPUT_CI95_HIGH,
    THROUGHPUT_CI95_LOW,
    THROUGHPUT_SAMPLES_PER_S,
)
from suite.fileio import loads_bounded, read_record_text
from suite.registry import load_workload
from suite.results.record import FINISHED, RunResult, StepStats

#: Headlines recomputed from the stored step times, and the relative difference that is an inconsistency.
RECOMPUTED = (THROUGHPUT_SAMPLES_PER_S, THROUGHPUT_CI95_LOW, THROUGHPUT_CI95_HIGH, STEP_TIME_P50_S,
              STEP_TIME_P90_S, STEP_TIME_P99_S, MEASURED_STEPS, MEASURED_WALL_S, DATA_WAIT_FRACTION)
CONSISTENCY_RTOL = 1e-6


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
    names = [n for n in RECOMPUTED if n != DATA_WAIT_FRACTION or waits]
    if (facts.get("world_size") or 1) > 1:  # aggregated over ranks: rank 0's steps give only its own figures
        names = [n for n in names if n.startswith("step_time_") or n == MEASURED_STEPS]
    for name in names:
        recorded, again = metrics.get(name), float(getattr(stats, name))
        if recorded is None:
            problems.append(f"{name} is missing")
        elif not same_figure(float(recorded), again, CONSISTENCY_RTOL, 1e-12):
            problems.append(f"{name} is {recorded:.6g} but its {len(steps)} stored step times and batch {batch} give "
                            f"{again:.6g}")
    if problems:
        return Check(subject, "record", FAIL, "record inconsistent: " + "; ".join(problems))
    left = "" if waits else " (data waits not stored: data_wait_fraction not checked)"
    return Check(subject, "record", PASS, f"{len(names)} headline figures recomputed from {len(steps)} stored step "
                                          f"times: all agree{left}")


def check_memory_trend(subject: str, result: RunResult) -> Check:
    """The memory trend fitted again from the samples the run stored (:func:`suite.analysis.memory_trend.
    refit_differences`): a verdict or a growth figure edited after the run is "record inconsistent". What cannot be
    refitted (a record without stored samples) is inconclusive, never a pass. A record whose samples were edited
    together with every figure they give is not detected: nothing signs a record."""
    from suite.analysis import memory_trend

    if result.status != FINISHED:
        return Check(subject, "memory_trend", SKIP, f"the run {result.status}: no memory trend to check")
    refit = memory_trend.refit_differences(result.metrics, result.facts)
    if refit is None:
        return Check(subject, "memory_trend", SKIP, "no memory trend recorded (a record of an older suite)")
    if refit.differences:
        return Check(subject, "memory_trend", FAIL, "record inconsistent: " + "; ".join(refit.differences))
    if refit.missing:
        return Check(subject, "memory_trend", INCONCLUSIVE,
                     f"the {' and '.join(refit.missing)} memory trend cannot be refitted: its samples are not stored "
                     "(a record of an older suite)")
    verdict = memory_trend.recorded_verdict(result.facts)
    return Check(subject, "memory_trend", PASS,
                 f"{verdict} refitted from {refit.samples} stored samples ({' and '.join(refit.series)}): the verdict "
                 "and every growth figure agree")


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
        data = loads_bounded(read_record_text(path), str(path))
    except (OSError, ValueError) as exc:
        raise SuiteError(f"cannot read published results {path}: {exc}") from None
    report = AuditReport(target=str(path), checks=record_checks(reference_records(data)))
    report.checks.append(Check("matrix", "rerun", SKIP, "published results carry no manifest: nothing to re-run"))
    report.checks.append(Check("matrix", "environment", SKIP, "software versions are not recorded per result"))
    return report


def check_convergence(results: Sequence[RunResult], manifests: Sequence[dict[str, Any] | None],
                      reference: str = "tiny_quality_reference") -> list[Check]:
    """Each time-to-train run's steps to target against the quality reference's band: the 95 % prediction interval
    of one run of the reference implementation (:func:`suite.analysis.time_to_train.steps_band`), so an unchanged
    implementation fails with probability 5 % per run (under normality of the reference's steps). Skipped, saying
    why, where no reference applies (another configuration or transformers line)."""
    from suite.analysis.published import load_quality_reference
    from suite.analysis.time_to_train import reference_rcp, steps_band

    timed = [(r, m) for r, m in zip(results, manifests, strict=True)
             if r.config.target_quality is not None and r.status == FINISHED and STEPS_TO_TARGET in r.metrics]
    if not timed:
        return []
    path, data = load_quality_reference(reference)
    checks = []
    for result, manifest in timed:
        version = ((manifest or {}).get("packages") or {}).get("transformers")
        rcp = reference_rcp(data, result.config, version, path.name)
        subject, steps = result.config.config_id, result.metrics[STEPS_TO_TARGET]
        if isinstance(rcp, str):
            checks.append(Check(subject, "convergence", SKIP, f"steps to target {steps:.0f}; not checked: {rcp}"))
            continue
        low, high = steps_band(rcp)
        inside = low <= steps <= high
        checks.append(Check(subject, "convergence", PASS if inside else FAIL,
                            f"steps to target {steps:.0f} {'inside' if inside else 'outside'} the reference band "
                            f"[{low:.0f}, {high:.0f}] ({rcp.source}; 95 % prediction interval: a run of the reference "
                            "implementation falls outside it with probability 5 %)"))
    return checks
