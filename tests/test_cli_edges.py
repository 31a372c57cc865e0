"""CLI edges: options without effect, and too few rows for a training/validation split."""

import csv

import numpy as np
import pytest

from jaxwise.cli import _parser_and_commands, build_parser, main
from jaxwise.cli._needs import without_effect


def run(args, capsys):
    code = main([*args, "--no-progress", "--no-cache", "--json"])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code, err, *fragments):
    assert code == 2 and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


def write(path, labels, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["a", "b", "kind"])
        for label in labels:
            writer.writerow([f"{rng.normal():.5f}", f"{rng.normal():.5f}", label])
    return path


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (["--clip-norm", "2"], "--clip-norm"),
        (["--clip", "2"], "--clip-norm"),  # an abbreviation argparse accepts
        (["--noise-multiplier=0.5"], "--noise-multiplier"),
    ],
)
@pytest.mark.parametrize("command", ["train", "label-errors", "spiral"])
def test_a_dp_option_without_dp_is_one_line_exit_2(tmp_path, capsys, extra, option, command):
    data = write(tmp_path / "d.csv", ["x", "y"] * 20)
    args = {
        "train": ["train", str(data), "--label", "kind", "--out", str(tmp_path / "run")],
        "label-errors": ["label-errors", str(data), "--label", "kind", "--out", "s.csv"],
        "spiral": ["spiral", "--out", str(tmp_path / "run")],
    }[command]
    code, _, err = run([*args, *extra], capsys)
    one_line(code, err, f"jaxwise {command}: error: {option} has no effect without --dp")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["spiral", "--noise", "0.3"],  # a prefix of --noise-multiplier, but its own option
        ["spiral", "--dp", "--clip-norm", "2", "--noise-multiplier", "0.5"],
        ["train", "d.csv", "--label", "k", "--dp", "--clip", "2"],
        ["lint", "x.py"],
    ],
)
def test_options_with_their_effect_are_accepted(argv):
    assert without_effect(build_parser().parse_args(argv), argv, _parser_and_commands) is None


def test_a_two_row_csv_is_refused_by_name(tmp_path, capsys):
    data = write(tmp_path / "two.csv", ["x", "y"])
    out = tmp_path / "run"
    code, _, err = run(["train", str(data), "--label", "kind", "--out", str(out)], capsys)
    one_line(code, err, "class 'x' of --label kind has 1 row (and 1 more such classes)")
    assert "each class needs at least 2 rows (training and validation)" in err


def test_a_class_with_one_row_is_refused_by_name(tmp_path, capsys):
    data = write(tmp_path / "rare.csv", ["x", "y"] * 30 + ["z"])
    args = ["--label", "kind", "--out", str(tmp_path / "le")]
    code, _, err = run(["label-errors", str(data), *args, "--run-dir", str(tmp_path / "r")], capsys)
    one_line(code, err, "class 'z' of --label kind has 1 row;")
    assert not (tmp_path / "r").exists()
