"""The torch Dataset and DataLoader for every loader.

* ``cpu`` loader (the reference method): workers run the ``reference`` image pipeline (decode and
  preprocess); batches carry its output under ``images``, finished by its device stage.
* ``cpu-fast`` loader: the same with our ``closed`` pipeline (equal output within float16 rounding,
  see :mod:`.pipelines`).
* ``device`` loader: workers only read encoded bytes (``encoded_images``) and their headers (``image_kinds``: what
  the device decoder may leave to the host); the device decodes and preprocesses them inside the training step.
  ``num_workers`` keeps its meaning (processes reading bytes).

Order is deterministic: each epoch's permutation depends only on (seed, epoch) (:class:`EpochShuffle`), and the
generator that seeds the workers is another one, so the loss trajectory is the same for every ``num_workers``
in every epoch. (torch's DataLoader draws its workers' base seed from ``loader.generator`` each time it builds an
iterator: once with persistent workers, once per epoch without; a generator shared with the shuffling reached
epoch 2 in a different state.)

Every image read passes the dataset's bounds (:mod:`.bounds`) before any decoder sees it, whatever the loader, and,
where the workers decode, each worker's share of the loader's memory budget.
A loader worker that delivers no batch for ``loader_timeout_s`` fails the run, naming the sample each worker
was reading (workers note it in a shared array as they go).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, default_collate

from suite.errors import DatasetError
from suite.imaging import ImageKind

from workloads.bridgetower.data.bounds import DecodeBudget, ImageBounds
from workloads.bridgetower.data.pipelines import PIPELINES, ClosedPipeline, ImagePipeline, ReferencePipeline
from workloads.bridgetower.data.shared_batches import collation, of_loader
from workloads.bridgetower.data.sources import ImageCaptionSource

if TYPE_CHECKING:
    pass

#: The image pipeline each worker-side loader runs.
LOADER_PIPELINES: dict[str, type[ImagePipeline]] = {"cpu": ReferencePipeline, "cpu-fast": ClosedPipeline}
#: Which loader a pipeline belongs to (what the workload reports as observed, from the pipeline that ran).
LOADER_OF_PIPELINE: dict[str, str] = {"reference": "cpu", "closed": "cpu-fast"}


_NOTHING = -1  # a worker that is not reading a sample


class CaptionedImages(Dataset):
    def __init__(self, source: ImageCaptionSource, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 loader: str, image_size: int, device_type: str = "cpu", bounds: ImageBounds | None = None,
                 pipeline: str | None = None, budget: DecodeBudget | None = None) -> None:
        if len(source) != len(input_ids):
            raise ValueError("one tokenized caption per sample is required")
        self.source, self.input_ids, self.attention_mask = source, input_ids, attention_mask
        self.loader, self.image_size = loader, image_size
        self.bounds = bounds or ImageBounds.of(None, None)
        self.bounds.apply_to_pillow()  # forked loader workers inherit it
        self.budget = budget  # each worker's share of --loader-memory; None: not checked
        self._budget_here: tuple[int, DecodeBudget] | None = None  # (pid, the budget measured in that process)
        chosen = PIPELINES[pipeline] if pipeline is not None else LOADER_PIPELINES.get(loader)
        self.pipeline: ImagePipeline | None = chosen(image_size, device_type) if chosen is not None else None
        # the sample each loader worker is reading (shared memory, written by the workers), for the watchdog;
        # sized for the workers by make_loader
        self.reading = multiprocessing.RawArray("q", [_NOTHING])

    def __len__(self) -> int:
        return len(self.source)

    def stuck_samples(self) -> list[str]:
        """The samples loader workers are reading right now (names), for a timeout's reason."""
        return [f"worker {worker} was reading {self.source.name_of(index)}" for worker, index in enumerate(self.reading)
                if index != _NOTHING]

    def __getitem__(self, index: int) -> dict[str, Any]:
        info = torch.utils.data.get_worker_info()
        slot = info.id if info is not None else 0
        self.reading[slot] = index
        try:
            return self._item(index)
        finally:
            self.reading[slot] = _NOTHING

    def finish_on_device(self, images: Any, device: torch.device | str) -> Any:
        """The device stage of the worker-side pipeline, on a batch of what its worker stage made."""
        if self.pipeline is None:
            raise DatasetError(f"loader {self.loader!r} ships encoded images: it has no device stage to finish")
        return self.pipeline.device_stage(images, device)

    def _item(self, index: int) -> dict[str, Any]:
        data = self.source.read_bytes(index)
        size = self.bounds.check(data, self.source.name_of(index))
        if self.pipeline is not None and self.budget is not None and size is not None:
            self.budget_here().check(self.pipeline.peak_bytes(data, *size), self.source.name_of(index),
                                     self.pipeline.name)
        item: dict[str, Any] = {"input_ids": self.input_ids[index], "attention_mask": self.attention_mask[index]}
        if self.pipeline is None:
            item["encoded_images"] = data
            item["image_names"] = self.source.name_of(index)  # so a decode failure on the device names the file
            item["image_kinds"] = ImageKind.of(data).spelled()  # what the device decoder may leave to the host
            return item
        try:
            item["images"] = self.pipeline.worker_stage(data)
        except Exception as exc:  # any decode failure names the file
            raise DatasetError(f"cannot decode image {self.source.name_of(index)}: {exc}") from exc
        return item

    def budget_here(self) -> DecodeBudget:
        """The decode budget in this process (measured once per process: a worker, or the training process)."""
        assert self.budget is not None
        if self._budget_here is None or self._budget_here[0] != os.getpid():
            self._budget_here = (os.getpid(), self.budget.in_this_process())
        return self._budget_here[1]

    def worker_init(self, worker_id: int) -> None:
        """``worker_init_fn``: seed the worker, then let the pipeline set itself up."""
        seed_worker(worker_id)
        if self.pipeline is not None:
            self.pipeline.worker_init()


