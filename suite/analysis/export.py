"""Runs as a table, for the hundreds a team collects: one row per configuration run (each repeat its own), with its
source, identity, status, every configuration field (``config.<field>``), every metric under its own name, and its
facts flattened (``facts.<path>``; a list or a mapping left at the leaves as JSON text). Written as CSV and Parquet
(pandas, pyarrow) by ``suite export``.

A metric can never take an identity column's place: one named like a leading column (``config_id``, ``status``...)
or like a configuration or fact column (``config.device``) is exported as ``metric.<name>``. In ``runs.csv`` a text
cell a spreadsheet would evaluate (starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) is written
behind a ``'``, as OWASP's CSV-injection advice has it; numbers stay numbers, and Parquet keeps the text as it is.
Text that cannot be UTF-8 (a path's undecodable byte) is written with that byte escaped (``\\udcff``)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from suite.fileio import write_bytes_atomic, write_text_atomic
from suite.results.record import RunResult
from suite.text import utf8_text

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


def metric_columns(metrics: Mapping[str, float]) -> dict[str, float]:
    """Metrics under their own names, but any name that is an identity column's or lies in the configuration's or
    the facts' columns, which becomes ``metric.<name>``: a record cannot overwrite who a row is."""
    return {(f"metric.{name}" if name in LEADING or name.startswith(RESERVED_PREFIXES) else name): value
            for name, value in metrics.items()}


#: Column prefixes that only the configuration and the facts write.
RESERVED_PREFIXES = ("config.", "facts.", "metric.")


def row_of_result(result: RunResult, source: str) -> dict[str, Any]:
    """A run as one row: its identity columns (:data:`LEADING`), then its configuration, metrics and facts. The
    identity is written last: nothing before it can take its place."""
    return {**metric_columns(result.metrics), **flatten("facts", result.facts),
            **flatten("config", result.config.to_dict()),
            "source": source, "run_uid": result.run_uid, "mlflow_run_id": result.mlflow_run_id,
            "config_id": result.config.config_id, "status": result.status, "reason": result.reason,
            "repeat": result.repeat, "started_at": result.started_at, "ended_at": result.ended_at}


#: What a spreadsheet reads as the start of a formula (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: text starting like a formula behind a ``'``; anything else as it is."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def write_tables(rows: Iterable[Mapping[str, Any]], folder: Path) -> tuple[Path, Path, int]:
    """``runs.csv`` and ``runs.parquet`` in ``folder`` (created), the leading columns first, then the others in
    sorted order; returns both paths and the row count."""
    import pandas as pd

    # text that is not UTF-8 (a path's undecodable byte) written escaped: neither pandas nor Parquet takes it
    frame = pd.DataFrame([{utf8_text(name): utf8_text(value) if isinstance(value, str) else value
                           for name, value in row.items()} for row in rows])
    columns = [c for c in LEADING if c in frame.columns] + sorted(c for c in frame.columns if c not in LEADING)
    frame = frame[columns]
    for column in frame.columns:  # a column of mixed types (a fact that is a number here, text there) is text
        kinds = {type(v) for v in frame[column].dropna()}
        if len(kinds) > 1 and not kinds <= {int, float}:
            frame[column] = frame[column].map(lambda v: None if v is None or v != v else str(v))
    csv, parquet = folder / "runs.csv", folder / "runs.parquet"
    table = io.BytesIO()
    frame.to_parquet(table, index=False)
    cells = frame.copy()
    for column in cells.columns:
        if not pd.api.types.is_numeric_dtype(cells[column]):
            cells[column] = cells[column].map(spreadsheet_safe)
    write_text_atomic(csv, cells.to_csv(index=False))  # each made new and renamed into place: a link is replaced
    write_bytes_atomic(parquet, table.getvalue())
    return csv, parquet, len(frame)
