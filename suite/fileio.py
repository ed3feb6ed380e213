"""Atomic file writes: a reader never sees a half-written file, an interrupt cannot cut one short, and nothing is
ever written through an existing link (each file is made new beside its target and renamed over it: a
``report.html`` that links to ``/etc/passwd`` is replaced by the report, the file it pointed to is left alone)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

_DEFERRED = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold back Ctrl-C and SIGTERM (delivered when the block ends) in the main thread, so that a record
    being written is either written or not, never lost in between; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _umask() -> int:
    """This process's file-mode creation mask, read without changing it (Linux: /proc/self/status)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: read by setting it, put back at once
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a new temporary file in the same folder, fsync'ed, then renamed over
    ``path`` (a link there is replaced, never followed). The file's mode follows the umask, as ``open`` would
    give it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with signals_deferred():
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fchmod(fh.fileno(), 0o666 & ~_umask())
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """:func:`write_bytes_atomic` of ``text`` in UTF-8 (a lone surrogate, the undecodable byte of a path that is not
    UTF-8, written as its escape ``\\udcff``, as :func:`suite.text.utf8_text` writes it)."""
    write_bytes_atomic(path, text.encode("utf-8", "backslashreplace"))


def finite_json(data: Any) -> Any:
    """``data`` with every float that JSON cannot hold (NaN, ±Infinity: Python writes them, no JSON reader takes
    them) as ``null``."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: finite_json(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite_json(value) for value in data]
    return data


def dumps_json(data: Any, indent: int | None = None) -> str:
    """``data`` as valid JSON for a reader (``--json`` output): a non-finite number is ``null``."""
    return json.dumps(finite_json(data), indent=indent, allow_nan=False, default=str)


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def cache_root() -> Path:
    """The suite's cache: ``$SUITE_CACHE_DIR``, else ``~/.cache/suite`` (what is kept there is rebuilt when absent)."""
    return Path(os.environ.get("SUITE_CACHE_DIR") or Path.home() / ".cache" / "suite")


def check_cache_writable() -> Path:
    """The cache folder, created if absent and shown to take a file; :class:`~suite.errors.SuiteError` in one line
    where it cannot (a read-only HOME, a cache on a read-only mount), before anything is run or recorded."""
    from suite.errors import SuiteError

    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix=".suite-write-check-", dir=root):
            pass
    except OSError as exc:
        where = "$SUITE_CACHE_DIR" if os.environ.get("SUITE_CACHE_DIR") else "$HOME/.cache/suite"
        raise SuiteError(f"the suite's cache folder {root} ({where}) cannot be written: "
                         f"{exc.strerror or exc}; set SUITE_CACHE_DIR to a writable folder") from None
    return root


#: The largest record file read (results.json, a manifest, audit.json...): far above any real matrix's.
RECORD_MAX_BYTES = 512 * 2**20


class UnreadableFile(OSError):
    """A file that is not one to read: not a regular file, or larger than its bound; says which and why."""


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def read_regular_file(path: str | os.PathLike[str], max_bytes: int, what: str = "file") -> bytes:
    """The bytes of ``path``, read without ever blocking or reading without bound: opened non-blocking (a FIFO
    cannot hang), refused unless it is a regular file of at most ``max_bytes`` (read no further than that even if it
    grows). Raises :class:`UnreadableFile` (``what`` names the file's role in the message) or ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile(f"{what} {path} is a {file_kind(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            raise UnreadableFile(f"{what} {path} is {info.st_size:,} bytes, over the limit of {max_bytes:,}")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise UnreadableFile(f"{what} {path} grew beyond the limit of {max_bytes:,} bytes while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


#: What a record file may become in memory once parsed (:func:`json_memory_estimate`): a 99 MB results.json of
#: ``{}`` objects would take ~2.6 GB; a real matrix's records take a few hundred MB at most.
RECORD_MAX_MEMORY = 1024 * 2**20
#: Bytes a parsed JSON value costs at most beside its text, per container (``{``, ``[``: a dict, a list) and per
#: scalar (each ``,`` or ``:`` separates one): CPython's sizes, rounded up (an empty dict 64 B + its table, a float 24).
_CONTAINER_BYTES, _SCALAR_BYTES = 240, 64


def json_memory_estimate(text: str | bytes) -> int:
    """An upper estimate of the memory ``json.loads(text)`` takes, from counts of its structural characters (C speed,
    no parse): its text, plus :data:`_CONTAINER_BYTES` per container and :data:`_SCALAR_BYTES` per value."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    containers = data.count(b"{") + data.count(b"[")
    scalars = data.count(b",") + data.count(b":") + 1
    return len(data) + containers * _CONTAINER_BYTES + scalars * _SCALAR_BYTES


def loads_bounded(text: str, what: str, max_memory: int = RECORD_MAX_MEMORY) -> Any:
    """``json.loads(text)`` when what it becomes in memory is bounded by ``max_memory`` (:func:`json_memory_estimate`)
    and its nesting is within Python's recursion limit; else ``ValueError`` saying which bound ``what`` passes.
    (``json.JSONDecodeError``, a ``ValueError``, for text that is not JSON.)"""
    estimate = json_memory_estimate(text)
    if estimate > max_memory:
        raise ValueError(f"{what} would take about {estimate / 2**20:,.0f} MiB once read (its {len(text):,} "
                         f"characters hold that many objects and values), over the limit of {max_memory / 2**20:,.0f} "
                         "MiB")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{what} is JSON nested too deeply to read") from None


def read_record_text(path: str | os.PathLike[str], max_bytes: int = RECORD_MAX_BYTES) -> str:
    """A record file's text (UTF-8), read as :func:`read_regular_file` reads: a FIFO or ``/dev/zero`` in its place
    is refused at once instead of hanging or filling memory."""
    return read_regular_file(path, max_bytes, "record file").decode("utf-8")
