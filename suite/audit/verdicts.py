"""What an audit says: a check and its verdict (PASS, FAIL, INCONCLUSIVE, WARN, SKIP), the report that gathers them and
its verdict, and what the record checks read of one run (ours or published)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from suite.analysis.equivalence import DEFAULT_TOLERANCE, FAIL, INCONCLUSIVE, PASS

WARN, SKIP = "WARN", "SKIP"
DEFAULT_LOSS_RTOL = 1e-2
DEFAULT_THROUGHPUT_TOLERANCE = DEFAULT_TOLERANCE
#: ``suite audit``'s exit status per verdict.
EXIT_STATUS = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}


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


def verdicts_by_check(checks: Sequence[Check]) -> dict[str, str]:
    """Each check's verdict over its subjects: FAIL if any failed, else INCONCLUSIVE if any, else PASS / WARN / SKIP."""
    order = (FAIL, INCONCLUSIVE, WARN, PASS, SKIP)
    verdicts: dict[str, str] = {}
    for check in checks:
        seen = verdicts.get(check.name)
        if seen is None or order.index(check.verdict) < order.index(seen):
            verdicts[check.name] = check.verdict
    return verdicts
