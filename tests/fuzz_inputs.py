"""Fuzz driver for hostile dataset inputs, run by ``tests/test_hostile_inputs.py`` in a subprocess.

``python tests/fuzz_inputs.py SEED COUNT WORKDIR`` generates COUNT seeded cases (malformed metadata lines, odd
files, malformed / truncated / bomb / odd-mode images) and runs each through the real code every loader uses:
opening the dataset (metadata and file checks, up front), the bounds check and the worker pipelines of loaders
``cpu`` and ``cpu-fast``, the device path of loader ``device`` (the CPU adapter's decoder), and the
``--skip-bad-samples`` scan. It prints one JSON line per case::

    {"case": ..., "expect": "error" | "ok" | "either", "outcome": "ok" | "error" | "crash" | "hang", "message": ...}

``error`` is a :class:`suite.errors.SuiteError` (what the CLI turns into one line, or a FAILED run's reason);
anything else raised is a ``crash``. A case still running after 20 s is a ``hang``.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import struct
import sys
import traceback
import zlib
from pathlib import Path

import torch
from PIL import Image

from suite.devices.cpu import CPUAdapter
from suite.errors import SuiteError

from workloads.bridgetower.data.bounds import ImageBounds
from workloads.bridgetower.data.catalog import open_source
from workloads.bridgetower.data.loader import CaptionedImages
from workloads.bridgetower.data.validation import scan
from workloads.bridgetower.device_decoding import decode_on_device

CASE_SECONDS = 20
SIZE = 32  # output side of the pipelines here: small, the decoders still see the whole image
BOUNDS = ImageBounds(max_pixels=4_000_000, max_bytes=2_000_000)


class Hang(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise Hang()


# --- images -------------------------------------------------------------------------------------------------
def _encode(image: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def valid_image(rng: random.Random) -> tuple[str, bytes]:
    width, height = rng.choice([(1, 1), (1, 300), (300, 1), (17, 23), (640, 480), (64, 64)])
    colour = tuple(rng.randrange(256) for _ in range(4))
    kind = rng.choice(["jpeg-rgb", "jpeg-gray", "jpeg-cmyk", "png-rgba", "png-p-alpha", "png-16bit", "png-1bit",
                       "gif", "bmp", "tiff", "webp", "png-la"])
    base = Image.new("RGB", (width, height), colour[:3])
    if kind == "jpeg-rgb":
        return kind, _encode(base, "JPEG", quality=rng.randint(5, 95))
    if kind == "jpeg-gray":
        return kind, _encode(base.convert("L"), "JPEG")
    if kind == "jpeg-cmyk":
        return kind, _encode(base.convert("CMYK"), "JPEG")
    if kind == "png-rgba":
        return kind, _encode(Image.new("RGBA", (width, height), colour), "PNG")
    if kind == "png-p-alpha":
        return kind, _encode(base.convert("P"), "PNG", transparency=0)
    if kind == "png-16bit":
        return kind, _encode(Image.new("I;16", (width, height), 1234), "PNG")
    if kind == "png-1bit":
        return kind, _encode(base.convert("1"), "PNG")
    if kind == "png-la":
        return kind, _encode(Image.new("LA", (width, height), colour[:2]), "PNG")
    if kind == "gif":
        return kind, _encode(base.convert("P"), "GIF")
    if kind == "bmp":
        return kind, _encode(base, "BMP")
    if kind == "tiff":
        return kind, _encode(base, "TIFF")
    return kind, _encode(base, "WEBP")


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def bomb_image(rng: random.Random) -> tuple[str, bytes]:
    """A tiny file whose header declares a huge image (decoders would allocate it before failing)."""
    side = rng.choice([3000, 20000, 65000])
    kind = rng.choice(["jpeg", "png", "gif", "bmp"])
    if kind == "jpeg":
        data = bytearray(_encode(Image.new("RGB", (16, 16), (200, 10, 10)), "JPEG"))
        at = data.index(b"\xff\xc0")
        data[at + 5:at + 9] = struct.pack(">HH", side, side)
        return f"bomb-jpeg-{side}", bytes(data)
    if kind == "png":
        header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
        body = zlib.compress(b"\0" * 64)
        return f"bomb-png-{side}", (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", body)
                                    + _png_chunk(b"IEND", b""))
    if kind == "gif":
        data = bytearray(_encode(Image.new("P", (4, 4)), "GIF"))
        data[6:10] = struct.pack("<HH", side, side)  # logical screen
        at = data.index(b"\x2c")  # image descriptor
        data[at + 5:at + 9] = struct.pack("<HH", side, side)
        return f"bomb-gif-{side}", bytes(data)
    data = bytearray(_encode(Image.new("RGB", (4, 4)), "BMP"))
    data[18:26] = struct.pack("<ii", side, side)
    return f"bomb-bmp-{side}", bytes(data)


def broken_image(rng: random.Random) -> tuple[str, bytes]:
    kind, data = valid_image(rng)
    how = rng.choice(["truncate", "flip", "random", "empty", "garbage-head", "garbage-tail", "header-only"])
    if how == "truncate":
        return f"{kind}-truncated", data[:rng.randrange(1, max(2, len(data)))]
    if how == "flip":
        mutable = bytearray(data)
        for _ in range(rng.randint(1, 20)):
            mutable[rng.randrange(len(mutable))] = rng.randrange(256)
        return f"{kind}-flipped", bytes(mutable)
    if how == "random":
        return "random-bytes", bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096)))
    if how == "empty":
        return "empty", b""
    if how == "garbage-head":
        return f"{kind}-garbage-head", os.urandom(rng.randint(1, 64)) + data
    if how == "garbage-tail":
        return f"{kind}-garbage-tail", data + os.urandom(rng.randint(1, 4096))
    return f"{kind}-header-only", data[:min(len(data), 32)]


# --- datasets -----------------------------------------------------------------------------------------------
def _folder(workdir: Path, name: str, images: dict[str, bytes], lines: list[bytes]) -> Path:
    folder = workdir / name
    folder.mkdir()
    for file_name, data in images.items():
        (folder / file_name).write_bytes(data)
    (folder / "metadata.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return folder


def _line(file_name: object, caption: object = "a cartoon") -> bytes:
    return json.dumps({"file_name": file_name, "image_description": caption}).encode()


GOOD = _encode(Image.new("RGB", (48, 40), (250, 250, 240)), "JPEG")


def metadata_case(rng: random.Random, workdir: Path, name: str) -> tuple[str, str, Path]:
    """A folder whose metadata has one hostile line among good ones: (what, expectation, folder)."""
    options = [
        ("not-json", "error", b'{"file_name": "ok.jpg", '),
        ("not-utf8", "error", b'{"file_name": "ok.jpg", "image_description": "caf\xe9"}'),
        ("json-list", "error", b'["ok.jpg", "x"]'),
        ("json-string", "error", b'"ok.jpg"'),
        ("json-number", "error", b"42"),
        ("json-null", "error", b"null"),
        ("file-name-int", "error", _line(rng.randint(-5, 5))),
        ("file-name-null", "error", _line(None)),
        ("file-name-list", "error", _line(["ok.jpg"])),
        ("file-name-empty", "error", _line(rng.choice(["", "   "]))),
        ("file-name-nul", "error", _line("ok\0.jpg")),
        ("absolute", "error", _line(rng.choice(["/etc/hostname", "/dev/zero", "/proc/self/environ"]))),
        ("dotdot", "error", _line(rng.choice(["../x.jpg", "a/../../x.jpg", "./../ok.jpg"]))),
        ("missing-file", "error", _line("nope.jpg")),
        ("caption-null", "error", _line("ok.jpg", None)),
        ("caption-number", "error", _line("ok.jpg", 3.5)),
        ("caption-object", "error", _line("ok.jpg", {"a": 1})),
        ("no-caption", "error", json.dumps({"file_name": "ok.jpg"}).encode()),
        ("huge-name", "error", _line("x" * rng.randint(300, 5000) + ".jpg")),
        ("extra-columns", "ok", json.dumps({"file_name": "ok.jpg", "image_description": "x", "more": [1]}).encode()),
        ("unicode-caption", "ok", _line("ok.jpg", "un dessin animé — 漫画 🎨")),
        ("blank-line", "ok", b"   "),
        ("duplicate", "ok", _line("ok.jpg")),
        ("duplicate-dot-slash", "ok", _line("./ok.jpg")),
        ("lone-surrogate-name", "error", b'{"file_name": "ok\\ud800.jpg", "image_description": "x"}'),
        ("lone-surrogate-caption", "error", b'{"file_name": "ok.jpg", "image_description": "x\\udfff"}'),
        ("deep-nesting", "error", b'{"file_name": "ok.jpg", "image_description": "x", "n": '
         + b"[" * 200_000 + b"]" * 200_000 + b"}"),
        ("long-integer", "error", b'{"file_name": "ok.jpg", "image_description": "x", "n": '
         + b"7" * rng.randint(5000, 20000) + b"}"),
        ("bom-first-line", "ok", b"\xef\xbb\xbf" + _line("ok.jpg")),
    ]
    what, expect, bad = rng.choice(options)
    lines = [_line("ok.jpg") for _ in range(rng.randint(1, 4))]
    lines.insert(0 if what == "bom-first-line" else rng.randrange(len(lines) + 1), bad)
    return f"metadata-{what}", expect, _folder(workdir, name, {"ok.jpg": GOOD}, lines)


def file_case(rng: random.Random, workdir: Path, name: str) -> tuple[str, str, Path]:
    """A folder whose one image is not a regular file inside it."""
    folder = _folder(workdir, name, {"ok.jpg": GOOD}, [_line("ok.jpg"), _line("odd.jpg")])
    what = rng.choice(["fifo", "folder", "link-to-dev-zero", "link-outside", "dangling-link", "socket-like"])
    odd = folder / "odd.jpg"
    if what == "fifo":
        os.mkfifo(odd)
    elif what == "folder":
        odd.mkdir()
    elif what == "link-to-dev-zero":
        odd.symlink_to("/dev/zero")
    elif what == "link-outside":
        outside = workdir / f"{name}-outside.jpg"
        outside.write_bytes(GOOD)
        odd.symlink_to(outside)
    elif what == "dangling-link":
        odd.symlink_to(folder / "nowhere.jpg")
    else:
        odd.symlink_to("/dev/null")
    return f"file-{what}", "error", folder


# --- running a case -----------------------------------------------------------------------------------------
def run_image_case(folder: Path) -> None:
    """The image through every loader's code path; raises what they raise."""
    source = open_source(str(folder), bounds=BOUNDS)
    ids = torch.zeros((len(source), 4), dtype=torch.long)
    for loader in ("cpu", "cpu-fast"):
        CaptionedImages(source, ids, ids, loader, SIZE, bounds=BOUNDS)._item(0)
    item = CaptionedImages(source, ids, ids, "device", SIZE, bounds=BOUNDS)._item(0)
    adapter = CPUAdapter()
    adapter.setup()
    decode_on_device(adapter, [item["encoded_images"]], [item["image_names"]], SIZE, "device")
    result = scan(open_source(str(folder), bounds=BOUNDS, skip_bad_samples=False), BOUNDS)
    if result.bad:
        raise AssertionError(f"the scan found {result.bad} where every loader succeeded")


