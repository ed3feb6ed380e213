import json

import pytest

from suite.fileio import write_json_atomic

pytestmark = pytest.mark.mechanics


def test_a_failed_write_leaves_the_previous_file_whole_and_no_temporary(tmp_path):
    target = tmp_path / "results.json"
    write_json_atomic(target, [{"run": 1}])
    with pytest.raises(TypeError):
        write_json_atomic(target, [{"run": 1}, {"run": object()}])  # fails halfway through serializing
    assert json.loads(target.read_text()) == [{"run": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_creates_parent_folders(tmp_path):
    write_json_atomic(tmp_path / "a" / "b.json", {"x": 1})
    assert json.loads((tmp_path / "a" / "b.json").read_text()) == {"x": 1}
