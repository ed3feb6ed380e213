"""The workload plugin interface.

A workload builds its model, data and optimizer for one :class:`~suite.config.RunConfig` and
performs one training step at a time. It does not time itself: the runner owns the clock, so every
workload and every device is measured with the same accounting.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Mapping

from suite.errors import SuiteError
from suite.figures import Catalogue, Figure

if TYPE_CHECKING:
    import torch

    from suite.config import RunConfig
    from suite.devices.base import DeviceAdapter
    from suite.meters.setup import SetupClock


@dataclass(frozen=True)
class Preset:
    """A named, fixed recipe of a workload. Its batch size and seed are part of the recipe."""

    name: str
    batch_size: int
    description: str


class Workload(ABC):
    """One benchmark workload (e.g. fine-tuning one model on one dataset with a fixed batch and seeds)."""

    #: Registered name (``--workload NAME``).
    name: ClassVar[str]
    #: Presets by name; the first listed in :attr:`default_preset` is used when none is given.
    presets: ClassVar[Mapping[str, Preset]]
    #: The workload's own figures (its quality metrics), declared as the suite's are (:mod:`suite.figures`)
    figures: ClassVar[tuple[Figure, ...]] = ()
    #: What ``--dataset`` takes for this workload, for ``suite list`` (names it knows, paths, its default)
    datasets: ClassVar[str] = ""
    #: The published results its matrices are set beside (a name under ``reference/``, or a path): the report's
    #: default; None: the workload publishes none, and its matrices are never set beside another's
    published_reference: ClassVar[str | None] = None
    #: Its quality reference for ``suite score`` (steps to target over seeds: the RCP), a name or a path; None: none
    quality_reference: ClassVar[str | None] = None
    #: What a speed-up is over: these fields set on a configuration give its baseline (the published benchmark's: no
    #: loader workers, the reference CPU loader; a torch DataLoader takes no prefetch factor without workers)
    speedup_baseline: ClassVar[Mapping[str, Any]] = {"num_workers": 0, "loader": "cpu", "prefetch_factor": None}
    #: Its MLPerf rules live in ``mlperf_rules/`` beside its module: ``open_<name>.yaml`` (and ``closed_<name>.yaml``
    #: for a published recipe), which the suite's ruleset chains (``suite/results/mlperf_rules/common.yaml``)
    default_preset: ClassVar[str]

    @classmethod
    def describe_preset(cls, name: str) -> dict[str, Any]:
        """Facts about preset ``name`` for ``suite list`` (size, inputs, what it fetches); none by default."""
        return {}

    @classmethod
    def prepare(cls, config: "RunConfig") -> dict[str, Any]:
        """Validate inputs and build shared caches once, in the parent, before any run starts.

        Raise :class:`~suite.errors.SuiteError` for bad input (missing dataset, unknown column...).
        Returns facts worth recording for the whole matrix (e.g. where the dataset lives).
        """
        return {}

    @classmethod
    def input_fingerprints(cls, config: "RunConfig") -> dict[str, Any]:
        """The fingerprints of a configuration's inputs computed now, without training, under the names the manifest
        records them (``suite audit --no-rerun`` compares them). Raises ``NotImplementedError`` where the workload
        cannot (the audit then says so)."""
        raise NotImplementedError(f"workload {cls.name!r} cannot recompute its input fingerprints")

    @classmethod
    def loader_pixels(cls, config: "RunConfig", device: "DeviceAdapter", count: int) -> dict[str, Any]:
        """The first ``count`` samples' model input as ``config.loader`` makes it on ``device`` (``pixels``), and
        as the reference preprocessing makes it from the same files (``reference``), for ``suite audit --loaders``.
        Raises ``NotImplementedError`` where the workload cannot."""
        raise NotImplementedError(f"workload {cls.name!r} cannot compare its loaders")

    @classmethod
    def loader_benchmark(cls, options: Mapping[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
        """``suite bench-loader``: the workload's input pipelines side by side (see its documentation).

        ``options``: dataset, images, image_size, batch_size, num_workers (None: every core), rounds.
        Returns JSON-ready figures with at least ``closed_vs_reference``, ``open_vs_reference``,
        ``open_psnr_db``, ``pipelines`` and ``settings``.
        """

        raise SuiteError(f"workload {cls.name!r} has no input-pipeline benchmark")

    @classmethod
    def preload(cls) -> None:
        """Import what :meth:`setup` will need (the framework's model code...), nothing else: a configuration
        process started ahead of its turn calls it while the previous configuration finishes, so its set-up does
        not wait for imports. Building or reading anything belongs in :meth:`setup`."""

    def __init__(self, config: "RunConfig", device: "DeviceAdapter") -> None:
        self.config = config
        self.device = device

    @property
    def setup_clock(self) -> "SetupClock":
        """Where :meth:`setup` times its phases (``with self.setup_clock.phase("model"): ...``; see
        :data:`suite.meters.setup.SETUP_PHASES`); the runner records them as ``setup_<phase>_s``."""
        clock = self.__dict__.get("_setup_clock")
        if clock is None:
            from suite.meters.setup import SetupClock

            clock = self.__dict__["_setup_clock"] = SetupClock()
        return clock

    @abstractmethod
    def setup(self) -> None:
        """Build model, optimizer and data loader on ``self.device`` (seeded by the runner before)."""

    @abstractmethod
    def batches(self) -> Iterator[Any]:
        """An endless iterator of batches from the configured loader (epochs roll over)."""

    @abstractmethod
    def train_step(self, batch: Any) -> "torch.Tensor":
        """Run one optimizer step on ``batch`` and return the (detached) loss tensor."""

    @abstractmethod
    def count_samples(self, batch: Any) -> int:
        """Number of samples in ``batch``; the runner checks it equals the recorded batch size."""

    def metrics(self) -> dict[str, float]:
        """Workload-specific metrics recorded with the run's (e.g. how many bad samples were skipped)."""
        return {}

    def mlperf_hyperparameters(self) -> dict[str, Any]:
        """MLPerf log keys of this recipe (``opt_name``, ``opt_base_learning_rate``, ``train_samples``...)."""
        return {}

    def facts(self) -> dict[str, Any]:
        """What actually ran (model size, tokenizer, image processor...), recorded with the run."""
        return {}

    def evaluate(self) -> dict[str, float] | None:
        """Quality of the model now, on held-out data (no gradients, on the device): at least ``eval_accuracy``
        (higher is better; what ``--target-quality`` is compared with) and ``eval_samples``. ``None``: this
        workload has no evaluation (then no quality is recorded and no target can be set)."""
        return None

    @classmethod
    def recipe_deviations(cls, config: "RunConfig") -> list[str]:
        """How ``config`` differs from the workload's published recipe; empty when it follows it exactly (the MLPerf
        log's division is then ``closed``, else ``open``)."""
        return [f"workload {cls.name!r} publishes no recipe"]

    @classmethod
    def method_deviations(cls, config: "RunConfig", run_params: Mapping[str, str]) -> list[str]:
        """How a run measured differently from the published method its figures are set beside (``run_params``: how
        the device ran, as :func:`suite.devices.base.run_params` records it): e.g. deterministic kernels where the
        published method ran without. Recorded with every run and said wherever runs are set beside published
        figures; empty for a workload that publishes no method."""
        return []

    def observed_loader(self) -> dict[str, Any]:
        """The loader that ran, read from the objects that ran it, never copied from the config (the audit
        compares the two): ``loader`` (which of :data:`suite.config.LOADERS` produced the batches, judged by the
        pipeline built or the device decoder used), ``num_workers`` and ``prefetch_factor`` (the DataLoader's
        own). A workload that cannot tell leaves keys out, and the audit fails those checks."""
        return {}

    def precision_ran(self) -> str | None:
        """The precision the model's forward pass ran in, read while it ran
        (:meth:`suite.devices.interfaces.Numerics.precision_in_force`); ``None`` where the workload did not observe
        it (recorded as null: unknown, never the request copied)."""
        return None

    def train_with_trainer(self, hooks: Any) -> dict[str, float]:
        """Engine ``hf-trainer``: run ``warmup_steps + steps`` steps through the framework's own trainer
        (transformers ``Trainer``), calling ``hooks.begin()`` once, ``hooks.batch_ready()`` when a step's
        batch is in hand and ``hooks.step_end(loss)`` after each optimizer step, so that the suite times the
        steps with its own accounting. Returns the trainer's own figures (e.g. ``train_samples_per_second``).
        """

        raise SuiteError(f"workload {self.name!r} has no hf-trainer engine")

    def teardown(self) -> None:
        """Release loader workers and other resources."""


def workload_class_or_base(name: str) -> type[Workload]:
    """The workload class registered as ``name``, or the :class:`Workload` interface itself where no such workload is
    installed here (a results folder uploaded from elsewhere): its declared defaults (no published reference, the
    suite's speed-up baseline) then stand."""
    from suite.registry import load_workload

    try:
        return load_workload(name)
    except SuiteError:
        return Workload


def catalogue_of(workload: str) -> Catalogue:
    """The suite's figures with the workload's own (:attr:`Workload.figures`); the suite's alone for a workload not
    installed here."""
    return Catalogue(workload_class_or_base(workload).figures)
