"""BridgeTower data: synthetic set, imagefolder source, tokenizer and reference preprocessing."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from suite.errors import DatasetError
from workloads.bridgetower.data.loader import CaptionedImages, collate, make_loader
from workloads.bridgetower.data.catalog import open_source
from workloads.bridgetower.data.sources import ImageFolderSource
from workloads.bridgetower.data.synthetic import draw_cartoon, ensure_synthetic
from workloads.bridgetower.preprocessing import CLIP_MEAN, CLIP_STD, center_crop_offsets, preprocess_image, resized_hw
from workloads.bridgetower.tokenizer import build_byte_level_tokenizer, tokenizer_fingerprint


def test_synthetic_set_is_deterministic_real_jpegs(tmp_path):
    root = ensure_synthetic(samples=6, seed=3, root=tmp_path / "a")
    again = ensure_synthetic(samples=6, seed=3, root=tmp_path / "b")
    rows = [json.loads(line) for line in (root / "metadata.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(set(r) == {"file_name", "image_description"} for r in rows)
    for row in rows:
        data = (root / row["file_name"]).read_bytes()
        assert data == (again / row["file_name"]).read_bytes()
        with Image.open(io.BytesIO(data)) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            assert 480 <= image.width <= 800 and 400 <= image.height <= 720
    # cached: a second call does not regenerate
    stamp = (root / "metadata.jsonl").stat().st_mtime_ns
    assert ensure_synthetic(samples=6, seed=3, root=tmp_path / "a") == root
    assert (root / "metadata.jsonl").stat().st_mtime_ns == stamp


def test_synthetic_images_are_mostly_light_line_drawings():
    image, caption = draw_cartoon(0)
    gray = torch.from_numpy(np.asarray(image.convert("L"), dtype=np.float32))
    assert (gray > 200).float().mean() > 0.6  # mostly paper
    assert (gray < 80).float().mean() > 0.002  # with ink
    assert caption.endswith(".") and len(caption.split()) > 6


def _folder(tmp_path, rows, images=True):
    tmp_path.mkdir(parents=True, exist_ok=True)
    if images:
        for row in rows:
            Image.new("RGB", (40, 30), (200, 10, 10)).save(tmp_path / row["file_name"])
    (tmp_path / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_imagefolder_source_reads_captions_and_bytes(tmp_path):
    rows = [{"file_name": f"{i}.jpg", "image_description": f"caption {i}"} for i in range(3)]
    source = ImageFolderSource(_folder(tmp_path, rows))
    assert len(source) == 3 and source.captions()[2] == "caption 2"
    assert source.read_bytes(0)[:2] == b"\xff\xd8"  # JPEG SOI marker
    assert source.describe()["num_samples"] == 3


def test_imagefolder_errors_are_clear(tmp_path):
    with pytest.raises(DatasetError, match="dataset path does not exist"):
        open_source(str(tmp_path / "missing"))
    with pytest.raises(DatasetError, match="no metadata.jsonl"):
        ImageFolderSource(tmp_path)
    folder = _folder(tmp_path / "nocap", [{"file_name": "0.jpg", "text": "x"}])
    with pytest.raises(DatasetError, match="no column 'image_description'; columns present: file_name, text"):
        ImageFolderSource(folder)
    empty = _folder(tmp_path / "empty", [])
    with pytest.raises(DatasetError, match="lists no samples"):
        ImageFolderSource(empty)
    gone = _folder(tmp_path / "gone", [{"file_name": "0.jpg", "image_description": "x"}], images=False)
    with pytest.raises(DatasetError, match=r"metadata.jsonl:1: no such image file .*0\.jpg"):  # up front
        ImageFolderSource(gone)
    with pytest.raises(DatasetError, match=r"cannot read image .*0\.jpg"):  # at read time (--skip-bad-samples)
        ImageFolderSource(gone, strict_files=False).read_bytes(0)


def test_byte_level_tokenizer_is_deterministic_and_roberta_shaped():
    first, second = build_byte_level_tokenizer(), build_byte_level_tokenizer()
    assert tokenizer_fingerprint(first) == tokenizer_fingerprint(second)
    enc = first(["hi"], max_length=8, padding="max_length", truncation=True)
    assert enc["input_ids"][0][0] == 0 and enc["input_ids"][0][3] == 2  # <s> h i </s>
    assert enc["input_ids"][0][4:] == [1] * 4 and enc["attention_mask"][0] == [1] * 4 + [0] * 4
    assert len(first) == 261


@pytest.mark.parametrize("hw,size,expected", [((480, 640), 294, (294, 392)), ((700, 500), 294, (411, 294)),
                                              ((294, 294), 294, (294, 294)), ((10, 7), 5, (7, 5))])
def test_resize_rule_matches_torchvision_resize_shorter_side(hw, size, expected):
    assert resized_hw(*hw, size) == expected


def test_center_crop_offsets_round_like_torchvision():
    assert center_crop_offsets(392, 294, 294) == (49, 0)
    assert center_crop_offsets(295, 294, 294) == (0, 0)  # round(0.5) == 0 (banker's rounding, as torchvision)
    assert center_crop_offsets(297, 294, 294) == (2, 0)  # round(1.5) == 2


def test_preprocess_normalizes_with_clip_statistics():
    image = torch.full((3, 294, 294), 128, dtype=torch.uint8)
    out = preprocess_image(image, 294)
    for channel in range(3):
        expected = (128 / 255 - CLIP_MEAN[channel]) / CLIP_STD[channel]
        assert torch.allclose(out[channel], torch.tensor(expected), atol=1e-6)
    resized = preprocess_image(torch.randint(0, 256, (3, 480, 640), dtype=torch.uint8), 64)
    assert resized.shape == (3, 64, 64) and resized.dtype == torch.float32


def test_cpu_and_device_loader_paths_give_the_same_pixels(tmp_path):
    root = ensure_synthetic(samples=8, seed=1, root=tmp_path)
    source = ImageFolderSource(root)
    ids = torch.zeros(8, 4, dtype=torch.long)
    cpu_items = CaptionedImages(source, ids, ids, "cpu", 64)
    dev_items = CaptionedImages(source, ids, ids, "device", 64)
    from suite.devices.cpu import CPUAdapter

    adapter = CPUAdapter()
    adapter.setup()
    cpu_batch = collate([cpu_items[i] for i in range(4)])
    dev_batch = collate([dev_items[i] for i in range(4)])
    decoded = torch.stack([preprocess_image(i, 64) for i in adapter.decoders.for_loader("device")(
        dev_batch["encoded_images"], 64, (0.5,) * 3, (0.5,) * 3)])
    assert torch.equal(cpu_batch["images"], decoded)


def test_loader_order_is_seeded_and_independent_of_workers(tmp_path):
    root = ensure_synthetic(samples=16, seed=2, root=tmp_path)
    source = ImageFolderSource(root)
    ids = torch.arange(16).unsqueeze(1)
    dataset = CaptionedImages(source, ids, ids, "device", 64)
    orders = []
    for workers in (0, 2):
        loader = make_loader(dataset, batch_size=4, num_workers=workers, seed=42)
        orders.append([b["input_ids"].flatten().tolist() for b in loader])
    assert orders[0] == orders[1]
    assert sorted(sum(orders[0], [])) == list(range(16))
    with pytest.raises(DatasetError, match="fewer than one batch"):
        make_loader(dataset, batch_size=32, num_workers=0, seed=1)


def _mixed_folder(tmp_path):
    """Images in every mode real datasets have, plus unusable files."""
    rows = []
    for i, mode in enumerate(("RGB", "L", "P", "RGBA", "CMYK", "LA")):
        name = f"{i}.{'jpg' if mode in ('RGB', 'L', 'CMYK') else 'png'}"
        Image.new(mode, (50 + i, 40)).save(tmp_path / name)
        rows.append({"file_name": name, "image_description": mode})
    (tmp_path / "not-an-image.jpg").write_text("hello")
    (tmp_path / "truncated.jpg").write_bytes((tmp_path / "0.jpg").read_bytes()[:200])
    rows += [{"file_name": "not-an-image.jpg", "image_description": "text"},
             {"file_name": "truncated.jpg", "image_description": "cut"},
             {"file_name": "missing.jpg", "image_description": "gone"}]
    (tmp_path / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_every_image_mode_becomes_rgb_and_bad_files_are_named(tmp_path):
    source = ImageFolderSource(_mixed_folder(tmp_path), strict_files=False)  # missing.jpg left to the read
    ids = torch.zeros(len(source), 4, dtype=torch.long)
    items = CaptionedImages(source, ids, ids, "cpu", 32)
    for index in range(6):
        assert items[index]["images"].shape == (3, 32, 32)
    for index, name in [(6, "not-an-image.jpg"), (7, "truncated.jpg"), (8, "missing.jpg")]:
        with pytest.raises(DatasetError, match=rf"cannot (decode|read) image .*{name}"):
            items[index]


def test_skip_bad_samples_leaves_them_out_and_records_them(tmp_path):
    folder = _mixed_folder(tmp_path)
    source = open_source(str(folder), skip_bad_samples=True)
    assert len(source) == 6 and source.captions() == ["RGB", "L", "P", "RGBA", "CMYK", "LA"]
    described = source.describe()
    assert described["skipped_samples"] == 3
    assert sorted(s["sample"].rsplit("/", 1)[1] for s in described["skipped"]) == [
        "missing.jpg", "not-an-image.jpg", "truncated.jpg"]
    assert source.fingerprint()["num_usable"] == 6


def test_a_dataset_with_no_usable_sample_is_an_error(tmp_path):
    (tmp_path / "a.jpg").write_text("not an image")
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "a.jpg", "image_description": "x"}) + "\n")
    with pytest.raises(DatasetError, match="no usable samples: all 1 failed to decode"):
        open_source(str(tmp_path), skip_bad_samples=True)
