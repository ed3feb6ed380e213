"""The user's view (issue 14): the report rendered by a real browser, its Markdown twin, the report of an MLflow
run, the published figures lined up by what they compare, one spelling of a configuration, MLflow metric groups,
the dry run, the progress display's ETA and MLflow's log lines kept out of it."""

import dataclasses
import io
import logging
import os
import re
from pathlib import Path

import pytest

from suite.analysis.compare import rows_from_results
from suite.analysis.published import align, load_reference, measured_table, reference_table
from suite.cli import main
from suite.config import RunConfig
from suite.config.labels import short_labels
from suite.results.record import FAILED, FINISHED, RunResult
from suite.results.files import MatrixInfo
from suite.results.store import ResultsStore
from suite.tracking.metric_names import mlflow_metrics, mlflow_name, suite_metrics, suite_name
from suite.report import write_report
from suite.report.browser import find_chromium, rendered_dom, screenshot
from suite.report.charts import LOADER_COLOURS
from suite.report.content import from_folder
from suite.report.render import published_tables

pytestmark = pytest.mark.mechanics

BASE = RunConfig(workload="bridgetower", preset="tiny", device="cpu", num_workers=0, loader="cpu", precision="fp32",
                 batch_size=8)
MiB = 2**20


def _metrics(throughput, busy=False):
    return {"throughput_samples_per_s": throughput, "throughput_ci95_low": throughput * 0.95,
            "throughput_ci95_high": throughput * 1.05, "step_time_p50_s": 8 / throughput,
            "step_time_p99_s": 10 / throughput, "data_wait_fraction": 0.3, "host_ram_peak_pss_bytes": 400 * MiB,
            "host_ram_peak_pss_anon_bytes": 300 * MiB, "host_ram_peak_rss_bytes": 460 * MiB,
            "device_peak_memory_bytes": 470 * MiB, "eval_accuracy": 0.05,
            "contention_others_cpu_share": 0.6 if busy else 0.01, "contention_steal_share": 0.0}


def _folder(tmp_path: Path) -> Path:
    """A results folder of six configurations (workers 0-2 x loader cpu/device), one measured on a busy host, and
    one configuration that failed."""
    store = ResultsStore.create(tmp_path / "out", MatrixInfo(
        name="m", workload="bridgetower", command=["suite", "run", "--workers", "0,1,2", "--loader", "cpu,device"],
        tags={"git_commit": "abc123", "git_dirty": "false", "version.torch": "2.13.0", "host.cpu_model": "Test CPU"}))
    figures = {("cpu", 0): 40.0, ("cpu", 1): 55.0, ("cpu", 2): 61.0, ("device", 0): 44.0, ("device", 1): 58.0,
               ("device", 2): 70.0}
    for (loader, workers), throughput in figures.items():
        config = dataclasses.replace(BASE, loader=loader, num_workers=workers)
        store.record(RunResult(config=config, status=FINISHED, run_uid=f"{loader}{workers}",
                               metrics=_metrics(throughput, busy=(loader, workers) == ("cpu", 1)),
                               facts={"device_peak_memory_is_host": True}))  # as the CPU's meter records
    store.record(RunResult(config=dataclasses.replace(BASE, precision="bf16"), status=FAILED,
                           reason="bf16 is not supported here", run_uid="bf16"))
    store.finish(FAILED, "1 of 7 run(s) did not finish")
    store.release()
    return tmp_path / "out"


# --- the report in a real browser -------------------------------------------------------------------------
def _chromium_or_skip():
    if find_chromium() is None:
        if os.environ.get("SUITE_REQUIRE_CHROMIUM"):
            pytest.fail("SUITE_REQUIRE_CHROMIUM is set (CI) but no Chromium was found")
        pytest.skip("no Chromium on this machine (install Debian's chromium; CI does)")


PROBE = """<script>
window.addEventListener('load', () => {
  for (const img of document.images) img.setAttribute('data-probed-width', String(img.naturalWidth));
});
</script></body>"""


