"""What bounded a configuration, in one sentence: where the cores went in its measured window (the training
process, its loader workers, everything else, out of the cores available; :mod:`suite.meters.contention`), how long
the step waited for batches (a device decoder's threads inside the training process named apart), and how the step's
own compute changed against the same configuration with
``workers=0`` (the workers take cores from the step when there are not enough for both).

The rules, written once: a window the machine did not give the configuration alone (other processes took more than
:data:`~suite.meters.contention.OTHERS_SHARE_LIMIT` of the cores, the hypervisor stole them, or the training process
was stopped: :func:`suite.meters.contention.is_contended`) answers nothing about the configuration, and the sentence
says who took the machine and stops there. Otherwise a configuration is *input-bound* when it waited for batches more
than :data:`INPUT_BOUND` of its measured time; *core-bound* when its own processes kept more than :data:`CORE_BOUND`
of the available cores busy; otherwise its own step's compute bounded it. The step's compute rising against workers=0
is put on the workers only when its own processes filled the cores.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from suite.figures import (
    CONTENTION_OTHERS_CPU_SHARE,
    CONTENTION_PAUSED_SHARE,
    CONTENTION_STEAL_SHARE,
    DATA_WAIT_FRACTION,
    HOST_CORES_AVAILABLE,
    HOST_CPU_CORES_DECODER_THREADS,
    HOST_CPU_CORES_LOADER_WORKERS,
    HOST_CPU_CORES_OTHER,
    HOST_CPU_CORES_TRAINER,
    MEASURED_STEPS,
    MEASURED_WALL_S,
)
from suite.meters.contention import interference

#: Share of the measured time spent waiting for batches above which the input pipeline bounded the step.
INPUT_BOUND = 0.10
#: Share of the available cores kept busy above which the cores bounded the configuration.
CORE_BOUND = 0.85
#: A change of the step's compute against workers=0 smaller than this is not mentioned (noise).
COMPUTE_CHANGE_SAID = 0.05
CORE_METRICS = (HOST_CPU_CORES_TRAINER, HOST_CPU_CORES_LOADER_WORKERS, HOST_CPU_CORES_OTHER,
                HOST_CORES_AVAILABLE)


def compute_per_step_s(metrics: Mapping[str, float]) -> float | None:
    """Mean seconds per measured step spent not waiting for a batch (the step's own compute and synchronization)."""
    if MEASURED_WALL_S not in metrics or not metrics.get(MEASURED_STEPS):
        return None
    return metrics[MEASURED_WALL_S] / metrics[MEASURED_STEPS] * (1.0 - metrics.get(DATA_WAIT_FRACTION, 0.0))


def explain(workers: int, metrics: Mapping[str, float], baseline: Mapping[str, float] | None = None) -> str | None:
    """One sentence on what bounded a configuration with ``workers`` loader workers and these ``metrics``;
    ``baseline``: the metrics of the same configuration with workers=0. ``None`` without the core figures."""
    if not all(name in metrics for name in CORE_METRICS):
        return None
    cores = metrics[HOST_CORES_AVAILABLE]
    trainer, loader, other = (metrics[name] for name in CORE_METRICS[:3])
    decoders = metrics.get(HOST_CPU_CORES_DECODER_THREADS, 0.0)
    used = [f"the trainer used {trainer:.1f}"]
    if decoders >= 0.05:
        used.append(f"its decoder threads {decoders:.1f}")
    if workers:
        used.append(f"the {workers} worker{'s' if workers > 1 else ''} {loader:.1f}")
    if other >= 0.05:
        used.append(f"other work {other:.1f}")
    sentence = f"{cores:g} core{'s' if cores != 1 else ''}: " + ", ".join(used)
    taken = interference(metrics.get(CONTENTION_OTHERS_CPU_SHARE, 0.0), metrics.get(CONTENTION_STEAL_SHARE, 0.0),
                         metrics.get(CONTENTION_PAUSED_SHARE, 0.0))
    if taken:
        return f"{sentence}; {taken}: that bounded this run, so it answers nothing about this configuration."
    wait = metrics.get(DATA_WAIT_FRACTION, 0.0)
    own_busy = (trainer + decoders + loader) / cores if cores else 0.0
    change = _compute_change(metrics, baseline) if workers else None
    if wait > INPUT_BOUND:
        sentence += (f"; the step waited for batches {wait:.0%} of the time: the input pipeline bounded it"
                     + (" with every core busy" if own_busy > CORE_BOUND else ", with cores to spare for more workers"))
    elif own_busy > CORE_BOUND:
        sentence += "; its own processes kept every core busy: the cores bounded it"
    else:
        sentence += "; the training step's own compute bounded it"
    if change is not None and abs(change) >= COMPUTE_CHANGE_SAID:
        sentence += (f"; the step's compute {'rose' if change > 0 else 'fell'} {abs(change):.0%} against workers=0"
                     + (f" (the workers took cores from it: they used {loader:.1f})"
                        if change > 0 and own_busy > CORE_BOUND and loader >= 0.05 else ""))
    return sentence + "."


def _compute_change(metrics: Mapping[str, float], baseline: Mapping[str, float] | None) -> float | None:
    if baseline is None:
        return None
    now, before = compute_per_step_s(metrics), compute_per_step_s(baseline)
    return now / before - 1.0 if now is not None and before else None


def explanations(items: Sequence[tuple[Any, Mapping[str, float]]]) -> list[str | None]:
    """For each (configuration, metrics), its sentence, against the item whose configuration is the same but for
    workers=0 (where there is one)."""
    by_id = {config.config_id: metrics for config, metrics in items}
    return [explain(config.num_workers, metrics,
                    by_id.get(dataclasses.replace(config, num_workers=0).config_id) if config.num_workers else None)
            for config, metrics in items]
