"""Contract test of the hub dataset source against a stand-in `datasets` module (no network here).

It checks that the published dataset is requested at the pinned revision and config, that images are
kept encoded (``Image(decode=False)``), and that bytes, paths and missing columns are handled.
"""

import sys
import types

import pytest

from suite.errors import DatasetError
from workloads.bridgetower.data.catalog import open_source
from workloads.bridgetower.data.hub import NEWYORKER_CONFIG, NEWYORKER_ID, NEWYORKER_REVISION

pytestmark = pytest.mark.mechanics  # nothing here depends on the transformers line


class StandInImage:
    def __init__(self, decode=True):
        self.decode = decode


class StandInDataset:
    def __init__(self, rows, calls):
        self.rows, self.calls = rows, calls
        self.column_names = list(rows[0])

    def cast_column(self, column, feature):
        self.calls.append(("cast_column", column, feature.decode))
        return self

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, key):
        if isinstance(key, str):
            return [row[key] for row in self.rows]
        return self.rows[key]


@pytest.fixture
def stand_in_datasets(monkeypatch, tmp_path):
    calls = []
    on_disk = tmp_path / "img.jpg"
    on_disk.write_bytes(b"\xff\xd8path")
    rows = [{"image": {"bytes": b"\xff\xd8bytes", "path": None}, "image_description": "a cat", "contest_number": 1},
            {"image": {"bytes": None, "path": str(on_disk)}, "image_description": "a dog", "contest_number": 2}]
    module = types.ModuleType("datasets")
    module.Image = StandInImage

    def load_dataset(name, config, revision=None, split=None):
        calls.append(("load_dataset", name, config, revision, split))
        return StandInDataset(rows, calls)

    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls, rows


def test_newyorker_is_loaded_pinned_and_kept_encoded(stand_in_datasets):
    calls, _ = stand_in_datasets
    source = open_source("newyorker")
    assert calls[0] == ("load_dataset", NEWYORKER_ID, NEWYORKER_CONFIG, NEWYORKER_REVISION, "train")
    assert calls[1] == ("cast_column", "image", False)
    assert len(source) == 2 and source.captions() == ["a cat", "a dog"]
    assert source.read_bytes(0) == b"\xff\xd8bytes" and source.read_bytes(1) == b"\xff\xd8path"
    assert source.describe()["revision"] == NEWYORKER_REVISION


def test_missing_caption_column_is_a_clear_error(stand_in_datasets):
    _, rows = stand_in_datasets
    for row in rows:
        row.pop("image_description")
    with pytest.raises(DatasetError, match="has no column 'image_description'; columns: image, contest_number"):
        open_source("newyorker")


def test_without_datasets_installed_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DatasetError, match=r"pip install 'suite-bench\[hub\]'"):
        open_source("newyorker")
