"""Issue 27, point 7: each loader worker's share of ``--loader-memory``, checked from the header before decoding.

The pipelines' estimates (:meth:`ImagePipeline.peak_bytes`) are checked against measured peaks in a fresh process
(``tests/measure_decode_peak.py``): an estimate below the measurement would let workers overrun the budget, one far
above it would refuse images that fit."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from suite.cli import main
from suite.errors import DatasetError
from workloads.bridgetower.data.bounds import DEFAULT_LOADER_MEMORY_BYTES, DecodeBudget, ImageBounds
from workloads.bridgetower.data.loader import CaptionedImages
from workloads.bridgetower.data.pipelines import PIPELINES
from workloads.bridgetower.data.sources import ImageFolderSource

from conftest import runs_of
from test_hostile_inputs import _bomb_jpeg, _line, _prepend, dataset  # noqa: F401 - the fixture

MEASURE = Path(__file__).parent / "measure_decode_peak.py"
SLACK = 48 * 2**20  # allocator and measurement granularity on small images


@pytest.mark.mechanics
def test_each_pipelines_estimate_covers_its_measured_peak_without_refusing_what_fits():
    result = subprocess.run([sys.executable, str(MEASURE), "294"], capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).parent.parent)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert {row["pipeline"] for row in rows} == set(PIPELINES)
    for row in rows:
        what = f"{row['pipeline']} {row['format']} {row['width']}x{row['height']}: {row}"
        assert row["measured"] <= row["estimate"], what
        assert row["estimate"] <= 2 * row["measured"] + SLACK, what


def test_the_budget_is_shared_equally_and_refuses_with_the_figures_and_the_remedy():
    assert DecodeBudget.of(None, 0).share_bytes == DEFAULT_LOADER_MEMORY_BYTES
    assert DecodeBudget.of(None, 1).share_bytes == DEFAULT_LOADER_MEMORY_BYTES
    assert DecodeBudget.of(1.0, 4).share_bytes == 2**28
    DecodeBudget.of(1.0, 4).check(2**28, "a.jpg", "reference")  # exactly the share: fine
    with pytest.raises(DatasetError, match=r"image a.jpg: decoding and preprocessing it \(reference pipeline\) needs "
                                           r"about 257 MiB, over each of 4 loader workers' share of 256 MiB "
                                           r"\(--loader-memory 1 GiB in all; raise it or use fewer workers\)"):
        DecodeBudget.of(1.0, 4).check(2**28 + 2**20, "a.jpg", "reference")


@pytest.mark.parametrize("loader", ["cpu", "cpu-fast"])
def test_a_worker_refuses_an_image_over_its_share_before_decoding(tmp_path, monkeypatch, loader):
    (tmp_path / "big.jpg").write_bytes(_bomb_jpeg(9400))
    (tmp_path / "metadata.jsonl").write_bytes(_line("big.jpg") + b"\n")
    source = ImageFolderSource(tmp_path)
    ids = torch.zeros((1, 4), dtype=torch.long)
    bounds = ImageBounds.of(None, None, 64)
    dataset = CaptionedImages(source, ids, ids, loader, 64, bounds=bounds, budget=DecodeBudget.of(0.5, 2))
    monkeypatch.setattr(dataset.pipeline, "worker_stage", lambda data: pytest.fail("decoded before the check"))
    with pytest.raises(DatasetError, match=r"big.jpg: decoding and preprocessing it .* over each of 2 loader "
                                           r"workers' share of 256 MiB"):
        dataset[0]
    # the device loader's workers only read bytes: nothing to budget there
    CaptionedImages(source, ids, ids, "device", 64, bounds=bounds, budget=DecodeBudget.of(0.5, 2))[0]


@pytest.mark.e2e
def test_eight_tiny_jpegs_declaring_nine_thousand_pixels_a_side_fail_the_run_with_the_reason(tmp_path, dataset):
    """The issue's case: 632-byte JPEGs declaring 9400x9400 (just under Pillow's limit) took 1.7-2.6 GB in two
    workers. The reference pipeline needs ~3 GB for one: over each worker's 2 GiB share of the default 4 GiB."""
    for number in range(8):
        (dataset / f"huge{number}.jpg").write_bytes(_bomb_jpeg(9400))
    _prepend(dataset, *(_line(f"huge{number}.jpg") for number in range(8)))
    code = main(["run", "--dataset", str(dataset), "--loader", "cpu", "--workers", "2", "--steps", "2",
                 "--warmup-steps", "0", "--batch-size", "8", "--no-progress", "--system-metrics-interval", "0",
                 "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    assert code == 1
    [run] = runs_of(tmp_path / "out")
    assert run["status"] == "FAILED"
    assert "huge" in run["reason"] and "over each of 2 loader workers' share of 2,048 MiB" in run["reason"], \
        run["reason"]
    assert run["metrics"].get("host_ram_peak_rss_bytes", 0) < 1.5 * 2**30


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "2e6"])
def test_a_loader_memory_out_of_range_is_one_line_before_anything_runs(tmp_path, capsys, value):
    try:
        code = main(["run", "--loader-memory", value, "--dry-run", "--output", str(tmp_path / "out")])
    except SystemExit as exc:  # argparse's refusal
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "loader" in err.splitlines()[-1] and "Traceback" not in err, err  # argparse's usage, then one line


def test_under_an_address_space_limit_the_share_is_what_the_process_has_left():
    """With --memory-limit (RLIMIT_AS) a worker's share is no larger than the address space it has left: an image
    that would not fit is refused with the figures, not failed "out of memory" half-way through decoding."""
    code = ("import resource\n"
            "from suite.errors import DatasetError\n"
            "from workloads.bridgetower.data.bounds import DecodeBudget\n"
            "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.RLIM_INFINITY))\n"
            "budget = DecodeBudget.of(8.0, 1).in_this_process()\n"
            "assert 0 < budget.share_bytes < 3 * 2**30, budget\n"
            "try:\n"
            "    budget.check(3 * 2**30, 'big.jpg', 'reference')\n"
            "except DatasetError as exc:\n"
            "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr
    assert "big.jpg: decoding and preprocessing it (reference pipeline) needs about 3,072 MiB, over the" in done.stdout
    assert "MiB of address space this process has left under --memory-limit" in done.stdout
    import resource

    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        assert DecodeBudget.of(8.0, 1).in_this_process().address_space_left is None  # no limit here: the share
