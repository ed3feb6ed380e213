"""A matrix (:class:`MatrixSpec`): the shared settings and the axes, expanded into configuration runs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping

from suite.config.run import RunConfig
from suite.config.settings import RunSettings
from suite.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class MatrixSpec(RunSettings):
    """The axes of a benchmark matrix; :meth:`expand` gives one :class:`RunConfig` per point."""

    devices: tuple[str, ...] = ("cpu",)
    workers: tuple[int, ...] = (0, 1, 2)
    loaders: tuple[str, ...] = ("cpu",)
    precisions: tuple[str, ...] = ("fp32",)
    engines: tuple[str, ...] = ("suite",)
    axes: ClassVar[tuple[str, ...]] = ("devices", "workers", "loaders", "precisions", "engines")

    def __post_init__(self) -> None:
        super().__post_init__()
        for axis in self.axes:
            values = getattr(self, axis)
            if not values:
                raise ConfigError(f"{axis} must list at least one value")
            if len(set(values)) != len(values):
                raise ConfigError(f"{axis} lists a value twice: {list(values)}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MatrixSpec":
        """Build from a mapping (e.g. a config file), rejecting unknown keys and wrongly typed axes by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(known))}")
        values = dict(data)
        axis_types = {"devices": str, "workers": int, "loaders": str, "precisions": str, "engines": str}
        for axis, item_type in axis_types.items():
            if axis in values:
                items = values[axis]
                if not isinstance(items, (list, tuple)) or not all(
                        isinstance(i, item_type) and not isinstance(i, bool) for i in items):
                    raise ConfigError(f"{axis} must be a list of {item_type.__name__}s, got {items!r}")
                values[axis] = tuple(items)
        return cls(**values)

    def expand(self) -> list[RunConfig]:
        """All configurations, device-major, in a stable order. Each is validated."""
        return [
            RunConfig(device=device, num_workers=workers, loader=loader, precision=precision, engine=engine,
                      **self.settings())
            for device, engine, loader, precision, workers in itertools.product(
                self.devices, self.engines, self.loaders, self.precisions, self.workers
            )
        ]
