"""The catalogue of figures: every metric a run records, declared once.

A :class:`Figure` says what a metric is (name, unit, meaning, the MLflow section it is shown in), which values it can
take (a throughput is above 0, a fraction within [0, 1], a byte count at least 0) and whether configurations are
compared by it. Writers, readers, tables and checks take names, units and bounds from here (as pytest-benchmark's
``Stats.fields`` drive its table and ``as_dict``, and optimum-benchmark's ``Measurements``).

The suite's own figures are :data:`FIGURES`; a family of names made at run time (``setup_<phase>_s``,
``device_<name>_bytes``, ``trainer_<key>``, a workload's ``eval_<figure>``) is declared by a :class:`Family`; a
workload declares its own figures precisely (:attr:`suite.workload.Workload.figures`: its quality metrics, their
bounds), which take the family's place in :func:`suite.workload.catalogue_of`. A name the catalogue does not know is
still read, as long as it is a finite number.

:func:`check_value` is what a reader asks of a recorded value: ``None`` when it can be shown and computed with, else
the reason it cannot (not a finite number, outside the figure's bounds). A value that fails is never divided by: it
is shown as "-" with that reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Witness:
    """A second place in a results folder that holds a recorded value, or bounds it: the audit cross-examines every
    figure and fact by the witnesses declared here (suite/audit/witnesses.py), so a figure declared with one is
    checked from the day it is declared.

    ``kind`` and what it says of the value:

    - ``fact``: equals the fact at ``path`` (a copy, or the raw reading it was taken from);
    - ``formula``: equals ``path``, a product or quotient of facts (``contention.others_cpu_s / contention.window_s``);
    - ``config``: equals the configuration's field ``path`` (what was asked for, where nothing may change it);
    - ``manifest``: equals the run manifest's entry ``path``;
    - ``log``: equals the value of the last event ``path`` of the run's mlperf.log;
    - ``last_evaluation``: equals its own name's value in the run's last held-out evaluation (``facts.evaluations``);
    - ``count``: equals the number of entries of the fact at ``path``;
    - ``peak_of``: at least every sample of the fact at ``path`` (a peak is never below a sample it covers);
    - ``within``: a series, each element in [0, the same element of the fact at ``path``] (a wait inside its step);
    - ``contention_rule``: the contended flag the rule gives the recorded shares.
    """

    kind: str
    path: str = ""

    def __str__(self) -> str:
        return f"{self.kind}({self.path})" if self.path else self.kind


@dataclass(frozen=True)
class Figure:
    """One metric: its name, unit, meaning, MLflow section, the values it can take and its witnesses."""

    name: str
    unit: str  # "samples/s", "s", "B", "1" (a ratio or fraction), "count", "cores", "FLOP", "FLOP/s", "B/step"
    description: str
    group: str  # the MLflow section (``<group>/<name>``); "" for none
    minimum: float = -math.inf  # the smallest value a measurement can give (inclusive unless ``positive``)
    maximum: float = math.inf
    positive: bool = False  # strictly above ``minimum`` (a throughput, a time a step took: a divisor, never 0)
    compares: bool = False  # configurations are compared by it (tables, the report, suite compare)
    integer: bool = False  # a count: a whole number
    witnesses: tuple[Witness, ...] = ()  # where else the folder holds or bounds it (see :class:`Witness`)

    def check(self, value: float) -> str | None:
        """Why ``value`` cannot be this figure's (``None`` when it can)."""
        if not math.isfinite(value):
            return f"{value!r} is not a finite number"
        if value < self.minimum or (self.positive and value == self.minimum):
            return f"{value:g} is {'not above' if self.positive else 'below'} {self.minimum:g} {self.unit}".rstrip()
        if value > self.maximum:
            return f"{value:g} is above {self.maximum:g}"
        if self.integer and value != int(value):
            return f"{value:g} is not a whole number"
        return None

    def as_dict(self) -> dict[str, Any]:
        described = asdict(self)
        described["witnesses"] = [str(w) for w in self.witnesses]
        for bound in ("minimum", "maximum"):
            if math.isinf(described[bound]):
                described[bound] = None
        return described


