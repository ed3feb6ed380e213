"""Checks of a re-run against its record: the inputs, the loss trajectory, the throughput (an equivalence test on the
ratio) and the environment."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from suite.analysis.equivalence import FAIL, INCONCLUSIVE, PASS, ratio_test
from suite.audit.verdicts import SKIP, WARN, Check
from suite.figures import THROUGHPUT_SAMPLES_PER_S
from suite.meters.contention import interference
from suite.results.environment import git_state, package_versions
from suite.results.record import FINISHED, RunResult


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
    said = interference(contention.get("others_share", 0.0), contention.get("steal_share", 0.0),
                        contention.get("paused_share", 0.0))
    return said + " (contended)" if contention.get("contended") else (said or "a quiet machine")


def throughput_check(subject: str, original: RunResult, rerun: RunResult, tolerance: float,
                     recorded_repeats: Sequence[float] | None = None) -> Check:
    """Contention first (either run measured under it, or not recorded: INCONCLUSIVE whatever the numbers), then the
    equivalence test on the ratio re-run / recorded from their stored step times (:func:`ratio_test`); always with
    the numbers."""
    before = original.metrics.get(THROUGHPUT_SAMPLES_PER_S)
    after = rerun.metrics.get(THROUGHPUT_SAMPLES_PER_S)
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