class EpochShuffle(Sampler[int]):
    """A random permutation of ``range(size)`` per epoch that depends only on ``(seed, epoch)``."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        key = hashlib.sha256(f"epoch-shuffle:{self.seed}:{self.epoch}".encode()).digest()
        generator = torch.Generator()
        generator.manual_seed(int.from_bytes(key[:8], "little") & (2**63 - 1))
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self) -> int:
        return self.size


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """torch's default collation: tensors stacked (straight into shared memory inside a worker), encoded
    images kept as a list of bytes."""
    return default_collate(items)


def seed_worker(worker_id: int) -> None:
    """Seed Python and NumPy in a loader worker from torch's per-worker seed (itself from the generator)."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def make_loader(dataset: CaptionedImages, batch_size: int, num_workers: int, seed: int,
                pin_memory: bool = False, prefetch_factor: int | None = None,
                loader_timeout_s: float | None = None) -> DataLoader:
    """A seeded loader; under torch.distributed, each rank reads its own shard (DistributedSampler). With
    workers, ``loader_timeout_s`` bounds the wait for one batch (torch's own ``timeout``). The workers of a pipeline
    that :attr:`~.pipelines.ImagePipeline.reuses_batch_memory` stack its images into reused shared memory
    (:mod:`.shared_batches`; not under an address-space limit); :func:`endless` hands each batch back to it."""
    import torch.distributed as dist

    if len(dataset.reading) < max(num_workers, 1):
        dataset.reading = multiprocessing.RawArray("q", [_NOTHING] * num_workers)
    distributed = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    if len(dataset) < batch_size * world:
        raise DatasetError(f"the dataset has {len(dataset)} samples, fewer than one batch of {batch_size}"
                           + (f" per rank on {world} ranks" if distributed else ""))
    worker_seeds = torch.Generator()  # seeds the workers only; the order comes from the sampler alone
    worker_seeds.manual_seed(seed)
    sampler = (DistributedSampler(dataset, num_replicas=world, rank=dist.get_rank(), shuffle=True, seed=seed,
                                  drop_last=True)
               if distributed else EpochShuffle(len(dataset), seed))
    reuses = dataset.pipeline is not None and dataset.pipeline.reuses_batch_memory
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collation(reuses, num_workers, prefetch_factor, fallback=collate),
        drop_last=True,  # every step has exactly the recorded batch size
        worker_init_fn=dataset.worker_init,
        generator=worker_seeds,
        persistent_workers=num_workers > 0,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        timeout=loader_timeout_s if num_workers > 0 and loader_timeout_s else 0,
    )


def endless(loader: DataLoader) -> Iterator[dict[str, Any]]:
    """Batches forever; each pass is a new epoch with the next shuffled order. A loader timeout becomes a
    :class:`DatasetError` naming the samples the workers were stuck on."""
    shared = of_loader(loader)
    epoch = 0
    while True:
        if hasattr(loader.sampler, "set_epoch"):  # EpochShuffle, DistributedSampler: the order of this epoch
            loader.sampler.set_epoch(epoch)
        try:
            if shared is None:
                yield from loader
            else:
                for batch in loader:
                    yield shared.received(batch)
        except RuntimeError as exc:
            if "DataLoader timed out" not in str(exc):
                raise
            dataset = loader.dataset
            stuck = dataset.stuck_samples() if isinstance(dataset, CaptionedImages) else []
            raise DatasetError(f"no batch from the loader workers for {loader.timeout:g} s (--loader-timeout)"
                               + (f": {'; '.join(stuck)}" if stuck else "")) from None
        epoch += 1
