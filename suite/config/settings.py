"""What every configuration of a matrix shares (:class:`RunSettings`), the values each field may take, and the
validation that refuses anything else with the field named."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from suite.errors import ConfigError

#: Loaders: ``cpu`` decodes and preprocesses images in DataLoader workers (the reference method);
#: ``cpu-fast`` does the same in the workers with the workload's faster pipeline of equal output;
#: ``device`` ships encoded image bytes and decodes them on the device (nvJPEG, Gaudi media pipe, ...);
#: ``dali`` ships encoded bytes and decodes/preprocesses them with NVIDIA DALI.
LOADERS = ("cpu", "cpu-fast", "device", "dali")
#: ``suite``: the suite's own training loop; ``hf-trainer``: transformers' ``Trainer`` (optimum-habana's
#: ``GaudiTrainer`` on Gaudi2), as the published benchmark ran, measured with the suite's accounting.
ENGINES = ("suite", "hf-trainer")
#: What a reader of an engine's per-step figures must know, said wherever they are shown.
ENGINE_NOTES = {
    "hf-trainer": ("hf-trainer: accelerate's DataLoaderShard fetches one batch ahead, so the data wait measured before "
                   "a step is the next batch's: per-step waits are shifted by one step (the window's total by at "
                   "most one batch)"),
}
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
UNSAFE_IN_ID = re.compile(r"[^A-Za-z0-9._-]+")  # what may not appear in a config id part (replaced by _)


#: The largest count of steps, workers, processes... a configuration may name: far beyond any real run, and small
#: enough that every counter, timer and ETA built on it stays a finite machine number.
MAX_COUNT = 10**9
#: The largest seed: torch's generators take 64-bit seeds (a 24-digit seed failed every configuration).
MAX_SEED = 2**63 - 1
#: The longest time limit, seconds (about 31 years): larger ones (1e400 is infinity) disabled the watchdog.
MAX_SECONDS = 1e9
#: The largest memory amount in GiB a configuration may name (1 PiB).
MAX_GIB = 2.0**20
#: The smallest loader memory in GiB (1 MiB): below it no image of any size can be decoded.
MIN_LOADER_MEMORY_GIB = 2.0**-10
#: The most repeats of a matrix (MLPerf asks for 5 to 10 runs of a benchmark).
MAX_REPEATS = 1000


def require_int(name: str, value: Any, minimum: int, maximum: int = MAX_COUNT) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        shown = str(value) if len(str(value)) <= 30 else f"a {len(str(value))}-digit number"
        raise ConfigError(f"{name} must be <= {maximum:,}, got {shown}")


def require_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def require_name(name: str, value: Any) -> None:
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
    eval_samples: int | None = None  # evaluate on the first N held-out pairs only; None: all of them
    target_quality: float | None = None  # train until eval_accuracy >= this (MLPerf's time-to-train), at most max_steps
    max_steps: int | None = None  # with target_quality: the most measured steps (default: 10 x steps)
    #: deterministic kernels (torch.use_deterministic_algorithms; cuDNN's deterministic algorithms on CUDA): the
    #: suite's default, for bit-identical re-runs; the published method ran without them (faster on CUDA)
    deterministic: bool = True
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
    submission_org: str | None = field(default=None, metadata=_CONTROL)  # None: "unknown" (closed runs must name it)
    submission_platform: str | None = field(default=None, metadata=_CONTROL)  # None: from the device's facts
    submission_division: str | None = field(default=None, metadata=_CONTROL)  # None: closed only for the recipe
    clear_caches: bool = field(default=False, metadata=_CONTROL)  # drop the OS page cache first (needs root)
    rdzv_endpoint: str | None = field(default=None, metadata=_CONTROL)  # HOST:PORT where the nodes meet (nnodes > 1)

    def __post_init__(self) -> None:
        require_name("workload", self.workload)
        require_name("preset", self.preset)
        require_int("steps", self.steps, 1)
        require_int("warmup_steps", self.warmup_steps, 0)
        require_int("seed", self.seed, 0, MAX_SEED)
        if self.batch_size is not None:
            require_int("batch_size", self.batch_size, 1)
        for name in ("dataset", "weights"):
            value = getattr(self, name)
            if value is not None:
                require_name(name, value)
        require_choice("tokenizer", self.tokenizer, TOKENIZER_MODES)
        if not isinstance(self.skip_bad_samples, bool):
            raise ConfigError(f"skip_bad_samples must be true or false, got {self.skip_bad_samples!r}")
        if not isinstance(self.deterministic, bool):
            raise ConfigError(f"deterministic must be true or false, got {self.deterministic!r}")
        require_int("nproc_per_node", self.nproc_per_node, 1)
        require_int("nnodes", self.nnodes, 1)
        if self.nnodes > 1:
            host, colon, port = (self.rdzv_endpoint or "").rpartition(":")
            if not colon or not host or not port.isdigit():
                raise ConfigError(f"nnodes {self.nnodes} needs rdzv_endpoint HOST:PORT (where the nodes' torchrun "
                                  f"meet: the same on every node), got {self.rdzv_endpoint!r}")
        if self.prefetch_factor is not None:
            require_int("prefetch_factor", self.prefetch_factor, 1)
        for name in ("max_image_pixels", "max_image_bytes", "max_caption_bytes"):
            if getattr(self, name) is not None:
                require_int(name, getattr(self, name), 1, 2**48)
        if self.loader_memory_gib is not None and (
                isinstance(self.loader_memory_gib, bool) or not isinstance(self.loader_memory_gib, (int, float))
                or not MIN_LOADER_MEMORY_GIB <= self.loader_memory_gib <= MAX_GIB):
            raise ConfigError(f"loader_memory_gib must be a number of GiB from 1/1024 (1 MiB) to {MAX_GIB:.0f} "
                              f"(1 PiB), got {self.loader_memory_gib!r}")
        if not isinstance(self.allow_outside_links, bool):
            raise ConfigError(f"allow_outside_links must be true or false, got {self.allow_outside_links!r}")
        if self.eval_every is not None:
            require_int("eval_every", self.eval_every, 1)
        if self.eval_samples is not None:
            require_int("eval_samples", self.eval_samples, 2)
        if self.target_quality is not None:
            if isinstance(self.target_quality, bool) or not isinstance(self.target_quality, (int, float)) \
                    or not 0 < self.target_quality <= 1:
                raise ConfigError(f"target_quality must be a recall in (0, 1], got {self.target_quality!r}")
        if self.max_steps is not None:
            require_int("max_steps", self.max_steps, 1)
            if self.target_quality is None:
                raise ConfigError("max_steps bounds a run to a quality target: give target_quality too")
        for name in ("submission_org", "submission_platform"):
            if getattr(self, name) is not None:
                require_name(name, getattr(self, name))
        if self.submission_division is not None:
            require_choice("submission_division", self.submission_division, DIVISIONS)
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
