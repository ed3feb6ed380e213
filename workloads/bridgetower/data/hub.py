"""Image-caption sources other than a folder: the New Yorker Caption Contest from the hub, and a subset of any
source."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from suite.errors import DatasetError

from workloads.bridgetower.data.bounds import DEFAULT_MAX_IMAGE_BYTES
from workloads.bridgetower.data.sources import ImageCaptionSource, read_regular_file
from workloads.bridgetower.data.synthetic import CAPTION_COLUMN

NEWYORKER_ID = "jmhessel/newyorker_caption_contest"
NEWYORKER_CONFIG = "matching"
NEWYORKER_REVISION = "3c6c4f6c0ff7e902833d3afa5f8f3875c2b036e6"
NEWYORKER_IMAGE_COLUMN = "image"


class HubSource(ImageCaptionSource):
    """The published dataset through ``datasets.load_dataset`` at a pinned revision."""

    def __init__(self, dataset_id: str = NEWYORKER_ID, config_name: str = NEWYORKER_CONFIG,
                 revision: str = NEWYORKER_REVISION, image_column: str = NEWYORKER_IMAGE_COLUMN,
                 caption_column: str = CAPTION_COLUMN, split: str = "train",
                 max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> None:
        try:
            import datasets
        except ImportError as exc:
            raise DatasetError("the hub dataset needs the 'datasets' package: pip install 'suite-bench[hub]'") from exc
        self.dataset_id, self.config_name, self.revision, self.split = dataset_id, config_name, revision, split
        self.max_bytes = max_bytes
        self.image_column, self.caption_column = image_column, caption_column
        try:
            data = datasets.load_dataset(dataset_id, config_name, revision=revision, split=split)
        except Exception as exc:  # network, auth, missing revision...
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
        captions = list(self._data[self.caption_column])
        for index, caption in enumerate(captions):
            if not isinstance(caption, str):
                raise DatasetError(f"{self.dataset_id} sample {index}: {self.caption_column} must be a string, got "
                                   f"{caption!r}")
        return captions

    def read_bytes(self, index: int) -> bytes:
        item = self._data[index][self.image_column]
        if item.get("bytes"):
            return item["bytes"]  # already in memory: the bounds check follows in the loader
        if item.get("path"):
            return read_regular_file(Path(item["path"]), self.max_bytes)
        raise DatasetError(f"{self.dataset_id} sample {index} has no image bytes or path")

    def name_of(self, index: int) -> str:
        return f"{self.dataset_id}[{self.split}][{index}]"

    def sample_key(self, index: int) -> str:
        return f"{self.split}[{index}]"

    def fingerprint(self) -> dict[str, Any]:
        return {"method": "dataset id + config + revision + split", "dataset_id": self.dataset_id,
                "config": self.config_name, "revision": self.revision, "split": self.split,
                "datasets_fingerprint": getattr(self._data, "_fingerprint", None), "num_samples": len(self)}

    def describe(self) -> dict[str, Any]:
        return {"kind": "hub", "dataset_id": self.dataset_id, "config": self.config_name, "revision": self.revision,
                "split": self.split, "caption_column": self.caption_column, "num_samples": len(self)}


class SourceSubset(ImageCaptionSource):
    """Some samples of a source, by index (a training or a held-out split)."""

    def __init__(self, source: ImageCaptionSource, indices: list[int], role: str) -> None:
        self.source, self.indices, self.role = source, list(indices), role

    def __len__(self) -> int:
        return len(self.indices)

    def captions(self) -> list[str]:
        captions = self.source.captions()
        return [captions[i] for i in self.indices]

    def read_bytes(self, index: int) -> bytes:
        return self.source.read_bytes(self.indices[index])

    def name_of(self, index: int) -> str:
        return self.source.name_of(self.indices[index])

    def sample_key(self, index: int) -> str:
        return self.source.sample_key(self.indices[index])

    def content_key(self, index: int) -> str:
        return self.source.content_key(self.indices[index])

    def describe(self) -> dict[str, Any]:
        return {**self.source.describe(), "split": self.role, "num_samples": len(self)}

    def fingerprint(self) -> dict[str, Any]:
        return {**self.source.fingerprint(), "split": self.role,
                "indices_sha256": hashlib.sha256(",".join(map(str, self.indices)).encode()).hexdigest()}
