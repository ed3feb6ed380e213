"""Runs as a table, for the hundreds a team collects: one row per configuration run (each repeat its own), with its
source, identity, status, every configuration field (``config.<field>``), every metric under its own name, and its
facts flattened (``facts.<path>``; a list or a mapping left at the leaves as JSON text). Written as CSV and Parquet
(pandas, pyarrow) by ``suite export``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from suite.results.record import RunResult

#: The columns every row starts with, in this order.
LEADING = ("source", "run_uid", "mlflow_run_id", "config_id", "status", "reason", "repeat", "started_at", "ended_at")


def flatten(prefix: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"<prefix>.a.b": 1}``; a list, or a value that is not a number, text, a boolean or
    None, as its JSON text (a table cell holds one value)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(name, value))
        elif value is None or isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, default=str)
    return flat


def row_of_result(result: RunResult, source: str) -> dict[str, Any]:
    """A results folder's run as one row."""
    return {"source": source, "run_uid": result.run_uid, "mlflow_run_id": result.mlflow_run_id,
            "config_id": result.config.config_id, "status": result.status, "reason": result.reason,
            "repeat": result.repeat, "started_at": result.started_at, "ended_at": result.ended_at,
            **flatten("config", result.config.to_dict()), **result.metrics, **flatten("facts", result.facts)}


def write_tables(rows: Iterable[Mapping[str, Any]], folder: Path) -> tuple[Path, Path, int]:
    """``runs.csv`` and ``runs.parquet`` in ``folder`` (created), the leading columns first, then the others in
    sorted order; returns both paths and the row count."""
    import pandas as pd

    frame = pd.DataFrame(list(rows))
    columns = [c for c in LEADING if c in frame.columns] + sorted(c for c in frame.columns if c not in LEADING)
    frame = frame[columns]
    for column in frame.columns:  # a column of mixed types (a fact that is a number here, text there) is text
        kinds = {type(v) for v in frame[column].dropna()}
        if len(kinds) > 1 and not kinds <= {int, float}:
            frame[column] = frame[column].map(lambda v: None if v is None or v != v else str(v))
    folder.mkdir(parents=True, exist_ok=True)
    csv, parquet = folder / "runs.csv", folder / "runs.parquet"
    frame.to_csv(csv, index=False)
    frame.to_parquet(parquet, index=False)
    return csv, parquet, len(frame)
