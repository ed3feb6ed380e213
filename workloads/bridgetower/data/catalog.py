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
    if spec is None or is_synthetic(spec):
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


#: The synthetic sets' evaluation split: generated apart from every training set (its own seed), never trained on.
EVAL_SYNTHETIC_SAMPLES = 512
EVAL_SYNTHETIC_SEED = 1


def is_synthetic(spec: str | None) -> bool:
    return spec is None or spec == "synthetic" or spec.startswith("synthetic:")


def open_evaluation_source(spec: str | None, bounds: ImageBounds | None = None) -> ImageCaptionSource | None:
    """The separate evaluation set of a synthetic dataset (:data:`EVAL_SYNTHETIC_SAMPLES` pairs drawn with
    :data:`EVAL_SYNTHETIC_SEED`, generated once and cached); ``None`` for other datasets, which hold out a share of
    their own samples (:func:`held_out_split`)."""
    if not is_synthetic(spec):
        return None
    root = ensure_synthetic(EVAL_SYNTHETIC_SAMPLES, EVAL_SYNTHETIC_SEED)
    return ImageFolderSource(root, kind="synthetic-eval", max_bytes=(bounds or ImageBounds.of(None, None)).max_bytes,
                             facts={"generation": generation_facts(root)})


class NoHeldOutSplit(DatasetError):
    """The dataset cannot spare held-out samples, so a quality target cannot be judged on it."""


def held_out_split(source: ImageCaptionSource, batch_size: int, fraction: float = 0.1, limit: int | None = None,
                   evaluation: ImageCaptionSource | None = None, need_held_out: bool = False
                   ) -> tuple[ImageCaptionSource, ImageCaptionSource, str]:
    """(training samples, evaluated samples, what the split is). With a separate ``evaluation`` set (the synthetic
    data's), training uses every sample. Otherwise a deterministic ``fraction`` is held out by image content
    (:func:`workloads.bridgetower.evaluation.held_out_indices`: a repeated picture is on one side only). Of the
    held-out samples the first ``limit`` are evaluated (``--eval-samples``; by default at most
    :data:`DEFAULT_EVAL_LIMIT`: a 100,000-image folder's 10,000 held-out pairs took over 15 minutes per evaluation
    on 2 cores). A dataset too small to
    give up any sample and still fill a batch is evaluated on its training samples, and the description says so;
    with ``need_held_out`` (a quality target) it is refused instead (:class:`NoHeldOutSplit`)."""
    from workloads.bridgetower.data.hub import SourceSubset
    from workloads.bridgetower.evaluation import held_out_indices

    if evaluation is not None:
        evaluated = evaluation if limit is None else SourceSubset(evaluation, list(range(min(limit, len(evaluation)))),
                                                                  "eval")
        return source, evaluated, (f"a separate evaluation set: {len(evaluation)} synthetic pairs generated with their "
                                   f"own seed ({EVAL_SYNTHETIC_SEED}), never trained on; training uses all "
                                   f"{len(source)} samples" + _limited(limit, len(evaluated)))
    held = held_out_indices([source.content_key(i) for i in range(len(source))], fraction)
    kept = sorted(set(range(len(source))) - set(held))
    bounded = limit is None and len(held) > DEFAULT_EVAL_LIMIT
    if bounded:
        limit = DEFAULT_EVAL_LIMIT
    if len(kept) < batch_size or len(held) < 2:
        if need_held_out:
            raise NoHeldOutSplit(
                f"--target-quality needs held-out samples, and this dataset's {len(source)} cannot spare them and "
                f"still fill a batch of {batch_size}: use a larger dataset (or the synthetic one, which has its own "
                "evaluation set)")
        evaluated = source if limit is None else SourceSubset(source, list(range(min(limit, len(source)))), "eval")
        return source, evaluated, (f"training samples: {len(source)} samples cannot spare a held-out split and still "
                                   f"fill a batch of {batch_size}" + _limited(limit, len(evaluated)))
    evaluated_held = held if limit is None else held[:limit]
    return (SourceSubset(source, kept, "train"), SourceSubset(source, evaluated_held, "held-out"),
            f"held out: {len(held)} of {len(source)} samples ({len(held) / len(source):.0%}: the images whose content "
            "hashes lowest, a repeated image on one side only)"
            + (f"; {DEFAULT_BOUND_NOTE}" if bounded else _limited(limit, len(evaluated_held))))


def _limited(limit: int | None, evaluated: int) -> str:
    return "" if limit is None else f"; --eval-samples {limit}: {evaluated} of them evaluated"


#: The held-out pairs an evaluation scores unless ``--eval-samples`` says otherwise: the published dataset holds out
#: ~980, so every one of its evaluations is whole; a larger folder's are its first 1,000 (said in the split's
#: description and up front).
DEFAULT_EVAL_LIMIT = 1000


#: How a split's description, and ``suite run`` up front, say that the default bound applies.
DEFAULT_BOUND_NOTE = (f"each evaluation scores the first {DEFAULT_EVAL_LIMIT:,} of them (the default bound; "
                      "--eval-samples N to choose: each pair costs a forward pass of its image and caption, so an "
                      "evaluation of N pairs takes about as long as N training samples' forward passes)")
