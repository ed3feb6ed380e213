"""CLI validation: bad input is one clear line and exit status 2, before anything runs."""

import subprocess
import sys

import pytest

from suite.cli import build_parser, main

pytestmark = pytest.mark.mechanics


@pytest.mark.parametrize("argv,message", [
    (["run", "--workload", "nope"], "unknown workload 'nope'; valid workloads: bridgetower"),
    (["run", "--device", "tpu"], "unknown device 'tpu'; valid devices: a100, cpu, cuda, gaudi2, h100"),
    (["run", "--preset", "huge"], "unknown preset 'huge' for workload bridgetower; valid presets: tiny, small, large"),
    (["run", "--dataset", "/no/such/folder"], "dataset path does not exist: /no/such/folder"),
])
def test_unknown_names_fail_before_running(argv, message, capsys, tmp_path):
    assert main([*argv, "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"suite: error: {message}")
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


@pytest.mark.parametrize("argv,message", [
    (["run", "--workers", "0,-1"], "invalid worker counts in '0,-1': -1 is negative"),
    (["run", "--workers", "0,,2"], "expected a comma-separated list of worker counts"),
    (["run", "--steps", "0"], "must be >= 1, got 0"),
    (["run", "--batch-size", "-4"], "must be >= 1, got -4"),
    (["run", "--precision", "fp8"], "'fp8' is not one of fp32, bf16"),
    (["run", "--loader", "gpu"], "'gpu' is not one of cpu, cpu-fast, device, dali"),
])
def test_invalid_values_are_rejected_by_the_parser(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_run_help_explains_every_option():
    out = subprocess.run([sys.executable, "-m", "suite", "run", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for option in ("--workload", "--preset", "--device", "--workers", "--loader", "--precision", "--steps",
                   "--warmup-steps", "--dataset", "--output", "--tracking-uri", "--batch-size", "--seed", "--weights"):
        assert option in out


def test_list_shows_presets_and_devices(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "bridgetower/tiny (default): random-init" in out and "0.5M parameters, image 64, batch 8" in out
    assert "bridgetower/large: the published recipe" in out
    assert "cpu: available" in out


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("name,text,message", [
    ("m.json", '{"workers": [0, 1], "num_wrokers": 2}', "unknown field(s) num_wrokers; valid fields: "),
    ("m.json", '{"workers": "0,1"}', "workers must be a list of ints, got '0,1'"),
    ("m.json", '{"workers": [0, -1]}', "num_workers must be >= 0, got -1"),
    ("m.json", '{"steps": 0}', "steps must be >= 1, got 0"),
    ("m.json", '{"batch_size": -8}', "batch_size must be >= 1, got -8"),
    ("m.json", '{"repeats": 0}', "repeats must be from 1 to 1000, got 0"),
    ("m.toml", 'precisions = ["fp8"]', "precision must be one of fp32, bf16; got 'fp8'"),
    ("m.json", '{"workers": [0,', "cannot read config file"),
])
def test_config_file_errors_name_the_field(tmp_path, capsys, name, text, message):
    path = _write(tmp_path, name, text)
    assert main(["run", "--config", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_command_line_options_win_over_the_config_file(tmp_path):
    from suite.cli.measure import merge_config_file as _merge_config_file

    path = _write(tmp_path, "m.toml", 'workers = [0, 4]\nsteps = 7\nrepeats = 2\nseed = 3\n')
    argv = ["run", "--config", str(path), "--steps", "9"]
    args = _merge_config_file(build_parser().parse_args(argv), argv)
    assert (args.workers, args.steps, args.repeats, args.seed, args.loaders) == ([0, 4], 9, 2, 3, ("cpu",))


@pytest.mark.parametrize("rows,message", [
    ([], "lists no samples"),
    ([{"file_name": "a.jpg", "caption": "x"}], "no column 'image_description'; columns present: caption, file_name"),
])
def test_unusable_datasets_fail_before_any_configuration(tmp_path, capsys, rows, message):
    import json

    data = tmp_path / "data"
    data.mkdir()
    (data / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["run", "--dataset", str(data), "--output", str(tmp_path / "out"),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "out").exists()


def test_every_matrix_field_is_one_option_of_suite_run_under_its_own_name():
    """The command line's schema is the configuration's: each MatrixSpec field is set by exactly one `suite run`
    option whose destination is the field's name (spec_from_args takes them by name), and no option of the
    configuration is spelled otherwise."""
    import argparse
    import dataclasses

    from suite.config import MatrixSpec

    parser = build_parser()
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    dests = [a.dest for a in run._actions]
    fields = [f.name for f in dataclasses.fields(MatrixSpec)]
    assert {name: dests.count(name) for name in fields} == {name: 1 for name in fields}


def test_the_matrix_of_the_command_line_is_the_one_its_options_say(tmp_path):
    from suite.cli.matrix_run import spec_from_args

    argv = ["run", "--workers", "0,2", "--loader", "cpu,cpu-fast", "--steps", "4", "--seed", "7",
            "--max-caption-bytes", "100", "--timeout", "30", "--eval-every", "2"]
    spec = spec_from_args(build_parser().parse_args(argv))
    assert (spec.workers, spec.loaders, spec.steps, spec.seed, spec.max_caption_bytes, spec.timeout_s,
            spec.eval_every, spec.preset) == ((0, 2), ("cpu", "cpu-fast"), 4, 7, 100, 30.0, 2, "tiny")


def test_a_misspelt_option_is_refused_by_its_command_with_the_likely_one(capsys):
    """Issue 29, point 4: argparse's abbreviations are off (`--worker 0` is not `--workers 0`), and an unknown option
    gets the command's usage and the options spelled most alike."""
    for argv, hint in ((["run", "--wokers", "0"], "--wokers (did you mean --workers?)"),
                       (["run", "--worker", "0"], "--worker (did you mean --workers?)"),
                       (["compare", "--baselin", "x"], "--baselin (did you mean --baseline?)")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and hint in err and f"usage: suite {argv[0]}" in err
    with pytest.raises(SystemExit):
        main(["run", "--dataset-whatever", "x"])
    assert "unrecognized arguments: --dataset-whatever x" in capsys.readouterr().err  # no likely one: none named


def test_a_refusal_is_the_usage_line_and_the_error_and_help_is_plain_text(capsys):
    """Issue 51 (10): argparse's refusal of one bad value came after `suite run`'s 22-line usage block; help showed
    the help strings' Markdown backticks."""
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--workers", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 2, err
    assert err[0] == "usage: suite run [options]  (suite run --help: every option)"
    assert err[1].startswith("suite run: error: argument --workers")
    with pytest.raises(SystemExit) as exit_:
        main(["audit", "--bogus"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err[0].startswith("usage: suite audit [options] TARGET") and len(err) == 2
    for argv in (["--help"], ["run", "--help"], ["audit", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert "usage: suite" in out and "`" not in out
