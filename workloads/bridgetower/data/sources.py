"""Where (encoded image, caption) pairs come from.

``--dataset`` selects the deterministic local set of :mod:`.synthetic` (default), the published dataset
(``newyorker``, :mod:`.hub`) or a folder in the Hugging Face ``imagefolder`` layout: image files plus
``metadata.jsonl`` (at the root or in ``train/``) with ``file_name`` and the caption column; its picker is
:func:`workloads.bridgetower.data.catalog.open_source`. Sources hand out *encoded* bytes: the loader decodes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from suite import fileio
from suite.errors import DatasetError

from workloads.bridgetower.data.bounds import DEFAULT_MAX_IMAGE_BYTES
from workloads.bridgetower.data.synthetic import CAPTION_COLUMN


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

    def sample_key(self, index: int) -> str:
        """What names sample ``index`` within the dataset wherever it lies (file name in the folder, split + index)."""
        return self.name_of(index)

    def content_key(self, index: int) -> str:
        """The held-out split's key: the image's sha256 (a repeated picture on one side only), else its sample key."""
        try:
            return hashlib.sha256(self.read_bytes(index)).hexdigest()
        except (DatasetError, OSError):
            return f"unreadable:{self.sample_key(index)}"

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


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def read_regular_file(path: Path, max_bytes: int, inside: Path | None = None) -> bytes:
    """The bytes of image ``path`` (:func:`suite.fileio.read_regular_file`: never blocking, never beyond
    ``max_bytes``), and, with ``inside``, only while it still resolves inside that folder; a :class:`DatasetError`
    naming it otherwise."""
    if inside is not None and not Path(os.path.realpath(path)).is_relative_to(inside):
        raise DatasetError(f"image {path} now leads outside the dataset folder {inside}")
    try:
        return fileio.read_regular_file(path, max_bytes, "image")
    except fileio.UnreadableFile as exc:
        text = str(exc)
        raise DatasetError(text + (" (--max-image-bytes)" if "over the limit" in text else "")) from None
    except OSError as exc:
        raise DatasetError(f"cannot read image {path}: {exc.strerror or exc}") from exc


def _json_line(where: str, line: str) -> Any:
    """One metadata line as JSON; every way it can be unreadable is one :class:`DatasetError` naming the line."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{where}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise DatasetError(f"{where}: JSON nested too deeply to read") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        why = (f"a number of more digits than Python reads, {sys.get_int_max_str_digits()}" if "digits" in str(exc)
               else " ".join(str(exc).split())[:120])
        raise DatasetError(f"{where}: not a readable JSON line ({why})") from None


