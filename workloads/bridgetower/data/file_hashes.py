"""The sha256 of each dataset file, remembered across processes while the file is unchanged.

A dataset's fingerprint hashes every file; every configuration of a matrix (and the runner's check before it) needs
it, and for 10,000 images reading them all is seconds per configuration. The digests are kept in one JSON file
per dataset folder under the suite's cache (``$SUITE_CACHE_DIR/bridgetower/file-hashes/``), each with the file's
stamp: (size, mtime, ctime, inode). A digest is reused only when all four are unchanged; ``ctime`` cannot be set
back by a program (``touch -d`` changes it), so a rewritten file of the same size and restored mtime is re-hashed
too. The ``--skip-bad-samples`` scan is keyed by the fingerprint, so it shares this cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from suite.fileio import cache_root, write_json_atomic

CACHE_VERSION = 1


def _stamp(info: os.stat_result) -> list[int]:
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


class FileHashes:
    """sha256 digests of the files of one dataset folder; :meth:`save` keeps the new ones for the next process."""

    def __init__(self, dataset_root: Path) -> None:
        root = str(Path(dataset_root).resolve())
        name = hashlib.sha256(root.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        self.path = cache_root() / "bridgetower" / "file-hashes" / f"{name}.json"
        self.hits = self.misses = 0
        self._entries: dict[str, list] = {}
        self._dirty = False
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") == CACHE_VERSION and data.get("root") == root:
                self._entries = {k: v for k, v in data["files"].items() if isinstance(v, list) and len(v) == 5}
        except (OSError, ValueError, KeyError, AttributeError):
            pass  # no cache yet, or an unreadable one: hash everything
        self._root = root

    def sha256(self, path: Path, info: os.stat_result, read: Callable[[], bytes]) -> str:
        """The digest of ``path`` (whose ``os.stat`` is ``info``): remembered if its stamp is unchanged, else
        ``read()`` and hashed (errors of ``read`` propagate and nothing is remembered)."""
        key = str(path)
        entry = self._entries.get(key)
        stamp = _stamp(info)
        if entry is not None and entry[:4] == stamp:
            self.hits += 1
            return str(entry[4])
        digest = hashlib.sha256(read()).hexdigest()
        self.misses += 1
        try:
            unchanged = _stamp(os.stat(path)) == stamp  # not rewritten while it was read
        except OSError:
            unchanged = False
        if unchanged:
            self._entries[key] = [*stamp, digest]
            self._dirty = True
        return digest

    def save(self) -> None:
        """Write the digests learnt (atomically); a cache that cannot be written is only a slower next run."""
        if not self._dirty:
            return
        try:
            write_json_atomic(self.path, {"version": CACHE_VERSION, "root": self._root, "files": self._entries})
            self._dirty = False
        except OSError:
            pass
