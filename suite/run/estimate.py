"""How long a matrix will take, from earlier runs of the same configurations (``suite run --dry-run`` and the
progress display's first estimate).

A configuration's estimate is the median wall time (process start to recorded end, set-up included) of its
FINISHED runs in the tracking store; one never run has none, and the total says how many are unknown.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

from suite.config import RunConfig


@dataclass(frozen=True)
class Estimate:
    per_config: dict[str, float | None]  # config_id -> seconds per run, None when never run
    history: dict[str, int]  # config_id -> how many earlier runs it is based on
    repeats: int = 1

    @property
    def known_s(self) -> float:
        return sum(v for v in self.per_config.values() if v is not None) * self.repeats

    @property
    def unknown(self) -> int:
        return sum(v is None for v in self.per_config.values())

    def total_text(self) -> str:
        if not self.per_config or self.unknown == len(self.per_config):
            return "unknown (no earlier run of these configurations in the store)"
        text = f"about {format_duration(self.known_s)}"
        if self.unknown:
            text += f" plus {self.unknown} configuration(s) never run before (unknown)"
        return text


def estimate(configs: Sequence[RunConfig], durations: Mapping[str, Sequence[float]], repeats: int = 1) -> Estimate:
    per_config = {c.config_id: (float(statistics.median(durations[c.config_id]))
                                if durations.get(c.config_id) else None) for c in configs}
    return Estimate(per_config, {c.config_id: len(durations.get(c.config_id) or ()) for c in configs}, repeats)


def format_duration(seconds: float) -> str:
    """``45 s``, ``3 min 20 s``, ``1 h 05 min``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
