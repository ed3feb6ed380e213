"""Measured results beside published ones, as ratios measured within each side.

Absolute numbers from different machines do not compare; ratios do: more workers vs none, one device vs
another, device decoding vs the CPU loader, each with every other axis equal. :func:`align` lines the two sides up
by what a ratio compares (a :class:`RatioKind`), not by device, so a CPU run's "workers 2 vs 0" sits on the row of
Gaudi2's, H100's and A100's published one. A cell of either table is a
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
from suite.figures import THROUGHPUT_SAMPLES_PER_S


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


def reference_dirs() -> list[Path]:
    """Where reference data is looked up: ``./reference`` and the source checkout's ``reference/``."""
    checkout = Path(__file__).resolve().parents[2] / "reference"
    return [Path.cwd() / "reference", checkout]


def _load_json_reference(name_or_path: str, required: tuple[str, ...], what: str) -> tuple[Path, dict[str, Any]]:
    """A reference file named by path, or by name under :func:`reference_dirs`; it must hold the ``required``
    keys (``what`` names the kind of file in the errors)."""
    path = Path(name_or_path)
    if not path.is_file():
        candidates = [d / f"{name_or_path}.json" for d in reference_dirs()]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            names = sorted({p.stem for d in reference_dirs() if d.is_dir() for p in d.glob("*.json")
                            if all(key in json.loads(p.read_text()) for key in required)})
            raise SuiteError(f"unknown reference {name_or_path!r}; available: {', '.join(names) or 'none'}")
        path = found
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SuiteError(f"cannot read {what} {path}: {exc}") from None
    if not isinstance(data, dict) or any(key not in data for key in required):
        raise SuiteError(f"{path} is not a {what} file (needs {' and '.join(repr(k) for k in required)})")
    return path, data


def load_reference(name_or_path: str) -> tuple[Path, dict[str, Any]]:
    """Published results (``reference/<name>.json``: a benchmark's published table and its suite configuration)."""
    return _load_json_reference(name_or_path, ("results", "suite_config"), "published-results")


def refuse_other_workload(path: Path, data: dict[str, Any], workloads: Iterable[str]) -> None:
    """:class:`SuiteError` where published figures (``suite_config.workload``) are of another workload than the
    measured rows': one workload's matrix is never set beside another's published figures."""
    published_for = (data.get("suite_config") or {}).get("workload")
    others = sorted({w for w in workloads if w != published_for})
    if published_for is not None and others:
        raise SuiteError(f"{path.name} publishes figures of workload {published_for!r}, and these runs are of "
                         f"{', '.join(repr(w) for w in others)}: not set side by side")


def load_quality_reference(name_or_path: str) -> tuple[Path, dict[str, Any]]:
    """A quality reference (``reference/tiny_quality_reference.json``: steps to a target over seeds, per
    transformers line, and the configuration they ran)."""
    return _load_json_reference(name_or_path, ("lines", "config", "target"), "quality-reference")


def reference_table(data: dict[str, Any]) -> dict[Cell, float]:
    suite_config = data["suite_config"]
    return {Cell(r["device"], r["loader"], r["dataloader_num_workers"], suite_config["precision"],
                 suite_config["engine"]): r[THROUGHPUT_SAMPLES_PER_S] for r in data["results"]}


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
        table[cell], owner[cell] = row.metrics[THROUGHPUT_SAMPLES_PER_S], row.config_id
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


DECODE_LOADERS = ("device", "dali")  # loaders that decode on the device, set beside the CPU loader


@dataclass(frozen=True, order=True)
class Series:
    """One column of an aligned table: a device measured (or published) under one precision and engine."""

    device: str
    precision: str
    engine: str

    @property
    def label(self) -> str:
        return f"{self.device} {self.precision} {self.engine}"


@dataclass(frozen=True, order=True)
class RatioKind:
    """What a ratio compares, whatever the device: ``loader`` at ``workers`` over ``base_loader`` at
    ``base_workers`` (workers N vs 0 on one loader, or on-device decode vs the CPU loader at N workers)."""

    loader: str
    workers: int
    base_loader: str
    base_workers: int

    @property
    def label(self) -> str:
        if self.loader == self.base_loader:
            return f"loader {self.loader}: workers {self.workers} vs {self.base_workers}"
        return f"workers {self.workers}: loader {self.loader} vs {self.base_loader}"

    def cells(self, series: Series) -> tuple[Cell, Cell]:
        return (Cell(series.device, self.loader, self.workers, series.precision, series.engine),
                Cell(series.device, self.base_loader, self.base_workers, series.precision, series.engine))


@dataclass(frozen=True)
class AlignedRatio:
    """One ratio kind, published per published series and measured per measured series, on one row; ``why``
    says, per series without a figure, what it lacks."""

    kind: RatioKind
    published: dict[Series, float]
    measured: dict[Series, float]
    why: dict[Series, str]


@dataclass(frozen=True)
class Alignment:
    """Published and measured figures side by side: absolute samples/s per (loader, workers) and ratios per
    :class:`RatioKind`, each with a column per series."""

    published_series: list[Series]
    measured_series: list[Series]
    absolute: dict[tuple[str, int], dict[Series, float]]
    ratios: list[AlignedRatio]


def _series(table: dict[Cell, float]) -> list[Series]:
    """The table's series in the order they first appear (the published file's order: gaudi2, h100, a100)."""
    return list(dict.fromkeys(Series(c.device, c.precision, c.engine) for c in table))


def _kinds(table: dict[Cell, float], series: Series) -> list[RatioKind]:
    cells = [c for c in table if Series(c.device, c.precision, c.engine) == series]
    kinds = [RatioKind(c.loader, c.workers, c.loader, 0) for c in cells if c.workers > 0]
    kinds += [RatioKind(c.loader, c.workers, "cpu", c.workers) for c in cells if c.loader in DECODE_LOADERS]
    return [k for k in kinds if k.cells(series)[1] in table]


def align(published: dict[Cell, float], measured: dict[Cell, float]) -> Alignment:
    """Line published and measured figures up by what they compare, not by device: every ratio kind either side
    supports is one row, with a figure (or the reason there is none) for every series of both sides."""
    pub_series, mea_series = _series(published), _series(measured)
    absolute: dict[tuple[str, int], dict[Series, float]] = {}
    for table in (published, measured):
        for cell, value in table.items():
            absolute.setdefault((cell.loader, cell.workers), {})[Series(cell.device, cell.precision,
                                                                        cell.engine)] = value
    kinds = sorted({k for s in pub_series for k in _kinds(published, s)}
                   | {k for s in mea_series for k in _kinds(measured, s)},
                   key=lambda k: (k.loader != k.base_loader, k.loader, k.workers))
    rows = []
    for kind in kinds:
        values: dict[str, dict[Series, float]] = {"published": {}, "measured": {}}
        why: dict[Series, str] = {}
        for side, table, series_list in (("published", published, pub_series), ("measured", measured, mea_series)):
            for series in series_list:
                top, base = kind.cells(series)
                if top in table and base in table:
                    values[side][series] = table[top] / table[base]
                    continue
                why[series] = "no run of " + " nor of ".join(f"loader={c.loader} workers={c.workers}"
                                                           for c in (top, base) if c not in table)
        rows.append(AlignedRatio(kind, values["published"], values["measured"], why))
    return Alignment(pub_series, mea_series, dict(sorted(absolute.items())), rows)