def test_the_report_renders_in_headless_chromium_with_its_rows_and_charts(tmp_path):
    _chromium_or_skip()
    files = write_report(from_folder(_folder(tmp_path), "bridgetower_hf_blog_2023"), tmp_path / "report")
    page = files.html.read_text()
    assert not re.search(r'<(img|script|link)[^>]+(src|href)="(https?:)?//', page)  # self-contained
    # what the browser laid out: every configuration row, every chart decoded (a probe added to a copy)
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", PROBE))
    dom = rendered_dom(probed)
    config_ids = re.findall(r'<tr[^>]*data-config-id="([^"]+)"', dom)
    assert len(config_ids) == 6 and len(set(config_ids)) == 6
    widths = [int(w) for w in re.findall(r'data-probed-width="(\d+)"', dom)]
    assert len(widths) == 3 and all(w > 100 for w in widths)  # throughput, memory, published: decoded
    assert "loader cpu: workers 2 vs 0" in dom and "bf16 is not supported here" in dom
    # and what a person sees: a non-blank page with the bars drawn in the CPU loader's colour
    import numpy
    from PIL import Image

    png = screenshot(files.html, tmp_path / "shot.png", width=1200, height=1800)
    pixels = numpy.asarray(Image.open(png).convert("RGB")).reshape(-1, 3).astype(int)
    assert (pixels != 255).any(axis=1).mean() > 0.05  # not a blank page
    cpu_blue = numpy.array([int(LOADER_COLOURS["cpu"][i:i + 2], 16) for i in (1, 3, 5)])
    assert (numpy.abs(pixels - cpu_blue).max(axis=1) < 12).sum() > 2000  # the bars are drawn


def test_the_markdown_twin_says_what_the_page_says(tmp_path):
    content = from_folder(_folder(tmp_path), "bridgetower_hf_blog_2023")
    files = write_report(content, tmp_path / "report")
    markdown, page = files.markdown.read_text(), files.html.read_text()
    for row in content.rows:
        assert f"| {row.config.device} | {row.config.loader} | {row.config.num_workers} |" in markdown
    for image in files.images:
        assert f"]({image.name})" in markdown and image.stat().st_size > 1000
    for text in ("Best: device=cpu workers=2 loader=device precision=fp32 engine=suite at 70.0 samples/s, 1.75x",
                 "host was busy", "abc123", "suite run --workers 0,1,2 --loader cpu,device",
                 "(host)", "device=cpu workers=0 loader=cpu precision=bf16 engine=suite: FAILED"):
        assert text in markdown and text.replace('"', "&quot;") in page
    assert "BUSY" in markdown and markdown.count("| quiet |") == 5
    # the host RAM figures in one order everywhere, the one to compare by first, and what each is
    assert "| data-wait | host anon MiB | host PSS MiB | host RSS MiB | device peak MiB |" in markdown
    assert markdown.count("| 30% | 300 | 400 | 460 | 470 (host) |") == 6
    assert "Host RAM, peaks of the training process + its loader workers: anon = what they allocated" in markdown


def test_the_report_of_an_mlflow_run_is_the_report_of_its_folder(tmp_path, capfd):
    folder = _folder(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["upload", str(folder), "--tracking-uri", uri]) == 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    [parent] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  "tags.`suite.role` = 'matrix'")
    children = client.search_runs([parent.info.experiment_id], "tags.`suite.role` = 'configuration'")
    assert "workers=1 loader=device precision=fp32" in {r.info.run_name for r in children}  # named as suite run does
    capfd.readouterr()
    assert main(["report", parent.info.run_id, "--tracking-uri", uri, "--output", str(tmp_path / "r")]) == 0
    assert "Downloading artifacts" not in capfd.readouterr().err  # MLflow's bar, on every manifest (issue 29)
    from_mlflow_md = (tmp_path / "r" / "report.md").read_text()
    assert main(["report", str(folder), "--output", str(tmp_path / "f")]) == 0
    from_folder_md = (tmp_path / "f" / "report.md").read_text()
    table = lambda text: [line for line in text.splitlines() if line.startswith("| cpu |")]  # noqa: E731
    assert table(from_mlflow_md) == table(from_folder_md) and len(table(from_folder_md)) >= 6


def test_a_report_of_nothing_finished_or_no_folder_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope" / "x")]) == 2
    assert "no such results folder" in capsys.readouterr().err


