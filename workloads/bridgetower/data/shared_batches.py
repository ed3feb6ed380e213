"""Loader workers that stack their batches' images into shared memory they reuse, instead of fresh pages per batch.

torch's ``default_collate`` stacks a worker's batch into a new shared-memory file each time: the kernel zeroes and
maps every page of it in the worker, and maps it again in the main process. For a float32 batch of 48 images of
294 x 294 that is ~12 000 page faults on each side; on the 2-core CI machine a DataLoader that only moved ready-made
float32 images delivered ~1 850 images/s with it, ~7 300-8 000 with the buffers below (``suite bench-loader``
measures it on the real pipelines).

:class:`SharedBatches` gives each worker a ring of at most ``slots_per_worker`` shared buffers, made on first use
and reused once the main process no longer holds them. Reuse is safe by construction, whatever the consumer
does with its batches:

* a worker marks a slot *busy* (a flag in shared memory) before it sends it, and only ever writes a slot whose flag
  is clear; with no free slot it falls back to torch's own fresh buffer (counted, never waited for);
* the main process clears a slot's flag only once the storage it received is freed: it keeps a weak reference per
  received slot (torch's ``StorageWeakRef``, the one its own sharing cache uses) and looks at them each time a
  batch arrives (:meth:`SharedBatches.received`). A consumer that keeps a batch, or a view of it, keeps its slot.

The slot a batch came from travels in the batch under :data:`SLOT_KEY`; :meth:`received` takes it out. A loader
whose batches never pass :meth:`received` stays correct and only loses the reuse (every slot stays busy).
"""

from __future__ import annotations

import math
import multiprocessing
import resource
from typing import Any, Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import default_collate, get_worker_info

#: Where a pooled batch names its slot (taken out again by :meth:`SharedBatches.received`).
SLOT_KEY = "shared_batch_slot"
_FRESH = -1  # a batch stacked into a fresh buffer: no slot to release


class SharedBatches:
    """Per-worker rings of reused shared-memory buffers for one tensor key of the batches; see the module
    docstring. Made in the main process before the workers start (they inherit it)."""

    def __init__(self, workers: int, slots_per_worker: int, key: str = "images") -> None:
        if workers < 1 or slots_per_worker < 1:
            raise ValueError(f"need at least one worker and one slot, got {workers} and {slots_per_worker}")
        self.key, self.workers, self.slots_per_worker = key, workers, slots_per_worker
        self.busy = multiprocessing.RawArray("b", workers * slots_per_worker)  # 1: sent, maybe held by the main
        # per worker: batches stacked into a reused slot, into a new slot, into a fresh buffer (torch's own)
        self.counts = multiprocessing.RawArray("q", workers * 3)
        self._buffers: dict[int, torch.Tensor] = {}  # in a worker: its slots made so far
        self._disabled = False  # in a worker: a slot could not be made (e.g. an address-space limit)
        self._held: dict[int, StorageWeakRef] = {}  # in the main process: received slots, until freed there

    # -- worker side -------------------------------------------------------------------------------------------

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """``collate_fn``: torch's default collation, with :attr:`key` stacked into a free slot of this worker's
        ring (in the training process itself, without workers, plain default collation)."""
        info = get_worker_info()
        if info is None or info.id >= self.workers or not isinstance(items[0], dict) or self.key not in items[0]:
            return default_collate(items)
        batch = default_collate([{k: v for k, v in item.items() if k != self.key} for item in items])
        tensors = [item[self.key] for item in items]
        slot, buffer = self._free_slot(info.id, (len(tensors), *tensors[0].shape), tensors[0].dtype)
        if buffer is None:
            batch[self.key] = default_collate(tensors)
        else:
            torch.stack(tensors, out=buffer)
            self.busy[slot] = 1
            batch[self.key] = buffer
        batch[SLOT_KEY] = slot
        return batch

    def _free_slot(self, worker: int, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, torch.Tensor | None]:
        """A slot of ``worker``'s ring that the main process has released, reshaped for this batch; a new one while
        the ring has room; else ``(_FRESH, None)``."""
        if self._disabled:
            self.counts[worker * 3 + 2] += 1
            return _FRESH, None
        first = worker * self.slots_per_worker
        unused = None
        for slot in range(first, first + self.slots_per_worker):
            if self.busy[slot]:
                continue
            buffer = self._buffers.get(slot)
            if buffer is None:
                unused = slot if unused is None else unused
                continue
            if buffer.shape != shape or buffer.dtype != dtype:  # another batch shape: make the slot again
                del self._buffers[slot]
                unused = slot if unused is None else unused
                continue
            self.counts[worker * 3] += 1
            return slot, buffer
        if unused is not None:
            try:
                self._buffers[unused] = _new_shared(shape, dtype)
            except RuntimeError:  # no room to map it: torch's own buffers from now on in this worker
                self._disabled = True
            else:
                self.counts[worker * 3 + 1] += 1
                return unused, self._buffers[unused]
        self.counts[worker * 3 + 2] += 1
        return _FRESH, None

    # -- main-process side -------------------------------------------------------------------------------------

    def received(self, batch: dict[str, Any]) -> dict[str, Any]:
        """In the main process, for every batch the loader yields: release the slots whose storage is freed here,
        take this batch's slot out of it and hold it until its storage is freed in turn. Returns the batch."""
        for slot, ref in list(self._held.items()):
            if ref.expired():
                del self._held[slot]
                self.busy[slot] = 0
        slot = batch.pop(SLOT_KEY, _FRESH) if isinstance(batch, dict) else _FRESH
        if slot != _FRESH:
            self._held[int(slot)] = StorageWeakRef(batch[self.key].untyped_storage())
        return batch

    def describe(self) -> dict[str, Any]:
        """Slots per worker and how the batches so far were stacked (all workers)."""
        counts = list(self.counts)
        return {"slots_per_worker": self.slots_per_worker, "reused": sum(counts[0::3]), "new": sum(counts[1::3]),
                "fresh": sum(counts[2::3])}


def _new_shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized tensor in a new shared-memory file (as ``default_collate`` makes one in a worker)."""
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)  # the storage holds exactly ``numel`` elements


def collation(reuses_batch_memory: bool, workers: int, prefetch_factor: int | None,
              fallback: Callable[[list[Any]], Any] = default_collate) -> Callable[[list[Any]], Any]:
    """The ``collate_fn`` of a DataLoader of a pipeline that does (or not) reuse batch memory: a new ring's
    :meth:`SharedBatches.collate` where it does, has workers, and this process has no address-space limit; else
    ``fallback``."""
    if reuses_batch_memory and workers > 0 and not address_space_limited():
        return SharedBatches(workers, slots_for(prefetch_factor)).collate
    return fallback


def slots_for(prefetch_factor: int | None) -> int:
    """Slots per worker for a DataLoader with this ``prefetch_factor`` (None: torch's default, 2): the batches torch
    keeps in flight per worker, plus the one being trained on and the one before it (released at the next batch)."""
    return (2 if prefetch_factor is None else prefetch_factor) + 2


def of_loader(loader: Any) -> SharedBatches | None:
    """The rings a DataLoader collates into (its ``collate_fn`` is :meth:`SharedBatches.collate`), else None."""
    owner = getattr(getattr(loader, "collate_fn", None), "__self__", None)
    return owner if isinstance(owner, SharedBatches) else None


def address_space_limited() -> bool:
    """Whether this process runs under an address-space limit (``--memory-limit``): the rings' mappings, held for the
    whole run, would eat into what the decode budget measured as left, so loaders do without them there."""
    return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY
