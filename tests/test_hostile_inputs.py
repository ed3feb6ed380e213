"""Hostile datasets, paths and files (issue 12): every one a one-line error before anything runs, or a FAILED run
naming the file; every resource bounded (image pixels and bytes, time per configuration, time per batch).
The fuzz test drives a few hundred generated cases through the real code of every loader."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from suite.cli import main
from suite.errors import DatasetError
from suite.meters.host_ram import HostRamSampler
from workloads.bridgetower.data.bounds import ImageBounds
from workloads.bridgetower.data.loader import CaptionedImages, endless, make_loader
from workloads.bridgetower.data.sources import ImageFolderSource, read_regular_file
from workloads.bridgetower.data.synthetic import ensure_synthetic

from conftest import runs_of

pytestmark = pytest.mark.mechanics

FUZZ = Path(__file__).parent / "fuzz_inputs.py"
QUICK = ["--workers", "0", "--steps", "1", "--warmup-steps", "0", "--no-progress", "--system-metrics-interval", "0"]


@pytest.fixture
def dataset(tmp_path):
    """A 16-image synthetic imagefolder of the test's own, to spoil."""
    folder = tmp_path / "data"
    shutil.copytree(ensure_synthetic(samples=16, seed=5, root=tmp_path / "cache"), folder)
    return folder


def _prepend(folder, *lines):
    metadata = folder / "metadata.jsonl"
    metadata.write_bytes(b"".join(line + b"\n" for line in lines) + metadata.read_bytes())


def _line(file_name, caption="a cartoon"):
    return json.dumps({"file_name": file_name, "image_description": caption}).encode()


def _mkfifo(folder):
    os.mkfifo(folder / "pipe.jpg")
    return _line("pipe.jpg")


def _link_to_dev_zero(folder):
    (folder / "zero.jpg").symlink_to("/dev/zero")
    return _line("zero.jpg")


@pytest.mark.parametrize("spoil,message", [
    (lambda f: b'{"file_name": "00001.jpg", "image_description": "caf\xe9"}', "metadata.jsonl:1: not UTF-8 text"),
    (lambda f: _line(5), "metadata.jsonl:1: file_name must be a non-empty string, got 5"),
    (lambda f: b'["00001.jpg", "x"]', "metadata.jsonl:1: a JSON array, not an object with file_name"),
    (lambda f: _line("00001.jpg", None), "metadata.jsonl:1: image_description must be a string, got None"),
    (lambda f: _line("/etc/hostname"), "metadata.jsonl:1: file_name '/etc/hostname' is an absolute path"),
    (lambda f: _line("../outside/secret.jpg"), "file_name '../outside/secret.jpg' leaves the dataset folder"),
    (_mkfifo, "pipe.jpg is a FIFO, not a regular file"),
    (_link_to_dev_zero, "file_name 'zero.jpg' is a symbolic link leading outside the dataset folder (to /dev/zero)"),
    (lambda f: _line("missing.jpg"), "metadata.jsonl:1: no such image file"),
    (lambda f: b'{"file_name": "00001.jpg", "image_description": "x\\ud800"}',
     "metadata.jsonl:1: image_description holds '\\ud800' at character 1, a lone surrogate"),
    (lambda f: b'{"file_name": "0000\\udfff.jpg", "image_description": "x"}', "file_name holds '\\udfff'"),
    (lambda f: b'{"file_name": "00001.jpg", "image_description": "x", "n": ' + b"[" * 50_000 + b"]" * 50_000
     + b"}", "metadata.jsonl:1: JSON nested too deeply to read"),
    (lambda f: b'{"file_name": "00001.jpg", "image_description": "x", "n": ' + b"9" * 5000 + b"}",
     "metadata.jsonl:1: not a readable JSON line (a number of more digits than Python reads"),
    (lambda f: _line("00001.jpg", "x" * 100_000_000), "metadata.jsonl:1: the line is 100,000,0"),
    (lambda f: _line("00001.jpg", "x" * 70_000),
     "metadata.jsonl:1: image_description is 70,000 bytes, over the limit of 65,536 (--max-caption-bytes)"),
], ids=["not-utf8", "int-file-name", "json-list", "null-caption", "absolute", "dotdot", "fifo", "dev-zero", "missing",
        "surrogate-caption", "surrogate-name", "deep-json", "long-integer", "caption-100MB", "caption-70KB"])
def test_hostile_metadata_and_files_are_one_line_before_anything_runs(tmp_path, dataset, capsys, spoil, message):
    _prepend(dataset, spoil(dataset))
    started = time.monotonic()
    code = main(["run", "--dataset", str(dataset), *QUICK, "--output", str(tmp_path / "out"),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()  # refused before any configuration, nothing written
    assert time.monotonic() - started < 30  # a FIFO never blocks the check


@pytest.mark.mechanics
def test_a_byte_order_mark_is_accepted_and_one_file_spelled_twice_is_a_duplicate(tmp_path, dataset, capsys):
    """Issue 27, point 14: a UTF-8 BOM opening metadata.jsonl was refused (Python's utf-8-sig accepts it); ./a.jpg
    and a.jpg are the same file, and were not warned as a duplicate."""
    from workloads.bridgetower.data.sources import ImageFolderSource

    metadata = dataset / "metadata.jsonl"
    lines = metadata.read_bytes().splitlines()
    first = json.loads(lines[0])
    metadata.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n" + _line("./" + first["file_name"]) + b"\n")
    source = ImageFolderSource(dataset)
    assert len(source) == len(lines) + 1
    assert [w for w in source.warnings if f"file_name './{first['file_name']}' is listed again (first on line 1)"
            in w]


@pytest.mark.mechanics
@pytest.mark.parametrize("option, message", [
    (["--steps", "1234567890123456789012345678901"], "steps must be <= 1,000,000,000, got a 31-digit number"),
    (["--timeout", "1e400"], "timeout_s must be a number of seconds from 0 (no limit) to 1e+09, got inf"),
    (["--seed", "123456789012345678901234"], "seed must be <= 9,223,372,036,854,775,807"),
    (["--tracking-uri", "sqlite:///:memory:"], "is an in-memory database: every record would vanish"),
    (["--tracking-uri", "file:///tmp/store"], "not file: (MLflow's file store: use sqlite:///PATH/mlflow.db)"),
    (["--tracking-uri", "ftp://x"], "not ftp:"),
    (["--tracking-uri", "postgresql://u@no-such-host.invalid/db"], "host 'no-such-host.invalid' does not resolve"),
], ids=["steps-31-digits", "timeout-inf", "seed-24-digits", "memory-store", "file-store", "ftp", "dns"])
def test_out_of_range_values_and_unusable_stores_are_one_line_before_anything_runs(tmp_path, capsys, monkeypatch,
                                                                                   option, message):
    """Issue 27, points 10, 13, 15: a 31-digit --steps and --timeout 1e400 crashed the watchdog and disabled the time
    limit; a 24-digit seed failed every configuration; sqlite:///:memory: exited 0 and lost every record; file: and
    ftp: stores gave MLflow tracebacks; an unresolvable database host meant 107 s of retries, then a traceback."""
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    code = main(["run", *QUICK, *option])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert list(tmp_path.iterdir()) == [] and time.monotonic() - started < 30


@pytest.mark.mechanics
def test_a_long_caption_within_the_bound_given_is_read(tmp_path, dataset):
    """Issue 27, point 4: the caption bound is a run control (--max-caption-bytes), generous by default."""
    from workloads.bridgetower.data.sources import ImageFolderSource

    _prepend(dataset, _line(json.loads((dataset / "metadata.jsonl").read_text().splitlines()[0])["file_name"],
                            "y" * 70_000))
    with pytest.raises(DatasetError, match="over the limit of 65,536"):
        ImageFolderSource(dataset)
    assert len(ImageFolderSource(dataset, max_caption_bytes=100_000).captions()[0]) == 70_000


def test_an_output_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "taken").write_text("x")
    for output in (tmp_path / "taken", tmp_path / "taken" / "sub"):
        assert main(["run", *QUICK, "--output", str(output), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--output {output}" in err[0] and "file" in err[0], err


@pytest.mark.e2e
def test_outside_links_need_their_option_and_duplicates_are_a_warning(tmp_path, dataset, capsys):
    outside = tmp_path / "elsewhere.jpg"
    shutil.copy(dataset / "00001.jpg", outside)
    (dataset / "linked.jpg").symlink_to(outside)
    _prepend(dataset, _line("linked.jpg"), _line("00002.jpg"))  # 00002.jpg is listed again further down
    common = ["run", "--dataset", str(dataset), *QUICK, "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]
    assert main([*common, "--output", str(tmp_path / "refused")]) == 2
    assert "pass --allow-outside-links to follow it" in capsys.readouterr().err
    assert main([*common, "--allow-outside-links", "--output", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "suite: warning:" in err and "file_name '00002.jpg' is listed again (first on line 2)" in err
    [run] = runs_of(tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / run["facts"]["manifest"]).read_text())
    assert manifest["config"]["allow_outside_links"] is True and manifest["dataset"]["allow_outside_links"] is True
    assert run["facts"]["workload"]["image_bounds"] == {"max_image_pixels": 89_478_485, "max_image_bytes": 64 * 2**20,
                                                        "bounded_output_size": 64, "loader_memory_bytes": 4 * 2**30,
                                                        "loader_memory_share_bytes": 4 * 2**30}  # QUICK: 0 workers


def _bomb_jpeg(side=65000):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 10, 10)).save(buffer, "JPEG")
    data = bytearray(buffer.getvalue())
    at = data.index(b"\xff\xc0")
    data[at + 5:at + 9] = side.to_bytes(2, "big") + side.to_bytes(2, "big")
    return bytes(data)


@pytest.mark.e2e
def test_an_image_bomb_fails_every_loader_naming_the_file_with_bounded_memory(tmp_path, dataset):
    """A 0.6 KB JPEG declaring 65000 x 65000: the cpu-fast loader used to allocate 12.6 GiB before failing."""
    victim = dataset / "00003.jpg"
    victim.write_bytes(_bomb_jpeg())
    code = main(["run", "--dataset", str(dataset), "--loader", "cpu-fast,device", "--workers", "0", "--steps", "2",
                 "--warmup-steps", "0", "--batch-size", "16", "--no-progress", "--system-metrics-interval", "0",
                 "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    assert code == 1
    for run in runs_of(tmp_path / "out"):
        assert run["status"] == "FAILED"
        assert run["reason"] == (f"image {victim} is 65000x65000 = 4,225,000,000 pixels, over the limit of "
                                 "89,478,485 (--max-image-pixels)"), run["reason"]
        assert run["metrics"]["host_ram_peak_rss_bytes"] < 1.5 * 2**30
    assert main(["run", "--dataset", str(dataset), "--loader", "cpu-fast", *QUICK, "--skip-bad-samples",
                 "--output", str(tmp_path / "skip"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 0
    [run] = runs_of(tmp_path / "skip")  # the scan applies the same bound, and leaves the bomb out
    assert run["metrics"]["skipped_samples"] == 1


def test_byte_and_pixel_bounds_name_the_file_and_its_size(tmp_path):
    image = tmp_path / "big.jpg"
    image.write_bytes(_bomb_jpeg(3000))
    with pytest.raises(DatasetError, match=r"big.jpg is 3000x3000 = 9,000,000 pixels, over the limit of 1,000,000"):
        ImageBounds(max_pixels=1_000_000, max_bytes=10**6).check(image.read_bytes(), str(image))
    with pytest.raises(DatasetError, match=r"big.jpg is \d+ bytes, over the limit of 100 \(--max-image-bytes\)"):
        read_regular_file(image, 100)
    ImageBounds(max_pixels=9_000_000, max_bytes=10**6).check(image.read_bytes(), str(image))  # at the limit: fine


def test_a_file_swapped_for_a_fifo_after_the_check_cannot_hang_a_read(tmp_path):
    os.mkfifo(tmp_path / "pipe.jpg")
    started = time.monotonic()
    with pytest.raises(DatasetError, match="pipe.jpg is a FIFO, not a regular file"):
        read_regular_file(tmp_path / "pipe.jpg", 10**6)
    assert time.monotonic() - started < 5


class _StuckSource(ImageFolderSource):
    """Reading sample 5 never finishes (a hung network mount, say)."""

    def read_bytes(self, index):
        if index == 5:
            time.sleep(3600)
        return super().read_bytes(index)


def test_a_stuck_loader_worker_fails_the_run_naming_the_sample(dataset):
    source = _StuckSource(dataset)
    ids = torch.zeros((len(source), 4), dtype=torch.long)
    items = CaptionedImages(source, ids, ids, "device", 32)
    loader = make_loader(items, batch_size=16, num_workers=1, seed=0, loader_timeout_s=2)
    started = time.monotonic()
    with pytest.raises(DatasetError) as failure:
        next(endless(loader))
    assert time.monotonic() - started < 30
    assert str(failure.value) == (f"no batch from the loader workers for 2 s (--loader-timeout): worker 0 was reading "
                                  f"{source.name_of(5)}")
    loader._iterator._shutdown_workers()


def _leftovers(marker):
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc.pid)
        except psutil.Error:
            pass
    return found


@pytest.mark.e2e
def test_a_configuration_over_its_time_limit_is_killed_with_its_workers_and_the_matrix_goes_on(tmp_path, test_plugins):
    out = tmp_path / "out"
    started = time.monotonic()
    code = main(["run", "--workload", "hanging", "--workers", "2,0", "--steps", "1", "--timeout", "8",
                 "--no-progress", "--system-metrics-interval", "0", "--output", str(out),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    assert code == 1 and time.monotonic() - started < 120
    runs = runs_of(out)
    assert [r["config"]["num_workers"] for r in runs] == [2, 0]  # the matrix went on after the first
    for run in runs:
        assert run["status"] == "FAILED"
        assert run["reason"] == "timed out after 8 s (--timeout); the configuration and its loader workers were killed"
        assert run["facts"]["timeout_s"] == 8
    time.sleep(1)
    assert _leftovers(str(out)) == []  # no configuration process or loader worker survives


def test_fuzzed_datasets_and_images_never_crash_hang_or_exhaust_memory(tmp_path):
    """A few hundred seeded cases through every loader's code path (see tests/fuzz_inputs.py): each is a one-line
    SuiteError naming the file or line, or works; never a traceback, never a hang, RSS bounded (a bomb that got
    through would ask for gigabytes)."""
    proc = subprocess.Popen([sys.executable, str(FUZZ), "20261203", "300", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    sampler = HostRamSampler(proc.pid, interval_s=0.02).start()
    timer = threading.Timer(240, proc.kill)
    timer.start()
    try:
        out, err = proc.communicate()
    finally:
        timer.cancel()
        ram = sampler.stop()
    assert proc.returncode == 0, err[-3000:]
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 300
    problems = [r for r in rows if r["outcome"] in ("crash", "hang")
                or (r["expect"] != "either" and r["outcome"] != r["expect"])]
    assert problems == [], problems[:3]
    for row in rows:
        if row["outcome"] == "error":
            assert "\n" not in row["message"] and row["folder"] in row["message"], row
    kinds = {r["case"].split("-")[0] for r in rows}
    assert {"metadata", "file", "bomb", "empty", "random"} <= kinds  # every family was generated
    assert sum(r["outcome"] == "ok" for r in rows) > 30 and sum(r["outcome"] == "error" for r in rows) > 100
    assert ram.peak_rss_bytes < 1.5 * 2**30, f"fuzz driver peaked at {ram.peak_rss_bytes / 2**20:.0f} MiB"


@pytest.mark.e2e
@pytest.mark.mechanics
def test_upload_never_follows_a_symbolic_link_out_of_the_results_folder(tmp_path, capsys):
    """Issue 27, point 1: a link runs/<id>/run.log -> any local file copied that file into the MLflow artifact store,
    readable by everyone on the server."""
    from conftest import run_file, runs_of

    out = tmp_path / "out"
    assert main(["run", *QUICK, "--output", str(out), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 0
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-TOKEN-5c1f")
    [run] = runs_of(out)
    log = run_file(out, run, "run.log")
    log.unlink()
    log.symlink_to(secret)
    capsys.readouterr()
    code = main(["upload", str(out), "--tracking-uri", f"sqlite:///{tmp_path}/shared.db"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if " INFO mlflow" not in line]  # a new store
    assert code == 2 and len(err) == 1 and f"{log} is a symbolic link (to {secret}): not uploaded" in err[0], err
    copies = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink() and p != secret
              and b"TOP-SECRET-TOKEN-5c1f" in p.read_bytes()]
    assert copies == []


HOSTILE_NAME = "\x1b]0;pwned\x07\x1b[2J\u202eevil.jpg"  # retitle the window, clear the screen, reverse the text


@pytest.mark.e2e
@pytest.mark.mechanics
def test_escape_sequences_in_file_names_never_reach_the_terminal_or_the_log_raw(tmp_path, dataset, capsys):
    """Issue 27, point 3: ANSI/OSC sequences in a file name reached the terminal raw in the start-up error, the
    FAILED line and the results table. Every sink shows them as escapes (suite.text.visible)."""
    from conftest import run_file, runs_of

    _prepend(dataset, _line("missing" + HOSTILE_NAME))
    assert main(["run", "--dataset", str(dataset), *QUICK, "--output", str(tmp_path / "a"),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2
    captured = capsys.readouterr()
    assert "\x1b" not in captured.err + captured.out and "\u202e" not in captured.err
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\u202eevil.jpg" in captured.err

    metadata = dataset / "metadata.jsonl"
    metadata.write_bytes(b"\n".join(metadata.read_bytes().splitlines()[1:]) + b"\n")  # the missing file out again
    (dataset / HOSTILE_NAME).write_bytes(b"\xff\xd8\xff\xe0 not a JPEG at all")
    rows = [json.loads(line) for line in metadata.read_text().splitlines()]
    metadata.write_text("".join(json.dumps({**row, "file_name": HOSTILE_NAME}) + "\n" if i == 0 else
                                json.dumps(row) + "\n" for i, row in enumerate(rows)))
    code = main(["run", "--dataset", str(dataset), "--workers", "0", "--steps", "3", "--warmup-steps", "0",
                 "--no-progress", "--system-metrics-interval", "0", "--output", str(tmp_path / "b"),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    captured = capsys.readouterr()
    [run] = runs_of(tmp_path / "b")
    assert code == 1 and run["status"] == "FAILED" and HOSTILE_NAME in run["reason"]  # the record keeps the data
    shown = captured.err + captured.out
    assert "\x1b" not in shown and "\u202e" not in shown
    assert shown.count("\\x1b") >= 3  # the FAILED line (twice) and the results table (its cell folds the name)
    log = run_file(tmp_path / "b", run, "run.log").read_bytes()
    assert b"\x1b" not in log and "\\x1b]0;pwned".encode() in log


@pytest.mark.e2e
@pytest.mark.mechanics
@pytest.mark.parametrize("command", ["report", "compare", "audit"])
def test_a_record_file_that_is_a_fifo_or_dev_zero_is_one_line_at_once(tmp_path, capsys, command):
    """Issue 27, point 8: results.json replaced by /dev/zero or a FIFO made `suite report` / `compare` read without
    bound or hang. Every record file is read as a regular file with a size cap (suite.fileio, the helper the dataset
    reader uses too)."""
    out = tmp_path / "out"
    assert main(["run", *QUICK, "--output", str(out), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 0
    for kind, make in (("FIFO", os.mkfifo), ("character device", lambda p: p.symlink_to("/dev/zero"))):
        spoiled = tmp_path / kind.replace(" ", "-")
        shutil.copytree(out, spoiled)
        (spoiled / "results.json").unlink()
        make(spoiled / "results.json")
        capsys.readouterr()
        started = time.monotonic()
        extra = ["--no-rerun", "--output", str(tmp_path / f"audit-{kind[0]}")] if command == "audit" else []
        code = main([command, str(spoiled), "--tracking-uri", f"sqlite:///{tmp_path}/m.db", *extra])
        err = [line for line in capsys.readouterr().err.strip().splitlines() if " INFO mlflow" not in line]
        assert code == 2 and len(err) == 1 and f"is a {kind}, not a regular file" in err[0], err
        assert time.monotonic() - started < 20


@pytest.mark.mechanics
def test_repeated_warnings_are_summarized_and_records_hold_no_per_sample_lists(tmp_path, dataset):
    """Issue 27, point 5: 10^6 metadata lines gave 10^6 warning lines and a 132 MB matrix.json. Repeated warnings
    are the first few and a count; descriptions list a bounded number of skipped samples and count the rest."""
    from workloads.bridgetower.data.sources import LISTED_WARNINGS
    from workloads.bridgetower.data.validation import LISTED, Scan, UsableSamples

    metadata = dataset / "metadata.jsonl"
    first = json.loads(metadata.read_text().splitlines()[0])["file_name"]
    with open(metadata, "ab") as fh:
        fh.write(b"".join(_line(first) + b"\n" for _ in range(300)))
    source = ImageFolderSource(dataset)
    assert len(source.warnings) == LISTED_WARNINGS + 1
    assert source.warnings[-1].endswith(f"and {300 - LISTED_WARNINGS:,} more lines list a file name again (300 in "
                                        "all); their samples are used too")
    bad = tuple((source.name_of(i), "unreadable") for i in range(LISTED + 7))
    usable = UsableSamples(source, Scan(tuple(range(LISTED + 7, len(source))), bad))
    described = usable.describe()
    assert len(described["skipped"]) == LISTED and described["skipped_not_listed"] == 7
    assert described["skipped_samples"] == LISTED + 7
    fingerprint = usable.fingerprint()
    assert fingerprint["skipped"] == LISTED + 7 and len(fingerprint["skipped_sha256"]) == 64
    assert len(json.dumps(described)) < 20_000


@pytest.mark.e2e
@pytest.mark.mechanics
def test_a_dataset_file_replaced_mid_matrix_is_flagged_at_the_end(tmp_path, dataset):
    """Issue 27, point 12: the second configuration reads a replaced image; the matrix says so at its end (stderr and
    matrix.json), and the two runs' fingerprints differ."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "suite", "run", "--dataset", str(dataset), "--workers", "0,1",
                             "--steps", "2", "--warmup-steps", "0", "--no-progress", "--no-start-ahead",
                             "--system-metrics-interval", "0", "--output", str(out),
                             "--tracking-uri", f"sqlite:///{tmp_path}/m.db"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not ((out / "results.json").is_file() and len(json.loads((out / "results.json").read_text())["runs"])):
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.05)
    victim = sorted(dataset.glob("*.jpg"))[0]
    victim.write_bytes(_encode_other(victim.read_bytes()))
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "suite: warning: the dataset changed during the matrix: 1 run(s) read dataset" in err
    changes = json.loads((out / "matrix.json").read_text())["dataset_changes"]
    assert len(changes) == 2 and sorted(len(v) for v in changes.values()) == [1, 1]


def _encode_other(jpeg: bytes) -> bytes:
    """The same picture, re-encoded at another quality: other bytes, still a valid JPEG."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.open(io.BytesIO(jpeg)).save(out, "JPEG", quality=55)
    return out.getvalue()


def _grey_png(width: int, height: int) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


@pytest.mark.e2e
@pytest.mark.mechanics
def test_what_resizing_makes_of_an_image_is_bounded_before_it_is_allocated_for_every_loader(tmp_path, dataset):
    """Issue 27, point 6: a 128-byte 50000x1 PNG is 50,000 pixels decoded but 50000*64 x 64 once its shorter side
    is resized to the tiny preset's 64 (52 GB at the small preset's 294). Every loader refuses it from the header,
    naming the stage and the size."""
    from conftest import runs_of

    png = _grey_png(50000, 1)
    assert len(png) < 300
    (dataset / "wide.png").write_bytes(png)
    _prepend(dataset, _line("wide.png"))
    code = main(["run", "--dataset", str(dataset), "--loader", "cpu,cpu-fast,device,dali", "--workers", "0",
                 "--steps", "3", "--warmup-steps", "0", "--no-progress", "--system-metrics-interval", "0",
                 "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    runs = runs_of(tmp_path / "out")
    assert code == 1 and [r["status"] for r in runs] == ["FAILED"] * 4
    for run in runs:
        assert ("wide.png: resized to a shorter side of 64 is 3200000x64 = 204,800,000 pixels, over the limit of "
                "89,478,485 (--max-image-pixels)") in run["reason"], run["reason"]
        assert run["metrics"].get("host_ram_peak_rss_bytes", 0) < 1.5 * 2**30


@pytest.mark.mechanics
def test_tokenizing_many_captions_keeps_memory_to_the_tensors(monkeypatch):
    """Issue 27, point 5: one tokenizer call over every caption held a rich Encoding per caption while it lasted
    (100,000 captions: +800 MB; 10^6 metadata lines ended at 8.7 GiB). In chunks, the result is identical."""
    import torch

    from workloads.bridgetower import tokenizer as tokenization
    from workloads.bridgetower.presets import PRESETS

    preset = PRESETS["tiny"]
    tok, _ = tokenization.resolve_tokenizer(preset.tokenizer, preset.vocab_size, None, "auto")
    captions = [f"a cartoon of a cat number {i}" for i in range(300)] + ["x" * 3000, "", "un dessin animé — 漫画"]
    whole = tok(captions, max_length=preset.max_seq_length, padding="max_length", truncation=True,
                return_tensors="pt")
    monkeypatch.setattr(tokenization, "TOKENIZE_CHUNK", 7)
    calls = []
    real_call = type(tok).__call__
    monkeypatch.setattr(type(tok), "__call__", lambda self, texts, **kw: calls.append(len(texts)) or real_call(
        self, texts, **kw))
    chunked, cached = tokenization.tokenize_captions(tok, captions, preset.max_seq_length, "a-key-of-this-test")
    assert not cached and max(calls) == 7 and sum(calls) == len(captions)
    assert torch.equal(chunked["input_ids"], whole["input_ids"])
    assert torch.equal(chunked["attention_mask"], whole["attention_mask"])


#: What a FAILED configuration's reason says when a bound refused its input (never "out of memory", never a signal).
_REFUSALS = ("(--max-image-pixels)", "(--max-image-bytes)", "--loader-memory", "left under --memory-limit",
             "cannot decode image")


@pytest.mark.e2e
@pytest.mark.parametrize("case", ["bomb", "nine-thousand-a-side", "wide", "caption"])
def test_under_a_memory_limit_of_4_gib_every_hostile_input_is_refused_never_dies_of_memory(tmp_path, dataset, case):
    """Issue 27's acceptance: `suite run --memory-limit 4` on each input class of the corpus (an image bomb, eight
    tiny JPEGs declaring 9400x9400, a 50000x1 PNG, a 100 MB caption), through the loaders that decode on the host and
    on the device, without and with loader workers: a one-line refusal before anything runs, or every configuration
    FAILED by a bound that names itself, or FINISHED within the limit (the decoders fill a truncated JPEG's missing
    rows: the eight 9400x9400 ones decode, at up to ~2 GB, where the budget and the address space left allow it);
    no "out of memory", no worker killed."""
    if case == "bomb":
        (dataset / "00003.jpg").write_bytes(_bomb_jpeg())
    elif case == "nine-thousand-a-side":
        for number in range(8):
            (dataset / f"huge{number}.jpg").write_bytes(_bomb_jpeg(9400))
        _prepend(dataset, *(_line(f"huge{number}.jpg") for number in range(8)))
    elif case == "wide":
        (dataset / "wide.png").write_bytes(_grey_png(50000, 1))
        _prepend(dataset, _line("wide.png"))
    else:
        _prepend(dataset, _line("00001.jpg", "x" * 100_000_000))
    code = main(["run", "--dataset", str(dataset), "--loader", "cpu,cpu-fast,device", "--workers", "0,1",
                 "--steps", "2", "--warmup-steps", "0", "--batch-size", "8", "--memory-limit", "4", "--no-progress",
                 "--system-metrics-interval", "0", "--output", str(tmp_path / "out"),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    if case == "caption":
        assert code == 2 and not (tmp_path / "out").exists()
        return
    runs = runs_of(tmp_path / "out")
    assert code in (0, 1) and len(runs) == 6
    for run in runs:
        assert run["status"] in ("FAILED", "FINISHED"), run
        if run["status"] == "FAILED":
            assert any(refusal in run["reason"] for refusal in _REFUSALS), run["reason"]


@pytest.mark.e2e
@pytest.mark.mechanics
def test_a_dataset_folder_whose_path_is_not_utf8_runs(tmp_path, dataset, capsys):
    """Issue 46 (7): a dataset in a folder named with a byte that is not UTF-8 (a valid Linux path) ended in a
    UnicodeEncodeError traceback. It runs, and the records show the byte escaped."""
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9-data"))
    shutil.move(str(dataset), odd)
    code = main(["run", "--dataset", str(odd), *QUICK, "--report", "--output", str(tmp_path / "out"),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in out + err
    assert runs_of(tmp_path / "out")[0]["status"] == "FINISHED"
    assert "caf\\udce9-data" in (tmp_path / "out" / "report.md").read_text(encoding="utf-8")


@pytest.mark.mechanics
@pytest.mark.parametrize("variable", ["SUITE_CACHE_DIR", "HOME"])
def test_a_cache_that_cannot_be_written_is_one_line_before_anything_runs(tmp_path, monkeypatch, capsys, variable):
    """Issue 46 (7): a read-only HOME or cache folder ended in a PermissionError traceback from the synthetic data's
    generation. (/proc takes no new folder, even for root, who ignores file modes.)"""
    monkeypatch.delenv("SUITE_CACHE_DIR", raising=False)
    monkeypatch.setenv(variable, "/proc/suite-test-cache")
    code = main(["run", *QUICK, "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "cannot be written" in err and "SUITE_CACHE_DIR" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.mechanics
def test_counts_and_amounts_past_any_real_run_are_refused(capsys):
    """Issue 46 (10): --repeats 1e9 and --loader-memory 1e-300 were accepted."""
    with pytest.raises(SystemExit) as refused:  # argparse's own refusal: the usage line and the error
        main(["run", "--repeats", "1000000000", "--dry-run"])
    assert refused.value.code == 2 and "--repeats: must be <= 1000" in capsys.readouterr().err
    assert main(["run", "--loader-memory", "1e-300", "--dry-run"]) == 2
    assert "loader_memory_gib must be a number of GiB from 1/1024 (1 MiB)" in capsys.readouterr().err


@pytest.mark.mechanics
def test_the_default_evaluation_of_a_large_folder_is_bounded_and_said():
    """Issue 46 (10): a 100,000-image folder with --steps 2 spent over 15 minutes evaluating 10,000 held-out pairs.
    By default an evaluation scores the first DEFAULT_EVAL_LIMIT held-out pairs, and the split's description says so;
    --eval-samples N chooses."""
    from workloads.bridgetower.data.catalog import DEFAULT_BOUND_NOTE, DEFAULT_EVAL_LIMIT, held_out_split
    from workloads.bridgetower.data.sources import ImageCaptionSource

    class Names(ImageCaptionSource):
        def __len__(self):
            return 100_000

        def captions(self):
            return ["x"] * len(self)

        def read_bytes(self, index):
            raise AssertionError("the split reads no image here")

        def name_of(self, index):
            return f"{index:06d}.jpg"

        def content_key(self, index):
            return self.name_of(index)

        def describe(self):
            return {}

        def fingerprint(self):
            return {}

    train, evaluated, described = held_out_split(Names(), batch_size=8)
    assert len(evaluated) == DEFAULT_EVAL_LIMIT and len(train) == 90_000 and DEFAULT_BOUND_NOTE in described
    _, evaluated, described = held_out_split(Names(), batch_size=8, limit=5000)
    assert len(evaluated) == 5000 and DEFAULT_BOUND_NOTE not in described
