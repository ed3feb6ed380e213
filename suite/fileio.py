"""Atomic file writes: a reader never sees a half-written file, and an interrupt cannot cut one short."""

from __future__ import annotations

import contextlib
import json
import os
import signal
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