@dataclass(frozen=True)
class Family:
    """Figures named by a pattern, made at run time (``device_<name>_bytes`` from an adapter's memory readings):
    each member is a :class:`Figure` like ``template`` under its own name."""

    pattern: str  # a regular expression matching the whole name
    template: Figure

    def member(self, name: str) -> Figure | None:
        if not re.fullmatch(self.pattern, name):
            return None
        return Figure(name, self.template.unit, self.template.description, self.template.group,
                      self.template.minimum, self.template.maximum, self.template.positive, self.template.compares,
                      self.template.integer, self.template.witnesses)


def _f(name: str, unit: str, group: str, description: str, **bounds: Any) -> Figure:
    return Figure(name, unit, description, group, **bounds)


#: Every core figure's name, written once: code that writes or reads a figure names it by these.
LOSS = "loss"
MFU = "mfu"
THROUGHPUT_SAMPLES_PER_S = "throughput_samples_per_s"
THROUGHPUT_CI95_LOW = "throughput_ci95_low"
THROUGHPUT_CI95_HIGH = "throughput_ci95_high"
THROUGHPUT_CV = "throughput_cv"
MODEL_FLOPS_PER_STEP = "model_flops_per_step"
MODEL_FLOPS_PER_S = "model_flops_per_s"
MFU_BF16_PEAK = "mfu_bf16_peak"
STEP_TIME_P50_S = "step_time_p50_s"
STEP_TIME_P90_S = "step_time_p90_s"
STEP_TIME_P99_S = "step_time_p99_s"
MEASURED_STEPS = "measured_steps"
MEASURED_WALL_S = "measured_wall_s"
WARMUP_WALL_S = "warmup_wall_s"
DATA_WAIT_FRACTION = "data_wait_fraction"
SKIPPED_SAMPLES = "skipped_samples"
DEVICE_DECODE_FALLBACKS = "device_decode_fallbacks"
DECODER_BUILDS_IN_MEASURED_STEPS = "decoder_builds_in_measured_steps"
DEVICE_PEAK_MEMORY_BYTES = "device_peak_memory_bytes"
HOST_RAM_PEAK_PSS_ANON_BYTES = "host_ram_peak_pss_anon_bytes"
HOST_RAM_PEAK_PSS_BYTES = "host_ram_peak_pss_bytes"
HOST_RAM_PEAK_RSS_BYTES = "host_ram_peak_rss_bytes"
EVAL_SAMPLES = "eval_samples"
EVAL_TIME_S = "eval_time_s"
EVAL_COUNT = "eval_count"
TIME_TO_TRAIN_S = "time_to_train_s"
STEPS_TO_TARGET = "steps_to_target"
CONTENTION_OTHERS_CPU_SHARE = "contention_others_cpu_share"
CONTENTION_STEAL_SHARE = "contention_steal_share"
CONTENTION_PAUSED_SHARE = "contention_paused_share"
HOST_CPU_CORES_TRAINER = "host_cpu_cores_trainer"
HOST_CPU_CORES_DECODER_THREADS = "host_cpu_cores_decoder_threads"
HOST_CPU_CORES_LOADER_WORKERS = "host_cpu_cores_loader_workers"
HOST_CPU_CORES_OTHER = "host_cpu_cores_other"
HOST_CORES_AVAILABLE = "host_cores_available"
LOAD_AVERAGE_1M = "load_average_1m"
STEP_TIME_S = "step_time_s"
BEST_THROUGHPUT_SAMPLES_PER_S = "best_throughput_samples_per_s"
SPEEDUP_BEST_OVER_BASELINE = "speedup_best_over_baseline"
CONFIGURATIONS_MEASURED = "configurations_measured"
MATRIX_WALL_S = "matrix_wall_s"
IN_WINDOW_S = "in_window_s"
IN_WINDOW_FRACTION = "in_window_fraction"

_AT_LEAST_0 = {"minimum": 0.0}
_ABOVE_0 = {"minimum": 0.0, "positive": True}
_FRACTION = {"minimum": 0.0, "maximum": 1.0}
_COUNT = {"minimum": 0.0, "integer": True}


