"""How long a matrix will take, from earlier runs of the same configurations (``suite run --dry-run`` and the
progress display's first estimate).

A configuration's estimate is the median wall time (process start to recorded end, set-up included) of its
FINISHED runs in the tracking store; one never run has none, and the total says how many are unknown. The matrix
adds what earlier matrices in the store spent around their configurations (starting the runner, opening MLflow,
the gaps): the median over them, said as such (a store without finished matrices adds nothing, and says so).
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
    overheads: tuple[float, ...] = ()  # earlier matrices: their duration less their configurations'

    @property
    def overhead_s(self) -> float:
        return float(statistics.median(self.overheads)) if self.overheads else 0.0

    @property
    def known_s(self) -> float:
        return sum(v for v in self.per_config.values() if v is not None) * self.repeats

    @property
    def unknown(self) -> int:
        return sum(v is None for v in self.per_config.values())

    def total_text(self) -> str:
        if not self.per_config or self.unknown == len(self.per_config):
            return "unknown (no earlier run of these configurations in the store)"
        runs = sum(self.history.values())
        text = (f"about {format_duration(self.known_s + self.overhead_s)}: the configurations' median durations in "
                f"{runs} earlier run(s), {format_duration(self.known_s)}")
        text += (f", plus {format_duration(self.overhead_s)} around them (the median over {len(self.overheads)} "
                 "earlier matri" + ("x" if len(self.overheads) == 1 else "ces") + " in this store)"
                 if self.overheads else ", plus the runner's own start and MLflow's (no earlier matrix to measure "
                 "them by)")
        if self.unknown:
            text += f"; {self.unknown} configuration(s) never run before are not counted"
        return text


def estimate(configs: Sequence[RunConfig], durations: Mapping[str, Sequence[float]], repeats: int = 1,
             overheads: Sequence[float] = ()) -> Estimate:
    per_config = {c.config_id: (float(statistics.median(durations[c.config_id]))
                                if durations.get(c.config_id) else None) for c in configs}
    return Estimate(per_config, {c.config_id: len(durations.get(c.config_id) or ()) for c in configs}, repeats,
                    tuple(overheads))


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