# --- published figures lined up by what they compare ---------------------------------------------------------
def test_published_and_measured_ratios_share_a_row_and_missing_ones_say_why(tmp_path):
    _, data = load_reference("bridgetower_hf_blog_2023")
    rows = rows_from_results(ResultsStore(_folder(tmp_path)).results())
    alignment = align(reference_table(data), measured_table(rows))
    by_kind = {r.kind.label: r for r in alignment.ratios}
    two_vs_zero = by_kind["loader cpu: workers 2 vs 0"]
    [gaudi2] = [s for s in alignment.published_series if s.device == "gaudi2"]
    [cpu] = alignment.measured_series
    assert two_vs_zero.published[gaudi2] == pytest.approx(768.7 / 601.5)
    assert two_vs_zero.measured[cpu] == pytest.approx(61.0 / 40.0)
    decode = by_kind["workers 2: loader device vs cpu"]
    assert decode.published[gaudi2] == pytest.approx(847.7 / 768.7) and decode.measured[cpu] == pytest.approx(70 / 61)
    assert "loader=device workers=2" in decode.why[alignment.published_series[1]]  # h100 ran no device loader
    assert [s.device for s in alignment.published_series] == ["gaudi2", "h100", "a100"]  # the blog's order
    absolute, ratios = published_tables(alignment)
    assert ["cpu", "2", "768.7", "602.1", "345.4", "61.0"] in absolute.rows
    [line] = [r for r in ratios.rows if r[0] == "workers 1: loader device vs cpu"]
    assert line[-2] == f"{58 / 55:.2f}x" and "published: no run of loader=device workers=1" in line[-1]