def _cores(used: str) -> dict[str, Any]:
    """Mean cores used over the measured window, from the CPU seconds the contention meter recorded."""
    return {"minimum": 0.0, "witnesses": (Witness("formula", f"contention.{used} / contention.window_s"),)}

#: The suite's own figures, in the order tables and ``suite metrics`` list them.
FIGURES: tuple[Figure, ...] = (
    # throughput: the measured window
    _f(THROUGHPUT_SAMPLES_PER_S, "samples/s", "throughput",
       "samples trained per second over the measured steps (warm-up excluded; steps timed back to back on a "
       "synchronized clock); several runs of one configuration: their MLPerf-style score", compares=True,
       witnesses=(Witness("log", "throughput"),), **_ABOVE_0),
    _f(THROUGHPUT_CI95_LOW, "samples/s", "throughput",
       "lower end of the 95 % interval of the throughput (block bootstrap over the measured steps; over the runs "
       "where several are gathered)", **_ABOVE_0),
    _f(THROUGHPUT_CI95_HIGH, "samples/s", "throughput", "upper end of that interval", **_ABOVE_0),
    _f(THROUGHPUT_CV, "1", "throughput",
       "coefficient of variation of the throughput over the runs of one configuration (where several are gathered)",
       **_AT_LEAST_0),
    _f(MODEL_FLOPS_PER_STEP, "FLOP", "throughput",
       "the model's floating-point operations per training step (forward and backward), as the workload counts "
       "them", **_ABOVE_0),
    _f(MODEL_FLOPS_PER_S, "FLOP/s", "throughput", "model FLOP per step times steps per second", **_ABOVE_0),
    _f(MFU, "1", "throughput",
       "model FLOP utilization: model FLOP/s over the device's dense peak for the precision that ran",
       **_AT_LEAST_0),
    _f(MFU_BF16_PEAK, "1", "throughput",
       "model FLOP utilization against the dense bf16 peak whatever the precision (runs recorded before 2026-12-08)",
       **_AT_LEAST_0),
    # step times
    _f(STEP_TIME_P50_S, "s", "step_time", "median time of a measured step", compares=True, **_ABOVE_0),
    _f(STEP_TIME_P90_S, "s", "step_time", "90th percentile of the measured steps' times", **_ABOVE_0),
    _f(STEP_TIME_P99_S, "s", "step_time", "99th percentile of the measured steps' times", compares=True,
       **_ABOVE_0),
    _f(MEASURED_STEPS, "count", "step_time", "steps in the measured window", minimum=1.0, integer=True),
    _f(MEASURED_WALL_S, "s", "step_time", "the measured steps' summed time (they are timed back to back)",
       **_ABOVE_0),
    _f(WARMUP_WALL_S, "s", "step_time", "the warm-up steps' summed time (excluded from every figure above)",
       **_AT_LEAST_0),
    # the input pipeline
    _f(DATA_WAIT_FRACTION, "1", "input",
       "share of the measured steps' time spent waiting for the next batch from the loader", compares=True,
       **_FRACTION),
    _f(SKIPPED_SAMPLES, "count", "input", "samples left out by --skip-bad-samples (their images do not decode)",
       **_COUNT),
    _f(DEVICE_DECODE_FALLBACKS, "count", "input",
       "images the device decoder refused or failed on, decoded on the host instead", **_COUNT),
    _f(DECODER_BUILDS_IN_MEASURED_STEPS, "count", "input",
       "device decoder pipelines built on a measured step's clock", **_COUNT),
    # memory
    _f(DEVICE_PEAK_MEMORY_BYTES, "B", "memory",
       "peak device memory of the training process (the framework's allocator; on CPU the process's RSS "
       "high-water mark)", compares=True, witnesses=(Witness("peak_of", "device_memory_samples.bytes"),),
       **_AT_LEAST_0),
    _f(HOST_RAM_PEAK_PSS_ANON_BYTES, "B", "memory",
       "peak of the anonymous part of PSS (Pss_Anon + Pss_Shmem) over the training process and its loader workers: "
       "what they allocated; the host figure configurations are compared by", compares=True, **_AT_LEAST_0),
    _f(HOST_RAM_PEAK_PSS_BYTES, "B", "memory",
       "peak PSS over the training process and its loader workers (shared pages counted once, split among the "
       "processes mapping them)", compares=True, **_AT_LEAST_0),
    _f(HOST_RAM_PEAK_RSS_BYTES, "B", "memory",
       "peak RSS summed over the training process and its loader workers (shared pages counted in every process)",
       compares=True, witnesses=(Witness("peak_of", "host_memory_samples.bytes"),), **_AT_LEAST_0),
    # quality
    _f(EVAL_SAMPLES, "count", "quality", "held-out samples scored at each evaluation",
       witnesses=(Witness("last_evaluation"),), **_COUNT),
    _f(EVAL_TIME_S, "s", "quality", "time spent evaluating, every evaluation of the run together", **_AT_LEAST_0),
    _f(EVAL_COUNT, "count", "quality", "evaluations the run made", witnesses=(Witness("count", "evaluations"),),
       **_COUNT),
    _f(TIME_TO_TRAIN_S, "s", "quality", "from run_start to the evaluation that reached the quality target",
       **_AT_LEAST_0),
    _f(STEPS_TO_TARGET, "count", "quality", "training steps until the quality target was reached", **_COUNT),
    # where the cores went in the measured window
    _f(CONTENTION_OTHERS_CPU_SHARE, "1", "host",
       "share of the machine's cores other processes used during the measured window",
       witnesses=(Witness("fact", "contention.others_share"),
                  Witness("formula", "contention.others_cpu_s / contention.window_s / contention.cores")),
       **_AT_LEAST_0),
    _f(CONTENTION_STEAL_SHARE, "1", "host", "share of the cores the hypervisor stole during the measured window",
       witnesses=(Witness("fact", "contention.steal_share"),
                  Witness("formula", "contention.steal_s / contention.window_s / contention.cores")), **_AT_LEAST_0),
    _f(CONTENTION_PAUSED_SHARE, "1", "host",
       "share of the measured window the training process did not run (stopped by SIGSTOP or Ctrl-Z, frozen, its VM "
       "paused)", witnesses=(Witness("fact", "contention.paused_share"),), **_FRACTION),
    _f(HOST_CPU_CORES_TRAINER, "cores", "host", "cores the training process used (its decoder threads apart)",
       minimum=0.0),
    _f(HOST_CPU_CORES_DECODER_THREADS, "cores", "host", "cores the decoder's own threads used",
       **_cores("decoder_threads_cpu_s")),
    _f(HOST_CPU_CORES_LOADER_WORKERS, "cores", "host", "cores the loader workers used", **_cores("workers_cpu_s")),
    _f(HOST_CPU_CORES_OTHER, "cores", "host", "cores other processes used", **_cores("others_cpu_s")),
    _f(HOST_CORES_AVAILABLE, "cores", "host", "cores the configuration could use", **_ABOVE_0),
    _f(LOAD_AVERAGE_1M, "1", "host", "the kernel's one-minute load average at the window's end", **_AT_LEAST_0),
    # series: one value per step (MLflow's step)
    _f(LOSS, "1", "", "the training loss of each step, warm-up included (MLflow's step is the step's index)"),
    _f(STEP_TIME_S, "s", "step_time", "each measured step's time (MLflow's step is the step's index)",
       **_ABOVE_0),
    # the report's summary, on the matrix run
    _f(BEST_THROUGHPUT_SAMPLES_PER_S, "samples/s", "summary", "the best configuration's throughput",
       **_ABOVE_0),
    _f(SPEEDUP_BEST_OVER_BASELINE, "1", "summary", "the best configuration's throughput over its baseline's",
       **_ABOVE_0),
    _f(CONFIGURATIONS_MEASURED, "count", "summary", "configurations with a throughput in the matrix", **_COUNT),
    # the matrix
    _f(MATRIX_WALL_S, "s", "setup", "the matrix's wall time, from the runner's start to its end", **_AT_LEAST_0),
    _f(IN_WINDOW_S, "s", "setup", "of the matrix's wall time, the part inside the configurations' warm-up and "
       "measured windows", **_AT_LEAST_0),
    _f(IN_WINDOW_FRACTION, "1", "setup",
       "share of the matrix's wall time inside the configurations' warm-up and measured windows", **_FRACTION),
)