def _require_unicode(where: str, column: str, text: str) -> None:
    """Refuse a string JSON let through that is not Unicode text (a lone surrogate such as ``\\ud800``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DatasetError(f"{where}: {column} holds {text[exc.start]!r} at character {exc.start}, a lone "
                           "surrogate: not Unicode text") from None


#: Repeated warnings of one kind said one by one before the rest are counted in one line.
LISTED_WARNINGS = 5
#: The longest caption read (UTF-8 bytes) without --max-caption-bytes: the published captions are ~200 bytes and
#: the model reads 128 tokens of one; a 100 MB caption took a configuration to 21 GB before this bound.
DEFAULT_MAX_CAPTION_BYTES = 64 * 2**10
#: What a metadata line may hold besides its caption (file name, other columns), for the check before parsing.
_LINE_OVERHEAD_BYTES = 64 * 2**10


class ImageFolderSource(ImageCaptionSource):
    """A Hugging Face ``imagefolder`` layout on disk, checked up front line by line.

    Each line of ``metadata.jsonl`` must be UTF-8, a JSON object, with ``file_name`` a non-empty relative path
    inside the dataset folder (no absolute path, no ``..``, no symbolic link leading out unless
    ``allow_outside_links``) naming a regular file, and a caption that is a string. Every violation is a
    :class:`DatasetError` naming the file and line, before any configuration runs. With ``strict_files=False``
    (``--skip-bad-samples``) a missing image is left to the scan, which skips it; a duplicate file name is a
    warning (:attr:`warnings`).
    """

    def __init__(self, root: str | Path, caption_column: str = CAPTION_COLUMN, kind: str = "imagefolder",
                 allow_outside_links: bool = False, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
                 strict_files: bool = True, facts: dict[str, Any] | None = None,
                 max_caption_bytes: int = DEFAULT_MAX_CAPTION_BYTES) -> None:
        self.root = Path(root).expanduser().resolve()
        self.kind = kind
        self.facts = dict(facts or {})  # recorded with the description (e.g. how a synthetic set was made)
        self.caption_column = caption_column
        self.allow_outside_links = allow_outside_links
        self.max_bytes = max_bytes
        self.max_caption_bytes = max_caption_bytes
        self.warnings: list[str] = []
        if not self.root.exists():
            raise DatasetError(f"dataset path does not exist: {self.root}")
        if not self.root.is_dir():
            raise DatasetError(f"dataset path is not a folder: {self.root}")
        candidates = [self.root / "metadata.jsonl", self.root / "train" / "metadata.jsonl"]
        metadata = next((p for p in candidates if p.is_file()), None)
        if metadata is None:
            raise DatasetError(f"no metadata.jsonl in {self.root} or {self.root / 'train'} (imagefolder layout)")
        self.metadata_path = metadata
        self._entries = self._read(metadata, strict_files)
        self._fingerprint: dict[str, Any] | None = None
        self._file_digests: list[str] = []  # per sample, from fingerprint(): the split's content keys
        self.fingerprint_cache: dict[str, int] = {}  # file digests reused / computed by the last fingerprint

    def _entry_path(self, where: str, file_name: Any) -> Path:
        if not isinstance(file_name, str) or not file_name.strip() or "\0" in file_name:
            raise DatasetError(f"{where}: file_name must be a non-empty string, got {file_name!r}")
        _require_unicode(where, "file_name", file_name)
        relative = PurePosixPath(file_name)
        if relative.is_absolute() or PureWindowsPath(file_name).is_absolute():
            raise DatasetError(f"{where}: file_name {file_name!r} is an absolute path; it must be relative to the "
                               f"dataset folder {self.root}")
        if ".." in relative.parts:
            raise DatasetError(f"{where}: file_name {file_name!r} leaves the dataset folder ('..')")
        path = self.metadata_path.parent / relative
        target = Path(os.path.realpath(path))
        if not target.is_relative_to(self.root) and not self.allow_outside_links:
            raise DatasetError(f"{where}: file_name {file_name!r} is a symbolic link leading outside the dataset "
                               f"folder (to {target}); pass --allow-outside-links to follow it")
        return path

    def _read(self, metadata: Path, strict_files: bool) -> list[_Entry]:
        entries: list[_Entry] = []
        first_line: dict[str, int] = {}
        repeated = 0
        with open(metadata, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                where = f"{metadata}:{number}"
                try:
                    line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a BOM may open the file
                except UnicodeDecodeError as exc:
                    raise DatasetError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
                if not line.strip():
                    continue
                if len(raw) > self.max_caption_bytes + _LINE_OVERHEAD_BYTES:  # before parsing a 100 MB line
                    raise DatasetError(f"{where}: the line is {len(raw):,} bytes; a caption may be at most "
                                       f"{self.max_caption_bytes:,} bytes (--max-caption-bytes)")
                row = _json_line(where, line)
                if not isinstance(row, dict):
                    raise DatasetError(f"{where}: a JSON {_JSON_TYPES.get(type(row), type(row).__name__)}, not an "
                                       f"object with file_name and {self.caption_column}")
                for column in ("file_name", self.caption_column):
                    if column not in row:
                        raise DatasetError(
                            f"{where}: no column {column!r}; columns present: {', '.join(sorted(map(str, row)))}")
                path = self._entry_path(where, row["file_name"])
                caption = row[self.caption_column]
                if not isinstance(caption, str):
                    raise DatasetError(f"{where}: {self.caption_column} must be a string, got {caption!r}")
                _require_unicode(where, self.caption_column, caption)
                if len(caption.encode("utf-8")) > self.max_caption_bytes:
                    raise DatasetError(f"{where}: {self.caption_column} is {len(caption.encode('utf-8')):,} bytes, "
                                       f"over the limit of {self.max_caption_bytes:,} (--max-caption-bytes)")
                self._check_file(where, path, strict_files)
                name = os.path.normpath(PurePosixPath(row["file_name"]).as_posix())  # ./a.jpg and a.jpg: one file
                if name in first_line:
                    repeated += 1
                    if repeated <= LISTED_WARNINGS:
                        self.warnings.append(f"{where}: file_name {row['file_name']!r} is listed again (first on "
                                             f"line {first_line[name]}); both samples are used")
                first_line.setdefault(name, number)
                entries.append(_Entry(path, caption))
        if not entries:
            raise DatasetError(f"{metadata} lists no samples")
        if repeated > LISTED_WARNINGS:
            self.warnings.append(f"{metadata}: and {repeated - LISTED_WARNINGS:,} more lines list a file name again "
                                 f"({repeated:,} in all); their samples are used too")
        return entries

    @staticmethod
    def _check_file(where: str, path: Path, strict_files: bool) -> None:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            if strict_files:
                raise DatasetError(f"{where}: no such image file {path}") from None
            return  # --skip-bad-samples: the scan records it as unreadable
        except OSError as exc:
            raise DatasetError(f"{where}: cannot read image file {path}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(mode):
            raise DatasetError(f"{where}: {path} is a {fileio.file_kind(mode)}, not a regular file")

    def __len__(self) -> int:
        return len(self._entries)

    def captions(self) -> list[str]:
        return [entry.caption for entry in self._entries]

    def read_bytes(self, index: int) -> bytes:
        return read_regular_file(self._entries[index].path, self.max_bytes,
                                 None if self.allow_outside_links else self.root)

    def name_of(self, index: int) -> str:
        return str(self._entries[index].path)

    def sample_key(self, index: int) -> str:
        return self._entries[index].path.relative_to(self.metadata_path.parent).as_posix()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.root), "metadata": str(self.metadata_path),
                "caption_column": self.caption_column, "num_samples": len(self),
                "allow_outside_links": self.allow_outside_links, "warnings": list(self.warnings), **self.facts}

    def fingerprint(self) -> dict[str, Any]:
        """sha256 over every sample's (file name, sha256 of the file, caption), in index order. Computed once per
        source; a file's digest is reused across processes while its size, mtime, ctime and inode are unchanged
        (:mod:`.file_hashes`), and only for a file that would be read now (a regular file within the size bound,
        inside the folder unless links out are allowed): any other is read, and is "unreadable" as before."""
        if self._fingerprint is not None:
            return dict(self._fingerprint)
        from workloads.bridgetower.data.file_hashes import FileHashes

        self._file_digests = []

        hashes = FileHashes(self.root)
        digest = hashlib.sha256()
        for index, entry in enumerate(self._entries):
            try:
                info = os.stat(entry.path)
                if self._readable_as_is(entry.path, info):
                    file_hash = hashes.sha256(entry.path, info, functools.partial(self.read_bytes, index))
                else:
                    file_hash = hashlib.sha256(self.read_bytes(index)).hexdigest()
            except (DatasetError, OSError):
                file_hash = "unreadable"  # fails the run when loaded, or is skipped with --skip-bad-samples
            name = entry.path.relative_to(self.metadata_path.parent).as_posix()
            self._file_digests.append(file_hash if file_hash != "unreadable" else f"unreadable:{name}")
            digest.update(f"{name}\t{file_hash}\t{entry.caption}\n".encode("utf-8", "surrogatepass"))
        hashes.save()
        self.fingerprint_cache = {"hits": hashes.hits, "misses": hashes.misses}
        self._fingerprint = {"method": "sha256(file_name, sha256(file), caption per sample)",
                             "sha256": digest.hexdigest(), "num_samples": len(self)}
        return dict(self._fingerprint)

    def content_key(self, index: int) -> str:
        if not self._file_digests:  # the file's sha256 as the fingerprint computes it (cached, see .file_hashes)
            self._fingerprint = None
            self.fingerprint()
        return self._file_digests[index]

    def _readable_as_is(self, path: Path, info: os.stat_result) -> bool:
        """Whether :meth:`read_bytes` would read ``path`` (stat ``info``) without refusing it."""
        if not stat.S_ISREG(info.st_mode) or info.st_size > self.max_bytes:
            return False
        return self.allow_outside_links or Path(os.path.realpath(path)).is_relative_to(self.root)
