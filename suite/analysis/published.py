"""Measured results beside published ones, as ratios measured within each side.

Absolute numbers from different machines do not compare; ratios do: more workers vs none, one device vs
another, device decoding vs the CPU loader, each with every other axis equal. A cell of either table is a
:class:`Cell` (device, loader, workers, precision, engine); the published file says which precision and engine
its figures were measured with (``suite_config``). Two measured rows that fall on one cell (they differ in an
axis the published table does not have, e.g. the prefetch factor or the batch size) are an error naming both,
never a silent choice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Iterable

from suite.errors import SuiteError


@dataclass(frozen=True, order=True)
class Cell:
    device: str
    loader: str
    workers: int
    precision: str
    engine: str

    @property
    def context(self) -> str:
        return f"{self.precision} {self.engine}"


@dataclass(frozen=True)
class Ratio:
    name: str
    published: float | None
    measured: float | None


def reference_dirs() -> list[Path]:
    """Where reference data is looked up: ``./reference`` and the source checkout's ``reference/``."""
    checkout = Path(__file__).resolve().parents[2] / "reference"
    return [Path.cwd() / "reference", checkout]


def load_reference(name_or_path: str) -> tuple[Path, dict[str, Any]]:
    path = Path(name_or_path)
    if not path.is_file():
        candidates = [d / f"{name_or_path}.json" for d in reference_dirs()]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            names = sorted({p.stem for d in reference_dirs() if d.is_dir() for p in d.glob("*.json")
                            if "results" in json.loads(p.read_text())})
            raise SuiteError(f"unknown reference {name_or_path!r}; available: {', '.join(names) or 'none'}")
        path = found
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SuiteError(f"cannot read published results {path}: {exc}") from None
    if not isinstance(data, dict) or "results" not in data or "suite_config" not in data:
        raise SuiteError(f"{path} is not a published-results file (needs 'results' and 'suite_config')")
    return path, data


def reference_table(data: dict[str, Any]) -> dict[Cell, float]:
    suite_config = data["suite_config"]
    return {Cell(r["device"], r["loader"], r["dataloader_num_workers"], suite_config["precision"],
                 suite_config["engine"]): r["throughput_samples_per_s"] for r in data["results"]}


def measured_table(rows: Iterable[Any]) -> dict[Cell, float]:
    """Throughput per cell from :class:`suite.analysis.compare.Row` s; two rows on one cell are an error."""
    table: dict[Cell, float] = {}
    owner: dict[Cell, str] = {}
    for row in rows:
        c = row.config
        cell = Cell(c.device, c.loader, c.num_workers, c.precision, c.engine)
        if cell in table:
            raise SuiteError(f"configurations {owner[cell]} and {row.config_id} both measure {cell.device}, "
                             f"loader {cell.loader}, workers {cell.workers}, {cell.context}: select one "
                             "(a results folder of one matrix, or --filter)")
        table[cell], owner[cell] = row.metrics["throughput_samples_per_s"], row.config_id
    return table


def ratios(table: dict[Cell, float]) -> dict[str, float]:
    """Every ratio the table supports, in a stable order (cells sorted)."""
    out: dict[str, float] = {}
    cells = sorted(table)
    for cell in cells:
        base = table.get(Cell(cell.device, cell.loader, 0, cell.precision, cell.engine))
        if cell.workers > 0 and base:
            out[f"{cell.device} {cell.loader}-loader {cell.context}: workers {cell.workers} vs 0"] = table[cell] / base
    devices = sorted({c.device for c in cells})
    for a, b in combinations(devices, 2):
        for cell in cells:
            other = Cell(b, cell.loader, cell.workers, cell.precision, cell.engine)
            if cell.device == a and other in table:
                out[f"{a} vs {b}: {cell.loader}-loader {cell.context}, workers {cell.workers}"] = \
                    table[cell] / table[other]
    for cell in cells:  # on-device decode vs the CPU loader
        cpu = Cell(cell.device, "cpu", cell.workers, cell.precision, cell.engine)
        if cell.loader == "device" and cpu in table:
            out[f"{cell.device} {cell.context} workers {cell.workers}: device-loader vs cpu-loader"] = \
                table[cell] / table[cpu]
    return out


def compare(published: dict[Cell, float], measured: dict[Cell, float]) -> list[Ratio]:
    pub, mea = ratios(published), ratios(measured)
    names = list(pub) + [n for n in mea if n not in pub]
    return [Ratio(n, pub.get(n), mea.get(n)) for n in names]