def main() -> int:
    seed, count, workdir = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    os.environ["SUITE_CACHE_DIR"] = str(workdir / "cache")
    rng = random.Random(seed)
    signal.signal(signal.SIGALRM, _alarm)
    for number in range(count):
        name = f"case{number:04d}"
        roll = rng.random()
        if roll < 0.3:
            what, expect, folder = metadata_case(rng, workdir, name)
            action = lambda: open_source(str(folder), bounds=BOUNDS)  # noqa: E731
        elif roll < 0.4:
            what, expect, folder = file_case(rng, workdir, name)
            action = lambda: open_source(str(folder), bounds=BOUNDS)  # noqa: E731
        else:
            maker = rng.choices([valid_image, bomb_image, broken_image], weights=[3, 2, 5])[0]
            what, data = maker(rng)
            expect = {valid_image: "ok", bomb_image: "error", broken_image: "either"}[maker]
            if what == "empty":
                expect = "error"
            folder = _folder(workdir, name, {"image.bin": data}, [_line("image.bin")])
            action = lambda: run_image_case(folder)  # noqa: E731
        record = {"case": what, "folder": str(folder), "expect": expect}
        signal.alarm(CASE_SECONDS)
        try:
            action()
            record["outcome"] = "ok"
        except Hang:
            record["outcome"] = "hang"
        except SuiteError as exc:
            record.update(outcome="error", message=str(exc))
        except Exception:  # noqa: BLE001 - a crash: reported with its traceback
            record.update(outcome="crash", message=traceback.format_exc())
        finally:
            signal.alarm(0)
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