#: Figures named at run time.
FAMILIES: tuple[Family, ...] = (
    Family(r"setup_[a-z0-9_]+_s", _f("setup_<phase>_s", "s", "setup",
                                     "wall time of one set-up phase before the first step (suite.meters.setup)",
                                     **_AT_LEAST_0)),
    Family(r"(memory|device_memory)_growth_bytes_per_step(_ci95_low|_ci95_high)?",
           _f("<series>_growth_bytes_per_step", "B/step", "memory",
              "growth of host (memory_) or device (device_memory_) memory per measured step: the slope of a line "
              "through the window's samples, with its 95 % interval")),
    Family(r"(memory|device_memory)_growth_tolerance_bytes_per_step",
           _f("<series>_growth_tolerance_bytes_per_step", "B/step", "memory",
              "the growth per step the plateau verdict tolerates", **_AT_LEAST_0)),
    Family(r"device_[a-z0-9_]+_bytes", _f("device_<reading>_bytes", "B", "memory",
                                          "a further device memory reading of the adapter (its driver's view)",
                                          **_AT_LEAST_0)),
    Family(r"eval_[a-z0-9_]+", _f("eval_<figure>", "", "quality",
                                  "a held-out quality figure of the workload's evaluation (the workload declares "
                                  "each: Workload.figures)", witnesses=(Witness("last_evaluation"),))),
    Family(r"trainer_[A-Za-z0-9_]+", _f("trainer_<key>", "", "trainer",
                                        "a figure transformers' Trainer reports of itself (engine hf-trainer; all "
                                        "steps, warm-up and start-up included)")),
)


