"""Issue 46, sinks: nothing is written through a link out of a folder (every output is made new beside its place and
renamed over it), files follow the umask, and what the suite writes for other readers (spreadsheets, browsers, JSON
readers) cannot be turned against them: identity columns that a metric cannot overwrite, CSV cells that a spreadsheet
will not evaluate, HTML without raw control characters, JSON without NaN."""

import json
import math
import os
import shutil
import stat

import pandas as pd
import pytest

from suite.analysis.export import row_of_result, write_tables
from suite.cli import main
from suite.fileio import dumps_json, write_text_atomic
from suite.results.files import read_results_file

pytestmark = pytest.mark.mechanics


def _copy(recorded_matrix, tmp_path, name="m"):
    folder = tmp_path / name
    shutil.copytree(recorded_matrix, folder)
    return folder


def _plant_links(folder, names, outside):
    """Each name in ``folder`` a symbolic link to its own file outside, holding "keep me"."""
    targets = {}
    for name in names:
        target = outside / f"victim-{name}"
        target.write_text("keep me")
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(target)
        targets[name] = target
    return targets


def _untouched(targets, folder):
    for name, target in targets.items():
        assert target.read_text() == "keep me", f"{name} wrote through its link into {target}"
        assert not (folder / name).is_symlink() and (folder / name).is_file()  # the link itself was replaced


def test_the_report_replaces_links_in_its_folder_and_never_writes_through_them(recorded_matrix, tmp_path):
    folder = _copy(recorded_matrix, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    names = ["report.html", "report.md", *sorted(p.name for p in recorded_matrix.glob("report-*.png"))]
    assert len(names) >= 3
    targets = _plant_links(folder, names, outside)
    assert main(["report", str(folder)]) == 0
    _untouched(targets, folder)


def test_export_and_compare_plots_replace_links_too(recorded_matrix, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    export, plots = tmp_path / "export", tmp_path / "plots"
    export.mkdir()
    plots.mkdir()
    exported = _plant_links(export, ["runs.csv", "runs.parquet"], outside)
    plotted = _plant_links(plots, ["throughput.png", "memory.png"], outside)
    assert main(["export", str(recorded_matrix), "--output", str(export)]) == 0
    assert main(["compare", str(recorded_matrix), "--output", str(plots)]) == 0
    _untouched(exported, export)
    _untouched(plotted, plots)


def test_written_files_follow_the_umask(tmp_path):
    """mkstemp makes a file readable by its owner only; a results folder and report are for sharing."""
    previous = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a.json", "{}")
        os.umask(0o077)
        write_text_atomic(tmp_path / "b.json", "{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o600


def test_a_metric_cannot_take_an_identity_column(recorded_matrix):
    result = read_results_file(recorded_matrix / "results.json")[0]
    for name in ("config_id", "status", "source", "run_uid", "config.device", "facts.run_dir"):
        result.metrics[name] = 666.0
    row = row_of_result(result, "the folder")
    assert row["config_id"] == result.config.config_id and row["status"] == "FINISHED"
    assert row["source"] == "the folder" and row["run_uid"] == result.run_uid
    assert row["config.device"] == "cpu" and row["facts.run_dir"] == result.facts["run_dir"]
    assert row["metric.config_id"] == 666.0 and row["metric.config.device"] == 666.0


def test_text_a_spreadsheet_would_evaluate_is_written_as_text(tmp_path):
    """OWASP's CSV-injection advice: a cell starting with = + - @ (or tab / CR) is written behind a quote; numbers
    stay numbers (a negative growth is a number, not text); Parquet keeps the text as it was."""
    rows = [{"source": "=HYPERLINK(\"http://evil\",\"x\")", "config.dataset": "+cmd|' /C calc'!A0",
             "reason": "@SUM(1)", "facts.note": "-2+3", "memory_growth_bytes_per_step": -5.0, "plain": "ok"}]
    csv, parquet, count = write_tables(rows, tmp_path)
    text = csv.read_text()
    assert "'=HYPERLINK" in text and "'+cmd" in text and "'@SUM" in text and "'-2+3" in text
    cells = pd.read_csv(csv)
    assert cells["memory_growth_bytes_per_step"][0] == -5.0 and cells["plain"][0] == "ok"
    assert pd.read_parquet(parquet)["source"][0] == rows[0]["source"]


def test_json_for_readers_has_no_nan(tmp_path):
    text = dumps_json({"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": {"d": 2}})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON")) == \
        {"a": None, "b": [None, None, 1.5], "c": {"d": 2}}


def test_the_report_shows_control_characters_and_direction_overrides_as_escapes(recorded_matrix, tmp_path):
    """A raw ESC or U+202E (right-to-left override: it reverses the line in the browser) from a record reached
    report.html as it was."""
    folder = _copy(recorded_matrix, tmp_path)
    data = json.loads((folder / "results.json").read_text())
    for run in data["runs"]:
        run["reason"] = "evil \x1b[2J \u202eexe.txt"
        run["status"] = "FAILED"
    data["runs"][0]["status"] = "FINISHED"
    data["runs"][0]["reason"] = None
    (folder / "results.json").write_text(json.dumps(data))
    assert main(["report", str(folder)]) == 0
    page = (folder / "report.html").read_text()
    assert "\x1b" not in page and "\u202e" not in page
    assert "\\x1b[2J" in page and "\\u202eexe.txt" in page


def test_the_screenshot_replaces_a_link_and_never_writes_through_it(recorded_matrix, tmp_path):
    """`suite report --screenshot PATH` handed Chromium the link's resolved target."""
    from suite.report.browser import find_chromium

    if find_chromium() is None:
        if os.environ.get("SUITE_REQUIRE_CHROMIUM"):
            pytest.fail("Chromium is required here (SUITE_REQUIRE_CHROMIUM) and was not found")
        pytest.skip("no Chromium on this machine (install Debian's chromium; CI does)")
    folder = _copy(recorded_matrix, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    targets = _plant_links(folder, ["shot.png"], outside)
    assert main(["report", str(folder), "--screenshot", str(folder / "shot.png")]) == 0
    _untouched(targets, folder)
    assert (folder / "shot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
