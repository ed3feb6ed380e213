"""Run configurations and the benchmark matrix.

A :class:`RunConfig` is one point of the matrix (device x ``dataloader_num_workers`` x loader x
precision, for one workload and preset). A :class:`MatrixSpec` expands into run configurations.
Both validate themselves on construction and raise :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Mapping, Sequence

from suite.errors import ConfigError

#: Loaders: ``cpu`` decodes and preprocesses images in DataLoader workers (the reference method);
#: ``cpu-fast`` does the same in the workers with the workload's faster pipeline of equal output;
#: ``device`` ships encoded image bytes and decodes them on the device (nvJPEG, Gaudi media pipe, ...);
#: ``dali`` ships encoded bytes and decodes/preprocesses them with NVIDIA DALI.
LOADERS = ("cpu", "cpu-fast", "device", "dali")
#: ``suite``: the suite's own training loop; ``hf-trainer``: transformers' ``Trainer`` (optimum-habana's
#: ``GaudiTrainer`` on Gaudi2), as the published benchmark ran, measured with the suite's accounting.
ENGINES = ("suite", "hf-trainer")
#: ``fp32``: no autocast; ``bf16``: bfloat16 autocast (mixed precision), as in the reference.
PRECISIONS = ("fp32", "bf16")
#: MLPerf divisions: ``closed`` only for a run that follows the published recipe exactly.
DIVISIONS = ("open", "closed")
#: How a preset built on a checkpoint's tokenizer gets it: "auto" (the checkpoint's when it is on this machine, else a
#: local stand-in of its vocabulary size, recorded as such) or "hub" (the checkpoint's, fetched if needed).
TOKENIZER_MODES = ("auto", "hub")

DEFAULT_SEED = 42
DEFAULT_WARMUP_STEPS = 3  # the reference's throughput_warmup_steps
DEFAULT_STEPS = 30
#: Field metadata of run controls (bounds, time limits): recorded, but not part of a configuration's identity.
_CONTROL = {"identity": False}
#: Time allowed per configuration when no --timeout is given: set-up, plus this much per step.
SETUP_ALLOWANCE_S = 900.0
STEP_ALLOWANCE_S = 60.0
#: Longest wait for one batch from loader workers when no --loader-timeout is given.
DEFAULT_LOADER_TIMEOUT_S = 300.0
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")  # what may appear in a config id part


#: The largest count of steps, workers, processes... a configuration may name: far beyond any real run, and small
#: enough that every counter, timer and ETA built on it stays a finite machine number.
MAX_COUNT = 10**9
#: The largest seed: torch's generators take 64-bit seeds (a 24-digit seed failed every configuration).
MAX_SEED = 2**63 - 1
#: The longest time limit, seconds (about 31 years): larger ones (1e400 is infinity) disabled the watchdog.
MAX_SECONDS = 1e9
#: The largest memory amount in GiB a configuration may name (1 PiB).
MAX_GIB = 2.0**20


def _require_int(name: str, value: Any, minimum: int, maximum: int = MAX_COUNT) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        shown = str(value) if len(str(value)) <= 30 else f"a {len(str(value))}-digit number"
        raise ConfigError(f"{name} must be <= {maximum:,}, got {shown}")


def _require_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _require_name(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What every configuration of a matrix shares besides its axes; validated on construction."""

    workload: str
    preset: str
    steps: int = DEFAULT_STEPS
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    seed: int = DEFAULT_SEED
    batch_size: int | None = None
    dataset: str | None = None
    weights: str | None = None
    tokenizer: str = "auto"  # a checkpoint's tokenizer: "auto" (on this machine, else a local stand-in) or "hub"
    skip_bad_samples: bool = False
    nproc_per_node: int = 1  # processes (devices) per node, launched with torchrun when > 1
    nnodes: int = 1  # nodes per configuration: torchrun on each, meeting at rdzv_endpoint (c10d rendezvous)
    prefetch_factor: int | None = None  # batches each loader worker prepares ahead; None: torch's default (2)
    eval_every: int | None = None  # evaluate quality every N steps (and always at the end); None: at the end only
    target_quality: float | None = None  # train until eval_accuracy >= this (MLPerf's time-to-train), at most max_steps
    max_steps: int | None = None  # with target_quality: the most measured steps (default: 10 x steps)
    # Bounds and limits: they decide whether a run may go on, never what it measures, so they are not part
    # of a configuration's identity (see :attr:`RunConfig.config_id`).
    max_image_pixels: int | None = field(default=None, metadata=_CONTROL)  # None: Pillow's MAX_IMAGE_PIXELS
    max_image_bytes: int | None = field(default=None, metadata=_CONTROL)  # None: DEFAULT_MAX_IMAGE_BYTES
    max_caption_bytes: int | None = field(default=None, metadata=_CONTROL)  # None: the workload's default bound
    loader_memory_gib: float | None = field(default=None, metadata=_CONTROL)  # all loader workers' decoding at once
    allow_outside_links: bool = field(default=False, metadata=_CONTROL)  # symlinks leaving the dataset folder
    timeout_s: float | None = field(default=None, metadata=_CONTROL)  # None: derived from the steps; 0: none
    loader_timeout_s: float | None = field(default=None, metadata=_CONTROL)  # None: DEFAULT_LOADER_TIMEOUT_S
    # MLPerf submission metadata (mllog submission_*): who ran it and where; defaults are derived (see the README)
    submission_org: str | None = field(default=None, metadata=_CONTROL)  # None: the user running the suite
    submission_platform: str | None = field(default=None, metadata=_CONTROL)  # None: from the device's facts
    submission_division: str | None = field(default=None, metadata=_CONTROL)  # None: closed only for the recipe
    clear_caches: bool = field(default=False, metadata=_CONTROL)  # drop the OS page cache first (needs root)
    rdzv_endpoint: str | None = field(default=None, metadata=_CONTROL)  # HOST:PORT where the nodes meet (nnodes > 1)

    def __post_init__(self) -> None:
        _require_name("workload", self.workload)
        _require_name("preset", self.preset)
        _require_int("steps", self.steps, 1)
        _require_int("warmup_steps", self.warmup_steps, 0)
        _require_int("seed", self.seed, 0, MAX_SEED)
        if self.batch_size is not None:
            _require_int("batch_size", self.batch_size, 1)
        for name in ("dataset", "weights"):
            value = getattr(self, name)
            if value is not None:
                _require_name(name, value)
        _require_choice("tokenizer", self.tokenizer, TOKENIZER_MODES)
        if not isinstance(self.skip_bad_samples, bool):
            raise ConfigError(f"skip_bad_samples must be true or false, got {self.skip_bad_samples!r}")
        _require_int("nproc_per_node", self.nproc_per_node, 1)
        _require_int("nnodes", self.nnodes, 1)
        if self.nnodes > 1:
            host, colon, port = (self.rdzv_endpoint or "").rpartition(":")
            if not colon or not host or not port.isdigit():
                raise ConfigError(f"nnodes {self.nnodes} needs rdzv_endpoint HOST:PORT (where the nodes' torchrun "
                                  f"meet: the same on every node), got {self.rdzv_endpoint!r}")
        if self.prefetch_factor is not None:
            _require_int("prefetch_factor", self.prefetch_factor, 1)
        for name in ("max_image_pixels", "max_image_bytes", "max_caption_bytes"):
            if getattr(self, name) is not None:
                _require_int(name, getattr(self, name), 1, 2**48)
        if self.loader_memory_gib is not None and (
                isinstance(self.loader_memory_gib, bool) or not isinstance(self.loader_memory_gib, (int, float))
                or not 0 < self.loader_memory_gib <= MAX_GIB):
            raise ConfigError(f"loader_memory_gib must be a number of GiB in (0, {MAX_GIB:g}], got "
                              f"{self.loader_memory_gib!r}")
        if not isinstance(self.allow_outside_links, bool):
            raise ConfigError(f"allow_outside_links must be true or false, got {self.allow_outside_links!r}")
        if self.eval_every is not None:
            _require_int("eval_every", self.eval_every, 1)
        if self.target_quality is not None:
            if isinstance(self.target_quality, bool) or not isinstance(self.target_quality, (int, float)) \
                    or not 0 < self.target_quality <= 1:
                raise ConfigError(f"target_quality must be a recall in (0, 1], got {self.target_quality!r}")
        if self.max_steps is not None:
            _require_int("max_steps", self.max_steps, 1)
            if self.target_quality is None:
                raise ConfigError("max_steps bounds a run to a quality target: give target_quality too")
        for name in ("submission_org", "submission_platform"):
            if getattr(self, name) is not None:
                _require_name(name, getattr(self, name))
        if self.submission_division is not None:
            _require_choice("submission_division", self.submission_division, DIVISIONS)
        if not isinstance(self.clear_caches, bool):
            raise ConfigError(f"clear_caches must be true or false, got {self.clear_caches!r}")
        for name in ("timeout_s", "loader_timeout_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or
                                      not 0 <= value <= MAX_SECONDS):
                raise ConfigError(f"{name} must be a number of seconds from 0 (no limit) to {MAX_SECONDS:g}, got "
                                  f"{value!r}")

    @property
    def most_steps(self) -> int:
        """The most measured steps: ``steps``, or with a quality target ``max_steps`` (default 10 x steps)."""
        if self.target_quality is None:
            return self.steps
        return self.max_steps if self.max_steps is not None else 10 * self.steps

    @property
    def total_steps(self) -> int:
        """Warm-up plus the most measured steps (what the learning-rate schedule spans)."""
        return self.warmup_steps + self.most_steps

    def effective_timeout_s(self) -> float | None:
        """The configuration's time limit in seconds (``None``: no limit): as given, else generous for the
        steps asked (:data:`SETUP_ALLOWANCE_S` plus :data:`STEP_ALLOWANCE_S` per step)."""
        if self.timeout_s is not None:
            return float(self.timeout_s) or None
        return SETUP_ALLOWANCE_S + STEP_ALLOWANCE_S * self.total_steps

    def effective_loader_timeout_s(self) -> float | None:
        """Longest wait for one batch from the loader workers (``None``: no limit)."""
        value = DEFAULT_LOADER_TIMEOUT_S if self.loader_timeout_s is None else self.loader_timeout_s
        return float(value) or None

    def settings(self) -> dict[str, Any]:
        """The shared fields, by name."""
        return {f.name: getattr(self, f.name) for f in fields(RunSettings)}


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
        _require_name("device", self.device)
        _require_int("num_workers", self.num_workers, 0)
        _require_choice("loader", self.loader, LOADERS)
        _require_choice("precision", self.precision, PRECISIONS)
        _require_choice("engine", self.engine, ENGINES)

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
        return "-".join(_SAFE.sub("_", part) for part in parts)

    def digest(self) -> str:
        """sha256 over the identity fields that differ from their defaults (canonical JSON, sorted keys); run
        controls (bounds, time limits) are left out."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("identity", True)
                and (f.default is dataclasses.MISSING or getattr(self, f.name) != f.default)}
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunConfig":
        """Build from a mapping, rejecting unknown and missing keys by name."""
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

    def describe(self) -> str:
        """The configuration as people read it: each axis named (``device=cpu workers=0 loader=cpu ...``)."""
        text = (f"device={self.device} workers={self.num_workers} loader={self.loader} "
                f"precision={self.precision} engine={self.engine}")
        if self.prefetch_factor is not None:
            text += f" prefetch={self.prefetch_factor}"
        if self.nproc_per_node > 1:
            text += f" nproc={self.nproc_per_node}"
        if self.nnodes > 1:
            text += f" nodes={self.nnodes}"
        return text


#: The axes a person reads a configuration by, as (name shown, field), in the order shown.
LABEL_AXES = (("device", "device"), ("workers", "num_workers"), ("loader", "loader"), ("precision", "precision"),
              ("engine", "engine"), ("prefetch", "prefetch_factor"), ("nproc", "nproc_per_node"), ("nodes", "nnodes"),
              ("batch", "batch_size"), ("seed", "seed"))


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


def param_text(value: Any) -> str:
    """How a value is written as an MLflow param or tag: ``None`` is ``default``, booleans ``true``/``false``,
    sequences comma-separated (``0,1,2``), everything else ``str``. One spelling for every writer."""
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(param_text(v) for v in value)
    return str(value)


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


#: `suite run` settings a config file may hold besides the matrix fields (:class:`MatrixSpec`), with their types.
FILE_RUN_OPTIONS: dict[str, type | tuple[type, ...]] = {"repeats": int, "memory_limit": (int, float),
                                                        "experiment": str}


def load_config_file(path: "str | os.PathLike[str]") -> dict[str, Any]:
    """A config file's fields (JSON, or TOML by suffix): :class:`MatrixSpec` fields and
    :data:`FILE_RUN_OPTIONS`. Unknown fields and wrongly typed settings raise :class:`ConfigError` naming them;
    the matrix fields themselves are validated by :meth:`MatrixSpec.from_dict`."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file does not exist: {path}")
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(path.read_text())
        else:
            data = json.loads(path.read_text())
    except (ValueError, ImportError, OSError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
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
    if data.get("repeats", 1) < 1:
        raise ConfigError(f"{path}: repeats must be >= 1, got {data['repeats']}")
    if "memory_limit" in data and not data["memory_limit"] > 0:
        raise ConfigError(f"{path}: memory_limit must be > 0 (GiB), got {data['memory_limit']}")
    return data