class Catalogue:
    """The figures of the suite and of the workloads given: :meth:`get` one by name, :meth:`check` a value."""

    def __init__(self, extra: Iterable[Figure] = ()) -> None:
        self.figures: dict[str, Figure] = {f.name: f for f in FIGURES}
        for figure in extra:
            if figure.name in self.figures and self.figures[figure.name] != figure:
                raise ValueError(f"figure {figure.name!r} is declared twice, differently")
            self.figures[figure.name] = figure

    def get(self, name: str) -> Figure | None:
        """The figure named ``name`` (a family's member included); ``None`` for a name the catalogue does not
        know."""
        if name in self.figures:
            return self.figures[name]
        for family in FAMILIES:
            member = family.member(name)
            if member is not None:
                return member
        return None

    def check(self, name: str, value: float) -> str | None:
        """Why ``value`` cannot be ``name``'s (``None`` when it can): outside its figure's bounds, or, for a name
        the catalogue does not know, not a finite number."""
        figure = self.get(name)
        if figure is not None:
            return figure.check(value)
        return None if math.isfinite(value) else f"{value!r} is not a finite number"

    def listing(self) -> list[dict[str, Any]]:
        """Every figure, then every family (with its name pattern), as ``suite metrics --json`` prints them."""
        return [{**f.as_dict(), "pattern": None} for f in self.figures.values()] + \
            [{**family.template.as_dict(), "pattern": family.pattern} for family in FAMILIES]


#: The suite's own figures, without a workload's.
CORE = Catalogue()