def test_compare_reference_prints_both_sides_on_one_row(tmp_path, capsys):
    assert main(["compare", str(_folder(tmp_path)), "--reference", "bridgetower_hf_blog_2023",
                 "--output", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "published and measured samples/s" in out and "ratios, published and measured on one row" in out
    [line] = [line for line in out.splitlines() if "loader cpu: workers 2 vs 0" in line]
    assert "1.28x" in line and "1.52x" in line  # gaudi2 published, cpu measured


# --- one spelling, MLflow names ------------------------------------------------------------------------------
def test_run_names_name_the_axes_that_vary():
    configs = [dataclasses.replace(BASE, num_workers=w, loader=l, precision=p)
               for w in (0, 2) for l in ("cpu", "cpu-fast") for p in ("fp32",)]
    labels = short_labels(configs)
    assert labels[configs[-1].config_id] == "workers=2 loader=cpu-fast"
    assert short_labels([BASE]) == {BASE.config_id: BASE.describe()}
    twins = [BASE, dataclasses.replace(BASE, dataset="synthetic:64")]  # differ off the named axes
    named = short_labels(twins)
    assert len(set(named.values())) == 2 and all("#" in v for v in named.values())


def test_metric_names_group_for_mlflow_and_read_back():
    names = list(_metrics(10.0)) + ["loss", "measured_steps", "skipped_samples", "steps_to_target"]
    for name in names:
        assert suite_name(mlflow_name(name)) == name
    assert mlflow_name("throughput_samples_per_s") == "throughput/throughput_samples_per_s"
    assert mlflow_name("host_ram_peak_pss_bytes") == "memory/host_ram_peak_pss_bytes"
    assert suite_name("system/cpu_utilization_percentage") == "system/cpu_utilization_percentage"
    assert suite_name("throughput_samples_per_s") == "throughput_samples_per_s"  # runs recorded before grouping
    logged = dict((k, v) for k, v, _, _ in mlflow_metrics([("device_peak_memory_bytes", 3 * MiB, 0, 0)]))
    assert logged == {"memory/device_peak_memory_bytes": 3 * MiB, "memory/device_peak_memory_mib": 3.0}
    assert suite_metrics(logged) == {"device_peak_memory_bytes": 3 * MiB}


# --- dry run, progress -----------------------------------------------------------------------------------------
def test_dry_run_lists_the_matrix_and_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert main(["run", "--workers", "0,1", "--loader", "cpu,device", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert sorted(tmp_path.rglob("*")) == before  # no mlflow.db, no results folder, no lock file
    lines = [line for line in out.splitlines() if "bridgetower-tiny-cpu-" in line]
    assert len(lines) == 4 and all(line.rstrip().endswith("unknown") for line in lines)
    assert "device=cpu workers=1 loader=device precision=fp32 engine=suite" in out
    assert "(not there yet: suite run creates it)" in out and "estimated duration: unknown" in out


def test_the_progress_eta_comes_from_timed_steps_and_finished_configurations(monkeypatch):
    from suite.cli import display
    from suite.run.estimate import estimate

    clock = [100.0]
    monkeypatch.setattr(display.time, "monotonic", lambda: clock[0])
    configs = [dataclasses.replace(BASE, num_workers=w) for w in (0, 1, 2)]
    timing = display.Timing(3, estimate(configs, {configs[0].config_id: [30.0, 50.0]}))
    timing.start(configs[0])
    assert timing.matrix_eta_s() == pytest.approx(40.0 + 2 * 40.0)  # history only: median 40 s per configuration
    for step in range(1, 6):
        timing.on_step(step, 20)
        clock[0] += 0.5
    assert timing.step_time_s == pytest.approx(0.5) and timing.config_eta_s() == pytest.approx(7.5)
    assert "16.0 samples/s" in timing.step_text(1.0) and "ETA 8 s" in timing.step_text(1.0)
    clock[0] = 130.0
    timing.end()  # the first took 30 s: the typical configuration now
    timing.start(configs[1])
    assert timing.matrix_eta_s() == pytest.approx(30.0 + 30.0)


def test_mlflow_info_lines_stay_out_of_the_progress_display(capsys):
    import mlflow  # noqa: F401 - configures its own stderr handler, as in a run

    from suite.cli.display import RichProgress

    progress = RichProgress(1)
    buffer = io.StringIO()
    progress.console.file = buffer
    with progress:
        logging.getLogger("mlflow.system_metrics.system_metrics_monitor").info("Started monitoring system metrics.")
        logging.getLogger("mlflow.store.db.utils").warning("the store is slow")
    captured = capsys.readouterr()
    assert "Started monitoring" not in captured.err + captured.out + buffer.getvalue()
    assert "the store is slow" in buffer.getvalue()  # a warning still shows, through the display
    assert logging.getLogger("mlflow").handlers and logging.getLogger("mlflow").handlers[0].__class__.__name__ != \
        "RichHandler"  # put back afterwards


def test_reasons_with_brackets_are_shown_as_they_are(capsys):
    """gloo's reasons carry "[.../pair.cc:553]", which rich would read as a closing markup tag."""
    from suite.cli.tables import print_results_table

    reason = "RuntimeError: [/__w/pytorch/third_party/gloo/transport/tcp/pair.cc:553] Connection closed by peer"
    print_results_table([RunResult(config=BASE, status=FAILED, reason=reason)])
    shown = "".join(capsys.readouterr().out.replace("│", "").split())  # the cell folds over lines
    assert "".join(reason.split()) in shown


def test_a_run_recorded_before_the_anonymous_figure_shows_a_dash_and_no_bar(tmp_path, monkeypatch):
    """Folders from before ``host_ram_peak_pss_anon_bytes``: the figure is missing, never drawn or shown as 0."""
    store = ResultsStore.create(tmp_path / "out", MatrixInfo(name="m", workload="bridgetower", command=["suite"]))
    metrics = {k: v for k, v in _metrics(50.0).items() if k != "host_ram_peak_pss_anon_bytes"}
    store.record(RunResult(config=BASE, status=FINISHED, run_uid="old", metrics=metrics,  # and from before the flag
                           facts={"device_peak_memory_source": "VmHWM of the training process (host memory)"}))
    store.finish(FINISHED, "")
    store.release()
    files = write_report(from_folder(tmp_path / "out", "bridgetower_hf_blog_2023"), tmp_path / "report")
    assert "| 30% | - | 400 | 460 | 470 (host) |" in files.markdown.read_text()
    import matplotlib

    matplotlib.use("Agg")
    from suite.report.charts import memory_bars

    captured = {}
    real_bar = matplotlib.axes.Axes.bar

    def bar(self, x, height, *args, **kwargs):
        captured.setdefault(kwargs.get("label"), list(height))
        return real_bar(self, x, height, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", bar)
    memory_bars(from_folder(tmp_path / "out", "bridgetower_hf_blog_2023").rows, lambda r: r.config.device)
    anon = next(v for k, v in captured.items() if k and k.startswith("anon"))
    assert len(anon) == 1 and anon[0] != anon[0]  # NaN: no bar, not a bar of 0 MiB


@pytest.mark.parametrize("width", [200, 60])
def test_the_results_table_shows_the_host_ram_figures_anon_first_and_says_what_they_are(width, monkeypatch, capsys):
    """Wide: columns; narrow: a block per run. Either way anon, PSS, RSS in that order, and the note."""
    from suite.cli import tables

    monkeypatch.setattr(tables, "narrow", lambda: width < 100)
    tables.print_results_table([RunResult(config=BASE, status=FINISHED, metrics=_metrics(50.0))])
    out = capsys.readouterr().out
    flat = " ".join(out.replace("│", " ").replace("┃", " ").split())
    if width < 100:
        assert "host anon 300 MiB, host PSS 400 MiB, host RSS 460 MiB" in flat
    else:
        assert "anon/PSS/RSS" in flat and " 300/400/460 " in flat  # the header wraps over two lines
    assert "anon = what they allocated (the anonymous part of PSS; compare configurations by it)" in flat


def test_the_headline_calls_a_speed_up_only_when_the_intervals_separate(tmp_path):
    """Issue 26: "Best ... 1.03x over workers=0" was printed inside overlapping intervals."""
    store = ResultsStore.create(tmp_path / "out", MatrixInfo(name="m", workload="bridgetower", command=["suite"]))
    for workers, throughput in ((0, 40.0), (2, 41.2)):
        config = dataclasses.replace(BASE, num_workers=workers)
        store.record(RunResult(config=config, status=FINISHED, run_uid=f"w{workers}",
                               metrics=_metrics(throughput)))
    store.finish(FINISHED, None)
    store.release()
    headline = from_folder(tmp_path / "out", None).headline()
    assert "no significant difference from workers=0 loader=cpu" in headline and "1.03x" in headline
    assert "x over workers=0" not in headline


HOSTILE = "<img src=x onerror=console.log(1)>"


def _browser_dom_of_markdown(tmp_path, text, name):
    """``text`` rendered by a Markdown renderer (Python-Markdown, raw HTML allowed as CommonMark allows it) and laid
    out by Chromium: the DOM a reader's viewer would show."""
    import markdown

    page = tmp_path / f"{name}.html"
    page.write_text("<!doctype html><html><body>" + markdown.markdown(text, extensions=["tables", "fenced_code"])
                    + "</body></html>")
    return rendered_dom(page)


def test_hostile_names_stay_text_in_every_markdown_sink_in_a_real_browser(tmp_path):
    """Issue 27, point 2: report.md and the MLflow run description carried raw HTML from file names and dataset
    paths; through a Markdown renderer, <img src=x onerror=...> ran in Chromium. Every Markdown sink now writes
    data as literal text: the DOM holds no such element, and the name reads as it is."""
    _chromium_or_skip()
    from suite.tracking.mlflow_recorder import _run_note

    folder = _folder(tmp_path)
    store = ResultsStore.reopen(folder)
    failed = RunResult(config=dataclasses.replace(BASE, loader="cpu-fast"), status=FAILED,
                       reason=f"cannot decode image /data/{HOSTILE}.jpg: truncated", run_uid="hostile")
    store.record(failed)
    store.release()
    content = from_folder(folder, None)
    files = write_report(content, tmp_path / "report")
    sinks = {"report.md": files.markdown.read_text(),
             "mlflow run description": _run_note(failed.config, failed)}
    for name, text in sinks.items():
        dom = _browser_dom_of_markdown(tmp_path, text, name.replace(" ", "-"))
        assert not re.search(r"<img[^>]*src=\"?x", dom) and not re.search(r"<body[^>]*data-pwned", dom), name
        assert "&lt;img src=x onerror=" in dom, name  # shown as the text it is
    page_dom = rendered_dom(files.html)  # the HTML report, escaped since it exists
    assert not re.search(r"<body[^>]*data-pwned", page_dom) and "&lt;img src=x onerror=" in page_dom


def test_runs_that_read_different_data_are_flagged_in_compare_and_the_report(tmp_path, capsys):
    """Issue 27, point 12: a dataset file replaced mid-matrix gave configurations different dataset fingerprints and
    neither run, compare nor the report said so."""
    from suite.results.record import dataset_warning, differing_datasets

    store = ResultsStore.create(tmp_path / "out", MatrixInfo(name="m", workload="bridgetower", command=["suite"]))
    results = []
    for workers, fingerprint in ((0, {"sha256": "a" * 64}), (2, {"sha256": "b" * 64})):
        result = RunResult(config=dataclasses.replace(BASE, num_workers=workers), status=FINISHED,
                           run_uid=f"w{workers}", metrics=_metrics(40.0 + workers),
                           facts={"workload": {"dataset_fingerprint": fingerprint}})
        store.record(result)
        results.append(result)
    store.finish(FINISHED, None)
    store.release()
    groups = differing_datasets(results)
    assert len(groups) == 2 and sorted(len(v) for v in groups.values()) == [1, 1]
    assert differing_datasets(results[:1]) == {}
    warning = dataset_warning(groups)
    assert warning.startswith("the dataset changed during the matrix: 1 run(s) read dataset ")
    assert main(["compare", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 0
    assert "suite: warning: the dataset changed during the matrix" in capsys.readouterr().err
    content = from_folder(tmp_path / "out", None)
    files = write_report(content, tmp_path / "report")
    assert "the dataset changed during the matrix" in files.markdown.read_text()


def test_the_report_says_what_was_measured_and_when_quality_is_at_chance_level(tmp_path):
    """Issue 29, point 6: the measured shape beside the published one, a word on eval_accuracy at chance level,
    fingerprints as text, ticks that say the worker count (and the loader where two share one), labels above the
    intervals."""
    from suite.report.charts import Bar, grouped_bars, worker_ticks
    from suite.report.content import fingerprint_text, from_folder
    from suite.report.render import chance_note, measured_shape

    content = from_folder(_folder(tmp_path), "bridgetower_hf_blog_2023")
    rows = content.rows
    assert measured_shape(rows) == "Measured here: preset tiny, batch 8 per device, 1 device(s) per configuration."
    assert chance_note(rows) == []  # no eval_samples recorded: no claim about chance
    near_chance = [dataclasses.replace(r, metrics={**r.metrics, "eval_samples": 51.0, "eval_accuracy": 0.0196})
                   for r in rows]
    [note] = chance_note(near_chance)
    assert "chance level (1/N = 0.020" in note
    trained = [dataclasses.replace(r, metrics={**r.metrics, "eval_samples": 51.0, "eval_accuracy": 0.3}) for r in rows]
    assert chance_note(trained) == []
    assert fingerprint_text({"method": "sha256 of files", "sha256": "ab12", "skipped": None}) == \
        "method sha256 of files, sha256 ab12"
    both = [Bar("gaudi2", "cpu", 0, 8.0), Bar("gaudi2", "cpu", 2, 10.0, 9.0, 14.0), Bar("gaudi2", "device", 2, 12.0)]
    assert worker_ticks(both) == ["0\ncpu", "2\ncpu", "2\ndevice"]
    assert worker_ticks(both[:2]) == ["0", "2"]
    assert grouped_bars("t", "t", both, "samples/s").png  # drawn


def test_the_device_memory_caption_follows_the_record_never_the_device_name(tmp_path, recorded_matrix):
    """Issue 48 (5): nothing above the devices names a device to caption its memory column; the record says whether
    the device has memory of its own. A real CPU run records that it has not, in the folder and in MLflow; a record
    of a device named "cpu" that says otherwise gets no caption, one named "cuda" that says so gets it."""
    from suite.analysis.compare import rows_from_results
    from suite.results.files import read_results_file
    from suite.tracking.mlflow_gateway import MlflowGateway
    from suite.tracking.reading import rows_from_mlflow

    recorded = read_results_file(recorded_matrix / "results.json")
    assert recorded and all(r.facts["device_peak_memory_is_host"] is True for r in recorded)
    assert all(row.device_memory_is_host for row in rows_from_results(recorded))
    gateway = MlflowGateway(f"sqlite:///{recorded_matrix.parent}/mlflow.db")
    assert all(row.device_memory_is_host for row in rows_from_mlflow(gateway))
    for device, is_host, caption in (("cpu", False, False), ("cuda", True, True)):
        out = tmp_path / device
        store = ResultsStore.create(out, MatrixInfo(name="m", workload="bridgetower", command=["suite"]))
        store.record(RunResult(config=dataclasses.replace(BASE, device=device), status=FINISHED, run_uid=device,
                               metrics=_metrics(50.0), facts={"device_peak_memory_is_host": is_host}))
        store.finish(FINISHED, "")
        store.release()
        markdown = write_report(from_folder(out, None), tmp_path / f"report-{device}").markdown.read_text()
        assert ("470 (host) |" in markdown) is caption
        assert ("no memory of its own" in markdown) is caption
