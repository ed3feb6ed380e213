"""Every recorded figure and fact cross-examined by its witnesses (issue 49): the other places in the results folder
that hold it or bound it, as the catalogue of figures declares them (:class:`suite.figures.Witness`), and the run
folder's own copy of the record.

A value that disagrees with one of its witnesses is "record inconsistent" (FAIL): the folder itself holds the
evidence against it. A witness that is absent from a record (an older suite's, a run that stopped early, a log that
is not there) is not heard, and is said. What no witness covers is not detected: nothing signs a record, and a
forger who edits a figure together with every copy and every raw value it derives from is not caught (the re-run
is the check for that).
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from suite.analysis.equivalence import FAIL, INCONCLUSIVE, PASS, same_figure
from suite.audit.verdicts import SKIP, Check
from suite.errors import SuiteError
from suite.figures import ABSENT, FACTS, Catalogue, Witness, fact_at
from suite.meters.contention import is_contended
from suite.results.mlperf_log import newest_training_ruleset, parse_log
from suite.results.record import FINISHED, RunResult
from suite.results.store import ResultsStore

#: Two numbers are the same recorded value within this relative difference (a JSON round trip is exact; a value
#: computed again from its raw readings may differ in its last bits).
SAME_RTOL = 1e-9
_MISSING = ABSENT
_OPERATORS: dict[str, Callable[[float, float], float]] = {"*": operator.mul, "/": operator.truediv}


@dataclass
class Evidence:
    """One run's record and what else its folder holds of it."""

    result: RunResult
    manifest: Mapping[str, Any] | None
    log: Path | None = None  # the run's mlperf.log
    folder_copy: Mapping[str, Any] | None = None  # the run folder's result.json
    unreadable_copy: str = ""  # why the run folder's result.json could not be read, where it could not
    _events: dict[str, Any] | None = field(default=None, repr=False)

    def lookup(self, path: str) -> Any:
        """The value at a dotted ``path`` of the facts (``config.<field>``: the configuration's), else _MISSING."""
        if path.startswith("config."):
            return getattr(self.result.config, path.removeprefix("config."), _MISSING)
        return fact_at(self.result.facts, path)

    def log_value(self, key: str) -> Any:
        """The value of the last ``key`` event of the run's mlperf.log, read with MLCommons' own parser within the
        log's bounds (:func:`suite.results.mlperf_log.parse_log`), else _MISSING (no log, or no such event)."""
        if self._events is None:
            self._events = {}
            if self.log is not None:
                try:
                    lines, _ = parse_log(self.log, newest_training_ruleset())
                except ValueError:
                    lines = []
                for line in lines:
                    if isinstance(line.value, Mapping):
                        self._events[line.key] = line.value.get("value")
        return self._events.get(key, _MISSING)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _same(recorded: Any, witness: Any) -> bool:
    a, b = _number(recorded), _number(witness)
    if a is not None and b is not None:
        return same_figure(a, b, SAME_RTOL, 1e-12)
    return bool(recorded == witness)


def _formula(evidence: Evidence, expression: str) -> Any:
    """``a * b / c`` over facts and ``config.`` fields, left to right; _MISSING where a term is absent, not a
    number, or a divisor is 0."""
    terms = expression.split()
    value = _number(evidence.lookup(terms[0]))
    for op, term in zip(terms[1::2], terms[2::2]):
        operand = _number(evidence.lookup(term))
        if value is None or operand is None or (op == "/" and operand == 0):
            return _MISSING
        value = _OPERATORS[op](value, operand)
    return _MISSING if value is None else value


