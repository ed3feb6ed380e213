"""Where (encoded image, caption) pairs come from.

``--dataset`` selects one of:

* ``synthetic`` (default): the deterministic local set of :mod:`.synthetic`;
* ``newyorker``: the published dataset, ``jmhessel/newyorker_caption_contest`` config ``matching`` at the
  pinned revision, through the ``datasets`` library (needs network and the ``hub`` extra);
* a folder path in the Hugging Face ``imagefolder`` layout: image files plus ``metadata.jsonl`` (at the
  root or in ``train/``) with ``file_name`` and the caption column.

Sources hand out *encoded* bytes; decoding happens in the loader (CPU workers or the device).
:func:`workloads.bridgetower.data.catalog.open_source` picks the source a ``--dataset`` names.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.errors import DatasetError

from workloads.bridgetower.data.synthetic import CAPTION_COLUMN

NEWYORKER_ID = "jmhessel/newyorker_caption_contest"
NEWYORKER_CONFIG = "matching"
NEWYORKER_REVISION = "3c6c4f6c0ff7e902833d3afa5f8f3875c2b036e6"
NEWYORKER_IMAGE_COLUMN = "image"


class ImageCaptionSource(ABC):
    """An indexable set of (encoded image bytes, caption) pairs; picklable for loader workers."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def captions(self) -> list[str]:
        """All captions, in index order (tokenized once, up front, as the reference does)."""

    @abstractmethod
    def read_bytes(self, index: int) -> bytes:
        """The encoded image of sample ``index``; raises :class:`DatasetError` naming the sample."""

    @abstractmethod
    def name_of(self, index: int) -> str:
        """How error messages name sample ``index`` (its file path, or dataset[split][index])."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Facts recorded with the run: kind, location, revision, sample count."""

    @abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """What identifies the data exactly: content hashes, or dataset id + revision."""


@dataclass(frozen=True)
class _Entry:
    path: Path
    caption: str


class ImageFolderSource(ImageCaptionSource):
    """A Hugging Face ``imagefolder`` layout on disk."""

    def __init__(self, root: str | Path, caption_column: str = CAPTION_COLUMN, kind: str = "imagefolder") -> None:
        self.root = Path(root).expanduser().resolve()
        self.kind = kind
        self.caption_column = caption_column
        if not self.root.exists():
            raise DatasetError(f"dataset path does not exist: {self.root}")
        candidates = [self.root / "metadata.jsonl", self.root / "train" / "metadata.jsonl"]
        metadata = next((p for p in candidates if p.is_file()), None)
        if metadata is None:
            raise DatasetError(f"no metadata.jsonl in {self.root} or {self.root / 'train'} (imagefolder layout)")
        self.metadata_path = metadata
        self._entries = self._read(metadata)

    def _read(self, metadata: Path) -> list[_Entry]:
        entries = []
        with open(metadata) as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{metadata}:{number}: not valid JSON ({exc.msg})") from exc
                for column in ("file_name", self.caption_column):
                    if column not in row:
                        raise DatasetError(
                            f"{metadata}:{number}: no column {column!r}; columns present: {', '.join(sorted(row))}"
                        )
                entries.append(_Entry(metadata.parent / row["file_name"], str(row[self.caption_column])))
        if not entries:
            raise DatasetError(f"{metadata} lists no samples")
        return entries

    def __len__(self) -> int:
        return len(self._entries)

    def captions(self) -> list[str]:
        return [entry.caption for entry in self._entries]

    def read_bytes(self, index: int) -> bytes:
        path = self._entries[index].path
        try:
            return path.read_bytes()
        except OSError as exc:
            raise DatasetError(f"cannot read image {path}: {exc.strerror or exc}") from exc

    def name_of(self, index: int) -> str:
        return str(self._entries[index].path)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.root), "metadata": str(self.metadata_path),
                "caption_column": self.caption_column, "num_samples": len(self)}

    def fingerprint(self) -> dict[str, Any]:
        """sha256 over every sample's (file name, sha256 of the file, caption), in index order."""
        digest = hashlib.sha256()
        for index, entry in enumerate(self._entries):
            try:
                file_hash = hashlib.sha256(self.read_bytes(index)).hexdigest()
            except DatasetError:
                file_hash = "unreadable"  # fails the run when loaded, or is skipped with --skip-bad-samples
            name = entry.path.relative_to(self.metadata_path.parent).as_posix()
            digest.update(f"{name}\t{file_hash}\t{entry.caption}\n".encode())
        return {"method": "sha256(file_name, sha256(file), caption per sample)", "sha256": digest.hexdigest(),
                "num_samples": len(self)}


class HubSource(ImageCaptionSource):
    """The published dataset through ``datasets.load_dataset`` at a pinned revision."""

    def __init__(self, dataset_id: str = NEWYORKER_ID, config_name: str = NEWYORKER_CONFIG,
                 revision: str = NEWYORKER_REVISION, image_column: str = NEWYORKER_IMAGE_COLUMN,
                 caption_column: str = CAPTION_COLUMN, split: str = "train") -> None:
        try:
            import datasets
        except ImportError as exc:
            raise DatasetError("the hub dataset needs the 'datasets' package: pip install 'suite-bench[hub]'") from exc
        self.dataset_id, self.config_name, self.revision, self.split = dataset_id, config_name, revision, split
        self.image_column, self.caption_column = image_column, caption_column
        try:
            data = datasets.load_dataset(dataset_id, config_name, revision=revision, split=split)
        except Exception as exc:  # noqa: BLE001 - network, auth, missing revision...
            raise DatasetError(f"cannot load {dataset_id} ({config_name}@{revision}): "
                               f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from exc
        for column in (image_column, caption_column):
            if column not in data.column_names:
                raise DatasetError(f"{dataset_id} has no column {column!r}; columns: {', '.join(data.column_names)}")
        # Keep images encoded: decoding is the loader's job (CPU workers or the device).
        self._data = data.cast_column(image_column, datasets.Image(decode=False))

    def __len__(self) -> int:
        return len(self._data)

    def captions(self) -> list[str]:
        return [str(c) for c in self._data[self.caption_column]]

    def read_bytes(self, index: int) -> bytes:
        item = self._data[index][self.image_column]
        if item.get("bytes"):
            return item["bytes"]
        if item.get("path"):
            try:
                return Path(item["path"]).read_bytes()
            except OSError as exc:
                raise DatasetError(f"cannot read image {item['path']}: {exc.strerror or exc}") from exc
        raise DatasetError(f"{self.dataset_id} sample {index} has no image bytes or path")

    def name_of(self, index: int) -> str:
        return f"{self.dataset_id}[{self.split}][{index}]"

    def fingerprint(self) -> dict[str, Any]:
        return {"method": "dataset id + config + revision + split", "dataset_id": self.dataset_id,
                "config": self.config_name, "revision": self.revision, "split": self.split,
                "datasets_fingerprint": getattr(self._data, "_fingerprint", None), "num_samples": len(self)}

    def describe(self) -> dict[str, Any]:
        return {"kind": "hub", "dataset_id": self.dataset_id, "config": self.config_name, "revision": self.revision,
                "split": self.split, "caption_column": self.caption_column, "num_samples": len(self)}
