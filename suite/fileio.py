"""Atomic file writes: a reader never sees a half-written file, and an interrupt cannot cut one short."""

from __future__ import annotations

import contextlib
import json
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


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsync'ed, then renamed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with signals_deferred():
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def cache_root() -> Path:
    """The suite's cache: ``$SUITE_CACHE_DIR``, else ``~/.cache/suite`` (what is kept there is rebuilt when absent)."""
    return Path(os.environ.get("SUITE_CACHE_DIR") or Path.home() / ".cache" / "suite")


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


def read_record_text(path: str | os.PathLike[str], max_bytes: int = RECORD_MAX_BYTES) -> str:
    """A record file's text (UTF-8), read as :func:`read_regular_file` reads: a FIFO or ``/dev/zero`` in its place
    is refused at once instead of hanging or filling memory."""
    return read_regular_file(path, max_bytes, "record file").decode("utf-8")