def check_value(name: str, value: Any, catalogue: Catalogue = CORE) -> str | None:
    """Why a recorded ``value`` cannot be shown or computed with as the figure ``name`` (``None`` when it can): not
    a number, not finite, outside its bounds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value!r} is not a number"
    return catalogue.check(name, float(value))


def usable(metrics: Mapping[str, Any], catalogue: Catalogue = CORE) -> tuple[dict[str, float], dict[str, str]]:
    """``metrics`` split into the values that can be used and the reasons the others cannot."""
    kept: dict[str, float] = {}
    set_aside: dict[str, str] = {}
    for name, value in metrics.items():
        reason = check_value(name, value, catalogue)
        if reason is None:
            kept[name] = float(value)
        else:
            set_aside[name] = reason
    return kept, set_aside


@dataclass(frozen=True)
class Fact:
    """One fact a run records (``RunResult.facts``: what ran, how it was measured): its path (``contention.contended``
    inside the ``contention`` object), the JSON types it may have and its meaning."""

    path: str
    types: tuple[str, ...]  # of "object", "array", "string", "number", "integer", "boolean", "null"
    description: str
    items: str | None = None  # an array's elements' type (a JSON type name; a number: finite)
    witnesses: tuple[Witness, ...] = ()  # where else the folder holds or bounds it (see :class:`Witness`)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "witnesses": [str(w) for w in self.witnesses]}


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "number": (int, float), "integer": (int,),
    "boolean": (bool,), "null": (type(None),),
}


def _fact(path: str, types: str, description: str, items: str | None = None, *witnesses: Witness) -> Fact:
    return Fact(path, tuple(types.split("|")), description, items, witnesses)


#: The facts the suite's own readers look into, with the types they need (a workload's facts live under
#: ``workload``). A record whose fact has another type does not fit the schema: the reader says so in one line.
FACTS: tuple[Fact, ...] = (
    _fact("warmup_steps_excluded", "integer", "warm-up steps excluded from every figure"),
    _fact("batch_size_used", "integer", "the per-device batch size of the batches the step received", None,
          Witness("config", "batch_size"), Witness("manifest", "batch_size.used")),
    _fact("global_batch_size", "integer", "samples per step over every rank", None,
          Witness("formula", "batch_size_used * config.nproc_per_node * config.nnodes"),
          Witness("log", "global_batch_size")),
    _fact("world_size", "integer", "processes training together (torchrun ranks)"),
    _fact("nodes", "integer", "nodes the configuration ran on"),
    _fact("precision_used", "string|null", "the precision the model's forward pass ran in, read from torch while "
          "it ran (null: the workload did not observe it)", None,
          Witness("config", "precision"), Witness("manifest", "precision.ran")),
    _fact("loader_used", "string|null", "the loader whose batches reached the step (observed)", None,
          Witness("manifest", "loader.ran")),
    _fact("num_workers_used", "integer|null", "loader worker processes that ran (observed)"),
    _fact("prefetch_factor_used", "integer|null", "batches each worker prepared ahead (observed)"),
    _fact("step_times_s", "array", "every measured step's time, s (the raw series the headlines derive from)",
          "number"),
    _fact("data_wait_s", "array", "every measured step's wait for its batch, s", "number",
          Witness("within", "step_times_s")),
    _fact("measured_window_monotonic_s", "array", "the measured window's start and end on the monotonic clock, s",
          "number"),
    _fact("decoder_builds_per_step", "array", "device decoder pipelines built on each step's clock", "number"),
    _fact("evaluations", "array", "each held-out evaluation: step, samples, time, figures", "object"),
    _fact("device", "object", "the device as the adapter read it (name, count, driver, memory...)"),
    _fact("device.device_name", "string|null", "the device's name"),
    _fact("accelerator_environment", "object",
          "environment variables that change an accelerator's results (credentials recorded as set, without their "
          "value), visible devices, driver and runtime versions"),
    _fact("workload", "object", "what the workload built: dataset, its fingerprint, tokenizer, weights, pipeline"),
    _fact("contention", "object", "where the cores went in the measured window, and whether others used them"),
    _fact("contention.contended", "boolean", "other processes or the hypervisor took a noticeable share of the cores",
          None, Witness("contention_rule")),
    _fact("contention.others_share", "number", "share of the cores other processes used", None,
          Witness("formula", "contention.others_cpu_s / contention.window_s / contention.cores")),
    _fact("run_params", "object", "the device's run settings recorded as MLflow params (run.<name>)"),
    _fact("submission", "object", "MLPerf submission disclosures"),
    _fact("cache_clear", "object", "whether the page cache was dropped before the run, and how"),
    _fact("quality_target", "object", "the declared quality target and whether it was reached"),
    _fact("memory_trend", "string|null", "plateau / growing / inconclusive: the worst of the host and device series"),
    _fact("host_memory_trend", "object", "the host memory series' fit over the measured window"),
    _fact("device_memory_trend", "object", "the device memory series' fit over the measured window"),
    _fact("host_memory_samples", "object", "the host memory samples the fit used"),
    _fact("device_memory_samples", "object", "the device memory samples the fit used"),
    _fact("mfu", "string", "how the MFU was computed, or why it was not"),
    _fact("device_peak_memory_source", "string", "what device_peak_memory_bytes reads"),
    _fact("device_peak_memory_is_host", "boolean",
          "the device has no memory of its own: device_peak_memory_bytes is the host's"),
    _fact("started_ahead", "boolean", "the configuration's process was started ahead of its turn"),
    _fact("node_role", "string", "worker: another node measured and recorded this multi-node configuration"),
    _fact("run_dir", "string", "the run's folder, relative to the results folder"),
    _fact("log", "string", "the run's log, relative to the results folder"),
    _fact("manifest", "string", "the run's manifest, relative to the results folder"),
    _fact("mlperf_log", "string", "the run's MLPerf log, relative to the results folder"),
    _fact("recording_errors", "array", "records of the run that could not be written"),
    _fact("recorder_errors", "array", "recorders (MLflow) that could not take the run"),
)
_FACTS_BY_PATH = {fact.path: fact for fact in FACTS}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return next((name for name, types in _JSON_TYPES.items() if isinstance(value, types)), type(value).__name__)


def _fits(value: Any, types: Sequence[str]) -> bool:
    kind = _json_type(value)
    if kind == "number" and isinstance(value, float) and not math.isfinite(value):
        return False
    return kind in types or (kind == "number" and isinstance(value, int) and "integer" in types) \
        or (kind == "integer" and "number" in types)


#: What :func:`fact_at` gives for a fact a record does not hold (``None`` is a fact recorded as null).
ABSENT: Any = object()


def fact_at(facts: Any, path: str) -> Any:
    """The value at a fact's dotted ``path`` (``contention.others_share``) in ``facts``, else :data:`ABSENT`."""
    for key in path.split("."):
        if not isinstance(facts, Mapping) or key not in facts:
            return ABSENT
        facts = facts[key]
    return facts


