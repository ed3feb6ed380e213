"""A configuration process started ahead of its turn: it imports what its run needs, waits for the run folder on
stdin, then makes the run's log its stderr."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from suite.registry import load_device, load_workload


def preload(workload: str, device: str) -> None:
    """Import the modules a configuration of ``workload`` on ``device`` needs (see ``Workload.preload``). An error
    is left for the run itself to meet and record, with its reason."""
    try:
        load_device(device)
        load_workload(workload).preload()
    except Exception:  # noqa: BLE001 - the run's set-up raises it again, where it is recorded
        pass


def wait_for_turn() -> Path | None:
    """Standby: block until the runner writes the run folder on stdin; ``None`` when it closes stdin instead."""
    line = sys.stdin.readline()
    return Path(line.strip()) if line.strip() else None


def stderr_into(path: Path) -> None:
    """Standby: from now on stderr is the run's log; what was written before (import warnings) goes first."""
    sys.stderr.flush()
    early = b""
    try:
        if stat.S_ISREG(os.fstat(2).st_mode):
            os.lseek(2, 0, os.SEEK_SET)
            while chunk := os.read(2, 1 << 16):
                early += chunk
    except OSError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    try:
        if early:
            os.write(fd, early)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