def hear(witness: Witness, name: str, value: Any, evidence: Evidence) -> str | None | object:
    """What ``witness`` says against ``value`` (recorded as ``name``): a disagreement in words, ``None`` when it
    agrees, or _MISSING when it is not in the record."""
    kind, path = witness.kind, witness.path
    if kind in ("fact", "formula", "config", "manifest", "log", "last_evaluation"):
        if kind == "fact":
            said, where = evidence.lookup(path), f"facts.{path}"
        elif kind == "formula":
            said, where = _formula(evidence, path), path
        elif kind == "config":
            said, where = getattr(evidence.result.config, path, _MISSING), f"the configuration's {path}"
        elif kind == "manifest":
            said, where = fact_at(evidence.manifest, path) if evidence.manifest else _MISSING, f"the manifest's {path}"
        elif kind == "log":
            said, where = evidence.log_value(path), f"mlperf.log's {path}"
        else:
            evaluations = evidence.result.facts.get("evaluations")
            last = evaluations[-1] if isinstance(evaluations, list) and evaluations else None
            said = last.get(name, _MISSING) if isinstance(last, Mapping) else _MISSING
            where = "the last evaluation (facts.evaluations)"
        if said is _MISSING or said is None:
            return _MISSING
        return None if _same(value, said) else f"{name} is {_short(value)} but {where} says {_short(said)}"
    if kind == "count":
        series = evidence.lookup(path)
        if not isinstance(series, list):
            return _MISSING
        return None if _same(value, len(series)) else f"{name} is {_short(value)} but facts.{path} holds {len(series)}"
    if kind == "peak_of":
        series = evidence.lookup(path)
        samples = [s for s in (_number(v) for v in series) if s is not None] if isinstance(series, list) else []
        peak = _number(value)
        if not samples or peak is None:
            return _MISSING
        return None if peak >= max(samples) else (f"{name} is {peak:.6g}, below the sample {max(samples):.6g} it "
                                                  f"covers (facts.{path})")
    if kind == "within":
        bounds = evidence.lookup(path)
        if not isinstance(value, list) or not isinstance(bounds, list):
            return _MISSING
        if len(value) != len(bounds):
            return f"{name} holds {len(value)} values but facts.{path} {len(bounds)}"
        for index, (inner, outer) in enumerate(zip(value, bounds)):
            a, b = _number(inner), _number(outer)
            if a is None or b is None or a < 0 or a > b * (1 + SAME_RTOL):
                return f"{name}[{index}] is {_short(inner)}, outside [0, facts.{path}[{index}] = {_short(outer)}]"
        return None
    if kind == "contention_rule":
        shares = [_number(evidence.lookup(f"contention.{s}_share")) for s in ("others", "steal", "paused")]
        if shares[0] is None or shares[1] is None:
            return _MISSING
        said = is_contended(shares[0], shares[1], shares[2] or 0.0)
        return None if value is said else (f"{name} is {value} but the recorded shares give {said} "
                                           f"(others {shares[0]:.3g}, steal {shares[1]:.3g})")
    raise ValueError(f"a witness of an unknown kind: {witness}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_witnesses(subject: str, evidence: Evidence, catalogue: Catalogue) -> Check:
    """Every metric of the run by its figure's witnesses, every declared fact by its own, and the record by the
    run folder's copy of it."""
    result = evidence.result
    if result.status != FINISHED:
        return Check(subject, "witnesses", SKIP, f"the run {result.status}: its figures are not cross-examined")
    problems: list[str] = []
    heard = 0
    questioned: list[tuple[str, Any, tuple[Witness, ...]]] = []
    for name, value in sorted(result.metrics.items()):
        figure = catalogue.get(name)
        if figure is not None and figure.witnesses:
            questioned.append((name, value, figure.witnesses))
    for fact in FACTS:
        if fact.witnesses:
            value = fact_at(result.facts, fact.path)
            if value is not _MISSING and value is not None:
                questioned.append((f"facts.{fact.path}", value, fact.witnesses))
    for name, value, witnesses in questioned:
        for witness in witnesses:
            said = hear(witness, name.removeprefix("facts."), value, evidence)
            if said is _MISSING:
                continue
            heard += 1
            if said is not None:
                problems.append(str(said))
    copy = evidence.folder_copy
    if evidence.unreadable_copy:
        problems.append(f"the run folder's result.json cannot be read: {evidence.unreadable_copy}")
    if copy is not None:
        heard += 1
        recorded = {k: v for k, v in result.to_dict().items() if k != "mlflow_run_id"}
        differing = sorted(k for k in set(recorded) | set(copy) - {"mlflow_run_id"}
                           if recorded.get(k, _MISSING) != copy.get(k, _MISSING))
        if "facts" in differing:
            facts, copied = recorded.get("facts") or {}, copy.get("facts") or {}
            differing.remove("facts")
            differing += sorted(f"facts.{k}" for k in set(facts) | set(copied) if facts.get(k) != copied.get(k))
        if differing:
            problems.append("results.json and the run folder's result.json differ on " + ", ".join(differing[:8])
                            + (f" and {len(differing) - 8} more" if len(differing) > 8 else ""))
    if problems:
        return Check(subject, "witnesses", FAIL, "record inconsistent: " + "; ".join(problems))
    if not heard:
        return Check(subject, "witnesses", SKIP, "no witness in this record (a record of an older suite)")
    return Check(subject, "witnesses", PASS, f"{len(questioned)} figures and facts heard by {heard} witnesses, the "
                                             "run folder's copy included" if copy is not None else
                 f"{len(questioned)} figures and facts heard by {heard} witnesses (no copy in a run folder)")


def check_listing(store: ResultsStore, results: Sequence[RunResult], ended: bool = True) -> Check:
    """results.json's runs against the run folders beside it: a run listed twice (one run_uid), a run folder whose
    record results.json does not list (a configuration deleted from the listing) FAIL; a listed run whose folder is
    gone cannot be cross-examined (INCONCLUSIVE). A matrix that has not ended (``ended`` false) may hold a run its
    runner has not listed yet: an unlisted run folder is INCONCLUSIVE there."""
    counts = Counter(r.run_uid for r in results if r.run_uid)
    problems = [f"run {uid} is listed {n} times" for uid, n in sorted(counts.items()) if n > 1]
    unlisted: list[str] = []
    try:
        on_disk = list(store.runs_on_disk())
    except (SuiteError, ValueError) as exc:
        on_disk = []
        problems.append(f"a run folder cannot be read: {exc}")
    for files, record, _ in on_disk:
        if record is not None and record.run_uid and record.run_uid not in counts:
            unlisted.append(f"runs/{files.folder.name} holds run {record.run_uid} ({record.status}), which "
                            "results.json does not list")
    if not ended and unlisted and not problems:
        return Check("matrix", "listing", INCONCLUSIVE, "the matrix has not ended: " + "; ".join(unlisted[:4]))
    problems += unlisted
    if problems:
        return Check("matrix", "listing", FAIL, "record inconsistent: " + "; ".join(problems[:8])
                     + (f" and {len(problems) - 8} more" if len(problems) > 8 else ""))
    gone = [r.config.config_id for r in results
            if (folder := store.run_folder(r)) is not None and not folder.is_dir()]
    if gone:
        return Check("matrix", "listing", INCONCLUSIVE, f"{len(gone)} listed run(s) have no run folder here (e.g. "
                                                       f"{gone[0]}): their copies, manifests and logs cannot witness "
                                                       "them")
    return Check("matrix", "listing", PASS, f"{len(counts)} runs listed once each, every run folder's record listed")
