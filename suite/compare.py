"""Measured results beside published ones, as ratios measured within each side.

Absolute numbers from different machines do not compare; ratios do: device vs device at the same
loader and worker count, and more workers vs none on the same device. ``suite compare --reference
NAME [RESULTS]`` prints each published ratio with the measured one where the measured matrix has it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Iterable

from suite.errors import SuiteError

Cell = tuple[str, str, int]  # (device, loader, dataloader_num_workers)


def reference_dirs() -> list[Path]:
    """Where reference data is looked up: ``./reference`` and the source checkout's ``reference/``."""
    checkout = Path(__file__).resolve().parents[1] / "reference"
    return [Path.cwd() / "reference", checkout]


def load_reference(name_or_path: str) -> tuple[Path, dict[str, Any]]:
    path = Path(name_or_path)
    if not path.is_file():
        candidates = [d / f"{name_or_path}.json" for d in reference_dirs()]
        path = next((c for c in candidates if c.is_file()), None)  # type: ignore[assignment]
        if path is None:
            names = sorted({p.stem for d in reference_dirs() if d.is_dir() for p in d.glob("*.json")
                            if "results" in json.loads(p.read_text())})
            raise SuiteError(f"unknown reference {name_or_path!r}; available: {', '.join(names) or 'none'}")
    data = json.loads(path.read_text())
    if "results" not in data:
        raise SuiteError(f"{path} is not a published-results file (no 'results')")
    return path, data


def reference_table(data: dict[str, Any]) -> dict[Cell, float]:
    return {(r["device"], r["loader"], r["dataloader_num_workers"]): r["throughput_samples_per_s"]
            for r in data["results"]}


def measured_table(rows: Iterable[Any]) -> dict[Cell, float]:
    """Throughput per cell from :class:`suite.comparison.Row` s (scores where repeats were scored)."""
    table: dict[Cell, float] = {}
    for row in rows:
        table.setdefault((row.device, row.loader, row.num_workers), row.metrics["throughput_samples_per_s"])
    return table


@dataclass(frozen=True)
class Ratio:
    name: str
    published: float | None
    measured: float | None


def ratios(table: dict[Cell, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    devices = list(dict.fromkeys(d for d, _, _ in table))  # in the table's own order
    for device, loader, workers in table:
        base = table.get((device, loader, 0))
        if workers > 0 and base:
            out[f"{device} {loader}-loader: workers {workers} vs 0"] = table[(device, loader, workers)] / base
    for a, b in combinations(devices, 2):
        for (device, loader, workers), value in table.items():
            if device == a and (b, loader, workers) in table:
                out[f"{a} vs {b}: {loader}-loader, workers {workers}"] = value / table[(b, loader, workers)]
    for device, loader, workers in table:  # on-device decode vs the CPU loader
        if loader == "device" and (device, "cpu", workers) in table:
            out[f"{device} workers {workers}: device-loader vs cpu-loader"] = (
                table[(device, "device", workers)] / table[(device, "cpu", workers)])
    return out


def compare(published: dict[Cell, float], measured: dict[Cell, float]) -> list[Ratio]:
    pub, mea = ratios(published), ratios(measured)
    names = list(pub) + [n for n in mea if n not in pub]
    return [Ratio(n, pub.get(n), mea.get(n)) for n in names]
