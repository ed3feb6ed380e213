"""Loader workers' reused shared-memory batches (workloads/bridgetower/data/shared_batches.py), with torch's real
DataLoader and worker processes: what a consumer holds is never overwritten, what it drops is reused."""

import resource

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from suite.config import RunConfig
from suite.devices.base import prepare_device
from workloads.bridgetower.data import shared_batches
from workloads.bridgetower.data.loader import CaptionedImages, endless, make_loader
from workloads.bridgetower.data.shared_batches import SLOT_KEY, SharedBatches, address_space_limited, of_loader
from workloads.bridgetower.data.sources import ImageFolderSource
from workloads.bridgetower.data.synthetic import ensure_synthetic
from workloads.bridgetower.workload import BridgeTowerWorkload

from conftest import cpu_adapter


class _Numbered(Dataset):
    """Item i: an image filled with i, and i itself."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"images": torch.full((3, 8, 8), float(index)), "index": torch.tensor(index)}


def _loader(size: int, workers: int, slots: int, batch: int = 2, drop_last: bool = True) -> DataLoader:
    return DataLoader(_Numbered(size), batch_size=batch, num_workers=workers, drop_last=drop_last,
                      collate_fn=SharedBatches(workers, slots).collate, persistent_workers=True)


def _intact(batch: dict) -> bool:
    return bool((batch["images"] == batch["index"].view(-1, 1, 1, 1).float()).all())


@pytest.mark.parametrize("workers", [1, 2])
def test_a_consumer_that_keeps_every_batch_finds_each_one_intact(workers):
    # every batch stays held: no slot may be written again, so the workers run out of slots and fall back to
    # torch's fresh buffers (a ring that reused slots regardless would overwrite the kept batches)
    loader = _loader(40, workers, slots=2)
    shared = of_loader(loader)
    kept = [shared.received(batch) for batch in loader]
    assert len(kept) == 20 and all(SLOT_KEY not in batch for batch in kept)
    assert all(_intact(batch) for batch in kept)
    assert sorted(int(i) for batch in kept for i in batch["index"]) == list(range(40))
    counts = shared.describe()
    assert counts["reused"] == 0 and counts["new"] == 2 * workers and counts["fresh"] == 20 - 2 * workers


def test_a_consumer_that_drops_its_batches_gets_them_from_reused_slots():
    loader = _loader(200, workers=2, slots=4)
    shared = of_loader(loader)
    seen = []
    for epoch in range(2):
        for batch in loader:
            batch = shared.received(batch)
            assert _intact(batch)
            seen.extend(int(i) for i in batch["index"])
    assert sorted(seen) == sorted(list(range(200)) * 2)
    counts = shared.describe()
    assert counts["reused"] + counts["new"] + counts["fresh"] == 200
    assert counts["new"] <= 2 * 4 and counts["reused"] >= 150  # torch's prefetch of 2 per worker fits in 4 slots


def test_a_view_kept_from_a_batch_keeps_its_slot():
    loader = _loader(60, workers=1, slots=3)
    shared = of_loader(loader)
    views = []
    for batch in loader:
        batch = shared.received(batch)
        views.append((int(batch["index"][1]), batch["images"][1]))  # a view of the slot, the batch dropped
    assert all(bool((view == index).all()) for index, view in views)


def test_another_batch_shape_remakes_the_slot():
    loader = _loader(7, workers=1, slots=4, batch=3, drop_last=False)  # 3, 3, then 1
    shared = of_loader(loader)
    for _ in range(3):
        sizes = []
        for batch in loader:
            batch = shared.received(batch)
            assert _intact(batch)
            sizes.append(len(batch["index"]))
        assert sizes == [3, 3, 1]


def test_in_the_training_process_itself_it_is_torchs_default_collation():
    items = [_Numbered(4)[i] for i in range(4)]
    batch = SharedBatches(1, 2).collate(items)
    expected = default_collate(items)
    assert set(batch) == set(expected) and all(torch.equal(batch[k], expected[k]) for k in expected)
    copy = dict(batch)
    assert SharedBatches(1, 2).received(copy) is copy and set(copy) == set(batch)  # no slot: passes untouched


def test_batches_without_the_key_are_torchs_default_collation():
    loader = DataLoader([{"index": torch.tensor(i)} for i in range(8)], batch_size=2, num_workers=1,
                        collate_fn=SharedBatches(1, 2).collate)
    shared = of_loader(loader)
    assert [shared.received(batch)["index"].tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert shared.describe()["new"] == 0


def test_a_slot_that_cannot_be_mapped_falls_back_to_torchs_buffers(monkeypatch):
    def no_room(*_args):
        raise RuntimeError("unable to mmap: Cannot allocate memory")

    monkeypatch.setattr(shared_batches, "_new_shared", no_room)  # the forked workers inherit it
    loader = _loader(20, workers=1, slots=2)
    shared = of_loader(loader)
    batches = [shared.received(batch) for batch in loader]
    assert len(batches) == 10 and all(_intact(batch) for batch in batches)
    assert shared.describe() == {"slots_per_worker": 2, "reused": 0, "new": 0, "fresh": 10}


def test_rings_are_refused_without_workers_or_slots():
    with pytest.raises(ValueError, match="at least one worker"):
        SharedBatches(0, 2)
    with pytest.raises(ValueError, match="at least one worker"):
        SharedBatches(2, 0)


def _dataset(tmp_path, loader: str) -> CaptionedImages:
    source = ImageFolderSource(ensure_synthetic(samples=16, seed=2, root=tmp_path / "data"))
    ids = torch.arange(16).unsqueeze(1)
    return CaptionedImages(source, ids, ids, loader, 64)


def test_the_fast_loaders_workers_reuse_batch_memory_and_the_reference_does_not(tmp_path):
    fast = make_loader(_dataset(tmp_path, "cpu-fast"), batch_size=4, num_workers=2, seed=1)
    assert of_loader(fast) is not None and of_loader(fast).slots_per_worker == 4
    assert of_loader(make_loader(_dataset(tmp_path, "cpu"), batch_size=4, num_workers=2, seed=1)) is None
    assert of_loader(make_loader(_dataset(tmp_path, "cpu-fast"), batch_size=4, num_workers=0, seed=1)) is None
    batches = endless(fast)
    # the same pixels as the workers' own pipeline makes in this process, whichever buffer carried them
    dataset = fast.dataset
    for _ in range(12):  # three epochs of four batches
        batch = next(batches)
        assert SLOT_KEY not in batch
        expected = torch.stack([dataset.pipeline.worker_stage(dataset.source.read_bytes(int(i)))
                                for i in batch["input_ids"].flatten()])
        assert torch.equal(batch["images"], expected)
    assert sum(of_loader(fast).describe()[k] for k in ("reused", "new", "fresh")) >= 12


def test_under_an_address_space_limit_the_loader_keeps_torchs_buffers(tmp_path, monkeypatch):
    assert address_space_limited() is (resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY)
    monkeypatch.setattr(shared_batches, "address_space_limited", lambda: True)
    assert of_loader(make_loader(_dataset(tmp_path, "cpu-fast"), batch_size=4, num_workers=2, seed=1)) is None


def test_a_fast_loader_run_trains_from_reused_memory_and_records_how_batches_crossed():
    config = RunConfig(workload="bridgetower", preset="tiny", device="cpu", num_workers=2, loader="cpu-fast",
                       precision="fp32", steps=14, warmup_steps=1, batch_size=4, dataset="synthetic:32")
    device = cpu_adapter()
    prepare_device(config, device)
    workload = BridgeTowerWorkload(config, device)
    workload.setup()
    try:
        batches = workload.batches()
        losses = [float(workload.train_step(next(batches))) for _ in range(15)]  # two epochs of eight batches
        assert all(loss == loss and loss > 0 for loss in losses)
        crossed = workload.facts()["batch_transfer"]
        assert crossed["slots_per_worker"] == 4 and crossed["reused"] > 0
        assert crossed["reused"] + crossed["new"] + crossed["fresh"] >= 15
    finally:
        workload.teardown()