def misfit_fact(facts: Mapping[str, Any]) -> str | None:
    """The first declared fact of ``facts`` whose value has a type :data:`FACTS` does not allow, said as
    ``facts.contention is a string, not object`` (``None`` where every one fits). ``null`` fits every fact: a run
    that failed before it knew one records it so."""
    for fact in FACTS:
        value = fact_at(facts, fact.path)
        if value is ABSENT:
            continue
        if value is not None and not _fits(value, fact.types):
            kind = _json_type(value)
            return f"facts.{fact.path} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not {' or '.join(fact.types)}"
        if fact.items and isinstance(value, list):
            bad = next((i for i, item in enumerate(value) if not _fits(item, (fact.items,))), None)
            if bad is not None:
                return f"facts.{fact.path}[{bad}] is {value[bad]!r}, not a finite {fact.items}"
    return None


#: The caption where a row's device peak memory is the host's (see :func:`device_memory_is_host`).
HOST_DEVICE_MEMORY_NOTE = ("device peak on a device with no memory of its own (a CPU): the training process's host "
                           "high-water mark, the same memory as the host figures")


def device_memory_is_host(facts: Mapping[str, Any]) -> bool:
    """Whether a run's ``device_peak_memory_bytes`` is the host's memory, as its record says: the fact
    ``device_peak_memory_is_host``, or, in records from before it, the source the CPU meter named."""
    flag = facts.get("device_peak_memory_is_host")
    if isinstance(flag, bool):
        return flag
    source = facts.get("device_peak_memory_source")
    return isinstance(source, str) and source.endswith("(host memory)")
