"""What bounded a configuration, in one sentence: where the cores went in its measured window (the training
process, its loader workers, everything else, out of the cores available; :mod:`suite.meters.contention`), how long
the step waited for batches (a device decoder's threads inside the training process named apart), and how the step's
own compute changed against the same configuration with
``workers=0`` (the workers take cores from the step when there are not enough for both).

The rules, written once: a configuration is *input-bound* when it waited for batches more than
:data:`INPUT_BOUND` of its measured time; *core-bound* when its processes and everything else kept more than
:data:`CORE_BOUND` of the available cores busy; otherwise its own step's compute bounded it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

#: Share of the measured time spent waiting for batches above which the input pipeline bounded the step.
INPUT_BOUND = 0.10
#: Share of the available cores kept busy above which the cores bounded the configuration.
CORE_BOUND = 0.85
#: A change of the step's compute against workers=0 smaller than this is not mentioned (noise).
COMPUTE_CHANGE_SAID = 0.05
CORE_METRICS = ("host_cpu_cores_trainer", "host_cpu_cores_loader_workers", "host_cpu_cores_other",
                "host_cores_available")


def compute_per_step_s(metrics: Mapping[str, float]) -> float | None:
    """Mean seconds per measured step spent not waiting for a batch (the step's own compute and synchronization)."""
    if "measured_wall_s" not in metrics or not metrics.get("measured_steps"):
        return None
    return metrics["measured_wall_s"] / metrics["measured_steps"] * (1.0 - metrics.get("data_wait_fraction", 0.0))


def explain(workers: int, metrics: Mapping[str, float], baseline: Mapping[str, float] | None = None) -> str | None:
    """One sentence on what bounded a configuration with ``workers`` loader workers and these ``metrics``;
    ``baseline``: the metrics of the same configuration with workers=0. ``None`` without the core figures."""
    if not all(name in metrics for name in CORE_METRICS):
        return None
    cores = metrics["host_cores_available"]
    trainer, loader, other = (metrics[name] for name in CORE_METRICS[:3])
    decoders = metrics.get("host_cpu_cores_decoder_threads", 0.0)
    used = [f"the trainer used {trainer:.1f}"]
    if decoders >= 0.05:
        used.append(f"its decoder threads {decoders:.1f}")
    if workers:
        used.append(f"the {workers} worker{'s' if workers > 1 else ''} {loader:.1f}")
    if other >= 0.05:
        used.append(f"other work {other:.1f}")
    sentence = f"{cores:g} core{'s' if cores != 1 else ''}: " + ", ".join(used)
    wait = metrics.get("data_wait_fraction", 0.0)
    busy = (trainer + decoders + loader + other) / cores if cores else 0.0
    change = _compute_change(metrics, baseline) if workers else None
    if wait > INPUT_BOUND:
        sentence += (f"; the step waited for batches {wait:.0%} of the time: the input pipeline bounded it"
                     + (" with every core busy" if busy > CORE_BOUND else ", with cores to spare for more workers"))
    elif busy > CORE_BOUND:
        sentence += "; every core was busy: the cores bounded it"
    else:
        sentence += "; the training step's own compute bounded it"
    if change is not None and abs(change) >= COMPUTE_CHANGE_SAID:
        sentence += (f"; the step's compute {'rose' if change > 0 else 'fell'} {abs(change):.0%} against workers=0"
                     + (" (the workers took cores from it)" if change > 0 and busy > CORE_BOUND else ""))
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
