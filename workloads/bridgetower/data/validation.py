"""Finding unusable samples up front, for ``--skip-bad-samples``.

Every image is read within the bounds (:mod:`.bounds`) and decoded once; the indices that fail (corrupt, truncated,
not an image, missing) are left out of the dataset for every configuration alike, and their names and reasons are
recorded. The scan is cached by the dataset's fingerprint, so the runner's check before the matrix and each run's
set-up do the work once.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from suite.errors import DatasetError
from suite.fileio import cache_root, write_json_atomic
from suite.imaging import decode_to_rgb_tensor

from workloads.bridgetower.data.bounds import ImageBounds
from workloads.bridgetower.data.hub import SourceSubset
from workloads.bridgetower.data.sources import ImageCaptionSource


@dataclass(frozen=True)
class Scan:
    usable: tuple[int, ...]
    bad: tuple[tuple[str, str], ...]  # (sample name, reason)


def _cache_key(source: ImageCaptionSource, bounds: ImageBounds) -> str:
    key = {"fingerprint": source.fingerprint(), "bounds": bounds.describe()}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def scan(source: ImageCaptionSource, bounds: ImageBounds) -> Scan:
    """Every sample read and checked against ``bounds``, then decoded; cached by fingerprint and bounds."""
    path = cache_root() / "bridgetower" / "scans" / f"{_cache_key(source, bounds)}.json"
    if path.is_file():
        data = json.loads(path.read_text())
        return Scan(tuple(data["usable"]), tuple(tuple(b) for b in data["bad"]))
    bounds.apply_to_pillow()
    usable, bad = [], []
    for index in range(len(source)):
        try:
            data = source.read_bytes(index)
            bounds.check(data, source.name_of(index))
            decode_to_rgb_tensor(data)
        except Exception as exc:  # noqa: BLE001 - any unreadable sample is recorded with its reason
            reason = " ".join(str(exc).split())
            bad.append((source.name_of(index), reason))
            continue
        usable.append(index)
    result = Scan(tuple(usable), tuple(bad))
    write_json_atomic(path, {"usable": result.usable, "bad": result.bad, "pid": os.getpid()})
    return result


#: How many skipped samples a description lists by name (all are counted).
LISTED = 20


class UsableSamples(SourceSubset):
    """``source`` without the samples a :func:`scan` found unusable."""

    def __init__(self, source: ImageCaptionSource, result: Scan) -> None:
        if not result.usable:
            raise DatasetError(f"no usable samples: all {len(source)} failed to decode "
                               f"(first: {result.bad[0][0]}: {result.bad[0][1]})")
        super().__init__(source, list(result.usable), "usable")
        self.scan = result

    def describe(self) -> dict[str, Any]:
        """The source's description with the samples skipped: their count and the first :data:`LISTED` (a record
        holds no per-sample list of a million bad lines)."""
        shown = self.scan.bad[:LISTED]
        return {**self.source.describe(), "num_samples": len(self), "skipped_samples": len(self.scan.bad),
                "skipped": [{"sample": name, "reason": reason} for name, reason in shown],
                **({"skipped_not_listed": len(self.scan.bad) - len(shown)} if len(self.scan.bad) > LISTED else {})}

    def fingerprint(self) -> dict[str, Any]:
        names = "\n".join(name for name, _ in self.scan.bad)
        return {**self.source.fingerprint(), "skipped": len(self.scan.bad),
                "skipped_sha256": hashlib.sha256(names.encode("utf-8", "surrogateescape")).hexdigest(),
                "num_usable": len(self)}
