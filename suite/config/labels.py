"""Configurations as people give and read them: short labels that tell configurations apart, and the config file
that ``suite run --config`` reads."""

from __future__ import annotations

import os
from dataclasses import fields
from typing import Any, Sequence

from suite.config.matrix import MatrixSpec
from suite.config.run import AXES, RunConfig, param_text
from suite.config.settings import MAX_REPEATS
from suite.errors import ConfigError
from suite.fileio import loads_bounded, read_regular_file

#: The axes a person reads a configuration by, as (name shown, field), in the order shown: :data:`AXES`'s.
LABEL_AXES = tuple((label, field_) for label, field_, _ in AXES)


def short_labels(configs: Sequence[RunConfig]) -> dict[str, str]:
    """config_id -> the axes that vary among ``configs``, named as :meth:`RunConfig.describe` names them
    (``workers=2 loader=cpu-fast precision=bf16``): what tells the configurations of one matrix apart. A lone
    configuration gets its whole description; configurations that differ only outside these axes (dataset,
    steps...) also get their id's digest."""
    unique = list({c.config_id: c for c in configs}.values())
    if len(unique) < 2:
        return {c.config_id: c.describe() for c in unique}
    varying = [(name, field_) for name, field_ in LABEL_AXES if len({getattr(c, field_) for c in unique}) > 1]
    labels = {c.config_id: " ".join(f"{name}={param_text(getattr(c, field_))}" for name, field_ in varying)
              for c in unique}
    counts: dict[str, int] = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    return {cid: (label if counts[label] == 1 else f"{label} #{cid.rsplit('-', 1)[-1]}").strip()
            for cid, label in labels.items()}


FILE_RUN_OPTIONS: dict[str, type | tuple[type, ...]] = {"repeats": int, "memory_limit": (int, float),
                                                        "experiment": str}


#: The largest config file read: a matrix's fields take a few hundred bytes.
CONFIG_MAX_BYTES = 2**20


def load_config_file(path: "str | os.PathLike[str]") -> dict[str, Any]:
    """A config file's fields (JSON, or TOML by suffix): :class:`MatrixSpec` fields and
    :data:`FILE_RUN_OPTIONS`. Unknown fields and wrongly typed settings raise :class:`ConfigError` naming them;
    the matrix fields themselves are validated by :meth:`MatrixSpec.from_dict`."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file does not exist: {path}")
    try:
        text = read_regular_file(path, CONFIG_MAX_BYTES, "config file").decode("utf-8")
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = loads_bounded(text, f"config file {path}", CONFIG_MAX_BYTES * 64)
    except RecursionError:
        raise ConfigError(f"cannot read config file {path}: nested too deeply") from None
    except (ValueError, ImportError, OSError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table/object of fields")
    spec_fields = {f.name for f in fields(MatrixSpec)}
    unknown = sorted(set(data) - spec_fields - set(FILE_RUN_OPTIONS))
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {', '.join(unknown)}; valid fields: "
                          f"{', '.join(sorted(spec_fields | set(FILE_RUN_OPTIONS)))}")
    for name, kind in FILE_RUN_OPTIONS.items():
        if name in data and (isinstance(data[name], bool) or not isinstance(data[name], kind)):
            raise ConfigError(f"{path}: {name} must be a {getattr(kind, '__name__', 'number')}, got {data[name]!r}")
    if not 1 <= data.get("repeats", 1) <= MAX_REPEATS:
        raise ConfigError(f"{path}: repeats must be from 1 to {MAX_REPEATS}, got {data['repeats']}")
    if "memory_limit" in data and not data["memory_limit"] > 0:
        raise ConfigError(f"{path}: memory_limit must be > 0 (GiB), got {data['memory_limit']}")
    return data
