"""One configuration run (:class:`RunConfig`): its identity, its label, its MLflow params and back."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from suite.config.settings import (
    ENGINES,
    LOADERS,
    PRECISIONS,
    UNSAFE_IN_ID,
    RunSettings,
    require_choice,
    require_int,
    require_name,
)
from suite.errors import ConfigError
from suite.text import utf8_text

#: The axes a configuration is described by, in order: (label, field, where :meth:`RunConfig.describe` shows it:
#: ``always``, ``set`` where it differs from no-choice (``None``, one process, one node), ``varying`` only where
#: configurations of a matrix differ in it, :func:`suite.config.labels.short_labels`). The one place a description
#: is spelled (describe, short labels, plots, a speed-up's baseline).
AXES: tuple[tuple[str, str, str], ...] = (
    ("device", "device", "always"), ("workers", "num_workers", "always"), ("loader", "loader", "always"),
    ("precision", "precision", "always"), ("engine", "engine", "always"), ("prefetch", "prefetch_factor", "set"),
    ("nproc", "nproc_per_node", "set"), ("nodes", "nnodes", "set"), ("batch", "batch_size", "varying"),
    ("seed", "seed", "varying"),
)
#: What "set" means for each such axis: its value when nothing was chosen.
_UNSET = {"prefetch_factor": None, "nproc_per_node": 1, "nnodes": 1}


def describe_fields(values: Mapping[str, Any], shown: Sequence[str] | None = None) -> str:
    """``values`` (field -> value) as :meth:`RunConfig.describe` writes them (``workers=0 loader=cpu``), in
    :data:`AXES` order; ``shown``: the fields written (default: every one given, but those that are None)."""
    return " ".join(f"{label}={param_text(values[field_])}" for label, field_, _ in AXES if field_ in values
                    and (field_ in shown if shown is not None else values[field_] is not None))


def param_text(value: Any) -> str:
    """How a value is written as an MLflow param or tag: ``None`` is ``default``, booleans ``true``/``false``,
    sequences comma-separated (``0,1,2``), everything else ``str`` (a path that is not UTF-8 with its undecodable
    bytes escaped: :func:`suite.text.utf8_text`). One spelling for every writer."""
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(param_text(v) for v in value)
    return utf8_text(str(value))


def _from_param_text(name: str, text: str, annotation: str) -> Any:
    if text == "default" and "None" in annotation:
        return None
    if annotation.startswith("bool"):
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ConfigError(f"param {name}={text!r} is not true or false")
    if annotation.startswith("float"):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"param {name}={text!r} is not a number") from None
    if annotation.startswith("int"):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"param {name}={text!r} is not an integer") from None
    return text


#: `suite run` settings a config file may hold besides the matrix fields (:class:`MatrixSpec`), with their types.


@dataclass(frozen=True, kw_only=True)
class RunConfig(RunSettings):
    """One benchmark configuration, exactly as it is run and recorded.

    ``batch_size`` is the per-device batch size actually used; :func:`suite.run.matrix.resolve` fills it
    from the workload preset when the user gave none, so that the recorded value is the used one.
    """

    device: str
    num_workers: int
    loader: str
    precision: str
    engine: str = "suite"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_name("device", self.device)
        require_int("num_workers", self.num_workers, 0)
        require_choice("loader", self.loader, LOADERS)
        require_choice("precision", self.precision, PRECISIONS)
        require_choice("engine", self.engine, ENGINES)

    @property
    def batch(self) -> int:
        """The per-device batch size a run uses: ``batch_size``, which :func:`suite.run.matrix.resolve` fills from the
        preset before any run (a configuration without one cannot run)."""
        if self.batch_size is None:
            raise ConfigError("batch_size is not resolved: the matrix resolves it from the preset before a run")
        return self.batch_size

    @property
    def config_id(self) -> str:
        """The one key of this configuration, built here only: every reader (results folders, MLflow, compare,
        scores, published ratios, audits) keys on it.

        It names the axes a reader scans for (workload, preset, device, workers, loader, precision, engine,
        prefetch factor, processes per node, batch size, seed) and ends with a digest of every field that
        differs from its default, so two configurations that differ anywhere (dataset, weights, steps...)
        never share an id. Fields added later with a default leave existing ids unchanged.
        """
        parts = [self.workload, self.preset, self.device, f"nw{self.num_workers}", self.loader, self.precision,
                 self.engine]
        if self.prefetch_factor is not None:
            parts.append(f"pf{self.prefetch_factor}")
        if self.nproc_per_node > 1:
            parts.append(f"np{self.nproc_per_node}")
        if self.nnodes > 1:
            parts.append(f"nn{self.nnodes}")
        parts += [f"b{self.batch_size if self.batch_size is not None else 'default'}", f"s{self.seed}",
                  self.digest()[:8]]
        return "-".join(UNSAFE_IN_ID.sub("_", part) for part in parts)

    def digest(self) -> str:
        """sha256 over the identity fields that differ from their defaults (canonical JSON, sorted keys); run
        controls (bounds, time limits) are left out."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("identity", True)
                and (f.default is dataclasses.MISSING or getattr(self, f.name) != f.default)}
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "RunConfig":
        """Build from a mapping (JSON as read), rejecting anything else, and unknown and missing keys, by name."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a configuration must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown config field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(known))}"
            )
        required = sorted(f.name for f in fields(cls) if f.default is dataclasses.MISSING and f.name not in data)
        if required:
            raise ConfigError(f"missing config field(s) {', '.join(required)}")
        return cls(**dict(data))

    def as_params(self) -> dict[str, str]:
        """Every field as MLflow param text (see :func:`param_text`)."""
        return {k: param_text(v) for k, v in self.to_dict().items()}

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> "RunConfig":
        """The inverse of :meth:`as_params`: a configuration read back from MLflow params."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in params:
                continue
            values[f.name] = _from_param_text(f.name, params[f.name], str(f.type))
        return cls.from_dict(values)

    def describe(self, leave_out: tuple[str, ...] = ()) -> str:
        """The configuration as people read it: each axis named (``device=cpu workers=0 loader=cpu ...``), those of
        :data:`AXES` shown always, the others where they are not their default; ``leave_out``: fields not shown (a
        plot's line is every axis but the worker count)."""
        shown = [f for _, f, where in AXES if f not in leave_out and
                 (where == "always" or (where == "set" and getattr(self, f) != _UNSET[f]))]
        return describe_fields({f: getattr(self, f) for f in shown})
