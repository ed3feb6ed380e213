"""Which source a ``--dataset`` names, and the samples that can be used from it.

* ``synthetic`` (default: 512 images) or ``synthetic:N`` (N images): the deterministic local set of :mod:`.synthetic`,
  generated once per (N, seed, generator version) and cached;
* ``newyorker``: the published dataset from the hub (:class:`.sources.HubSource`);
* a folder path in the ``imagefolder`` layout (:class:`.sources.ImageFolderSource`).

With ``skip_bad_samples``, the samples that fail to decode are left out (:mod:`.validation`). This module sits
above both :mod:`.sources` and :mod:`.validation`, which do not import each other's users.
"""

from __future__ import annotations

from pathlib import Path

from suite.errors import DatasetError

from workloads.bridgetower.data.bounds import ImageBounds
from workloads.bridgetower.data.hub import HubSource
from workloads.bridgetower.data.sources import DEFAULT_MAX_CAPTION_BYTES, ImageCaptionSource, ImageFolderSource
from workloads.bridgetower.data.synthetic import DEFAULT_SAMPLES, DEFAULT_SEED, ensure_synthetic, generation_facts
from workloads.bridgetower.data.validation import UsableSamples, scan


def open_source(spec: str | None, skip_bad_samples: bool = False, synthetic_samples: int = DEFAULT_SAMPLES,
                bounds: ImageBounds | None = None, allow_outside_links: bool = False,
                max_caption_bytes: int | None = None) -> ImageCaptionSource:
    """The source named by ``--dataset`` (see the module docstring), reading within ``bounds`` (default: the
    default bounds) and refusing captions over ``max_caption_bytes`` (default: ``DEFAULT_MAX_CAPTION_BYTES``); with
    ``skip_bad_samples``, without the samples that cannot be used (see :mod:`.validation`)."""
    bounds = bounds or ImageBounds.of(None, None)
    source = _open(spec, synthetic_samples, bounds, allow_outside_links, strict_files=not skip_bad_samples,
                   max_caption_bytes=max_caption_bytes or DEFAULT_MAX_CAPTION_BYTES)
    if not skip_bad_samples:
        return source
    return UsableSamples(source, scan(source, bounds))


def _open(spec: str | None, synthetic_samples: int, bounds: ImageBounds, allow_outside_links: bool,
          strict_files: bool, max_caption_bytes: int = 0) -> ImageCaptionSource:
    if spec is None or spec == "synthetic" or spec.startswith("synthetic:"):
        samples = synthetic_samples if spec is None or spec == "synthetic" else synthetic_size(spec)
        root = ensure_synthetic(samples, DEFAULT_SEED)
        return ImageFolderSource(root, kind="synthetic", max_bytes=bounds.max_bytes,
                                 facts={"generation": generation_facts(root)})
    if spec == "newyorker":
        return HubSource(max_bytes=bounds.max_bytes)
    path = Path(spec).expanduser()
    if not path.exists():
        raise DatasetError(
            f"dataset path does not exist: {path} (use 'synthetic', 'synthetic:N', 'newyorker' or an imagefolder "
            "path)"
        )
    return ImageFolderSource(path, allow_outside_links=allow_outside_links, max_bytes=bounds.max_bytes,
                             strict_files=strict_files, max_caption_bytes=max_caption_bytes)


#: The largest synthetic set ``synthetic:N`` makes (the published set has 9,792 images; this is 100 times that).
MAX_SYNTHETIC_SAMPLES = 979_200


def synthetic_size(spec: str) -> int:
    """N of ``synthetic:N``; a :class:`DatasetError` saying what is expected otherwise."""
    text = spec.split(":", 1)[1]
    if not text.isdigit() or not 1 <= int(text) <= MAX_SYNTHETIC_SAMPLES:
        raise DatasetError(f"--dataset {spec!r}: synthetic:N needs a whole number of images from 1 to "
                           f"{MAX_SYNTHETIC_SAMPLES:,} (the published set has 9,792), e.g. synthetic:9792")
    return int(text)


def held_out_split(source: ImageCaptionSource, batch_size: int, fraction: float = 0.1, limit: int | None = None
                   ) -> tuple[ImageCaptionSource, ImageCaptionSource, str]:
    """(training samples, held-out samples, what the split is): a deterministic ``fraction`` held out by name
    (:func:`workloads.bridgetower.evaluation.held_out_indices`), of which the first ``limit`` are evaluated
    (``--eval-samples``; all by default). A dataset too small to give up any sample and still fill a batch is
    evaluated on its training samples, and the description says so."""
    from workloads.bridgetower.data.hub import SourceSubset
    from workloads.bridgetower.evaluation import held_out_indices

    names = [source.sample_key(i) for i in range(len(source))]  # inside the dataset: the same on every machine
    held = held_out_indices(names, fraction)
    kept = sorted(set(range(len(source))) - set(held))
    if len(kept) < batch_size or len(held) < 2:
        evaluated = source if limit is None else SourceSubset(source, list(range(min(limit, len(source)))), "eval")
        return source, evaluated, (f"training samples: {len(source)} samples cannot spare a held-out split and still "
                                   f"fill a batch of {batch_size}" + _limited(limit, len(evaluated)))
    evaluated_held = held if limit is None else held[:limit]
    return (SourceSubset(source, kept, "train"), SourceSubset(source, evaluated_held, "held-out"),
            f"held out: {len(held)} of {len(source)} samples ({fraction:.0%}, the lowest sha256 of their names within "
            "the dataset)" + _limited(limit, len(evaluated_held)))


def _limited(limit: int | None, evaluated: int) -> str:
    return "" if limit is None else f"; --eval-samples {limit}: {evaluated} of them evaluated"
