"""The held-out images preprocessed once before the run (workloads.bridgetower.eval_inputs): bitwise the pixels of
decoding at each evaluation, one file per inputs reused across runs, and every way the file can be wrong or
unwritable."""

import json
import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from suite.config import RunConfig
from workloads.bridgetower import eval_inputs
from workloads.bridgetower.data.loader import collate
from workloads.bridgetower.workload import BridgeTowerWorkload

from conftest import cpu_adapter

pytestmark = pytest.mark.mechanics


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty eval-inputs cache of this test's own (the synthetic data stay in the session's cache)."""
    import suite.fileio

    monkeypatch.setattr(suite.fileio, "cache_root", lambda: tmp_path / "cache")
    return tmp_path / "cache" / "bridgetower" / "eval-inputs"


def _workload(loader="cpu", eval_samples=44):
    """Set up on 44 held-out pairs: five full batches of 8 and a short one of 4."""
    config = RunConfig(workload="bridgetower", preset="tiny", device="cpu", num_workers=0, loader=loader,
                       precision="fp32", steps=4, warmup_steps=1, batch_size=8, dataset="synthetic:64",
                       eval_samples=eval_samples)
    from suite.devices.base import prepare_device

    device = cpu_adapter()
    prepare_device(config, device)  # seeds, as a configuration process does: the same model every time
    workload = BridgeTowerWorkload(config, device)
    workload.setup()
    return workload


def _decoded_at_evaluation(workload):
    """The batches an evaluation read before this change: the held-out dataset through a DataLoader."""
    return list(torch.utils.data.DataLoader(workload.eval_dataset, batch_size=8, shuffle=False, num_workers=0,
                                            collate_fn=collate))


@pytest.mark.parametrize("loader", ["cpu", "cpu-fast"])
def test_the_preprocessed_images_are_bitwise_what_decoding_at_each_evaluation_gave(cache, loader):
    workload = _workload(loader)
    assert workload.facts()["eval_images"].endswith("(made before the run, cached)")
    assert "eval_inputs" in workload.setup_clock.seconds
    before = _decoded_at_evaluation(workload)
    after = list(eval_inputs.batches(workload.eval_dataset, workload._eval_images, 8))
    assert [len(b["images"]) for b in after] == [8, 8, 8, 8, 8, 4]
    for old, new in zip(before, after, strict=True):
        for name in ("images", "input_ids", "attention_mask"):
            assert old[name].dtype == new[name].dtype and torch.equal(old[name], new[name]), name
    figures = workload.evaluate()
    workload._eval_images = None  # the evaluation as it was: decoding through the loader's pipeline
    assert workload.evaluate() == figures and figures["eval_samples"] == 44.0
    workload.teardown()


def test_a_second_run_reads_the_file_and_other_inputs_get_their_own(cache):
    first = _workload()
    [made] = list(cache.iterdir())
    second = _workload()
    assert second.facts()["eval_images"] == ("preprocessed once by the reference pipeline before the run (from the "
                                             "cache)")
    assert os.fstat(second._eval_images.handle.fileno()).st_ino == made.stat().st_ino
    assert second.evaluate() == first.evaluate()
    _workload(eval_samples=40)  # other held-out images: another key, another file
    _workload("cpu-fast")  # another pipeline
    assert len(list(cache.iterdir())) == 3


def _damage_truncate(path):
    path.write_bytes(path.read_bytes()[:-100])


def _damage_flip_a_data_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _damage_garbage(path):
    path.write_bytes(os.urandom(4096))


def _damage_another_key(path):
    header, _, body = path.read_bytes().partition(b"\n")
    fields = json.loads(header)
    fields["key"] = fields["key"].replace('"count": 44', '"count": 45')
    path.write_bytes(json.dumps(fields).encode() + b"\n" + body)


def _damage_a_directory(path):
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize("damage", [_damage_truncate, _damage_flip_a_data_byte, _damage_garbage, _damage_another_key])
def test_a_damaged_or_foreign_file_is_made_again_never_read(cache, damage):
    clean = _workload()
    expected = clean.evaluate()
    [path] = list(cache.iterdir())
    damage(path)
    again = _workload()
    assert again.facts()["eval_images"].endswith("(made before the run, cached)"), again.facts()["eval_images"]
    assert again.evaluate() == expected
    assert _workload().facts()["eval_images"].endswith("(from the cache)")  # made whole again


def test_a_cache_that_cannot_be_written_keeps_the_images_for_this_run_only(cache):
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the folder should be")
    workload = _workload()
    fact = workload.facts()["eval_images"]
    assert "for this run only (the cache cannot be written:" in fact, fact
    handle = workload._eval_images.handle
    assert os.fstat(handle.fileno()).st_nlink == 0  # unlinked at once: nothing is left behind, whatever happens
    assert workload.evaluate()["eval_samples"] == 44.0
    workload.teardown()
    assert handle.closed


def test_the_cache_cleaned_or_replaced_mid_run_does_not_reach_the_run(cache):
    workload = _workload()
    expected = workload.evaluate()
    [path] = list(cache.iterdir())
    path.unlink()  # a user cleaning the cache while a run goes on
    assert workload.evaluate() == expected
    path.write_bytes(b"planted after the run checked it")
    assert workload.evaluate() == expected


def test_a_directory_where_the_file_should_be_is_not_read_and_the_run_goes_on(cache):
    _workload()
    [path] = list(cache.iterdir())
    _damage_a_directory(path)
    workload = _workload()
    assert "for this run only" in workload.facts()["eval_images"]
    assert workload.evaluate()["eval_samples"] == 44.0


def test_held_out_images_too_large_for_one_file_are_decoded_at_each_evaluation(cache, monkeypatch):
    monkeypatch.setattr(eval_inputs, "MAX_BYTES", 1000)
    workload = _workload()
    assert workload._eval_images is None and not list(cache.iterdir())
    assert workload.facts()["eval_images"].startswith("decoded at each evaluation (44 held-out images of (3, 64, 64)")
    assert workload.evaluate()["eval_samples"] == 44.0


def test_a_changed_held_out_image_or_device_type_changes_the_key(cache, monkeypatch):
    workload = _workload()
    key = eval_inputs.cache_key(workload.eval_dataset, "cpu")
    source = workload.eval_dataset.source
    original = source.content_key
    monkeypatch.setattr(source, "content_key", lambda index: "changed" if index == 3 else original(index))
    assert eval_inputs.cache_key(workload.eval_dataset, "cpu") != key
    monkeypatch.undo()
    assert eval_inputs.cache_key(workload.eval_dataset, "cpu") == key
    assert eval_inputs.cache_key(workload.eval_dataset, "cuda") != key  # the closed pipeline ships uint8 there


def _make_in_a_process(cache_root: str, queue) -> None:
    import suite.fileio

    suite.fileio.cache_root = lambda: Path(cache_root)
    workload = _workload()
    queue.put((workload.facts()["eval_images"], workload.evaluate()["eval_accuracy"]))


def test_two_processes_making_the_file_at_once_both_run_and_leave_one_whole_file(cache):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_make_in_a_process, args=(str(cache.parent.parent), queue))
                 for _ in range(2)]
    for process in processes:
        process.start()
    outcomes = [queue.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert len({accuracy for _, accuracy in outcomes}) == 1
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] and not [
        p for p in cache.iterdir() if p.name.startswith(".eval-inputs.")]  # no temporary file left behind
    assert _workload().facts()["eval_images"].endswith("(from the cache)")


def test_a_corrupt_held_out_image_fails_the_set_up_naming_it_before_any_training(cache, tmp_path):
    import shutil

    from suite.errors import DatasetError
    from workloads.bridgetower.data.synthetic import ensure_synthetic

    dataset = tmp_path / "data"
    shutil.copytree(ensure_synthetic(samples=16, seed=5, root=tmp_path / "synthetic"), dataset)
    victim = dataset / "00003.jpg"  # the set is too small to hold pairs out: its training pairs are evaluated
    victim.write_bytes(victim.read_bytes()[:1500])
    config = RunConfig(workload="bridgetower", preset="tiny", device="cpu", num_workers=0, loader="cpu",
                       precision="fp32", steps=2, batch_size=16, dataset=str(dataset))
    workload = BridgeTowerWorkload(config, cpu_adapter())
    with pytest.raises(DatasetError, match=f"cannot decode image {victim}"):
        workload.setup()
    assert "eval_inputs" in workload.setup_clock.seconds and not list(cache.iterdir())  # nothing half-made kept
