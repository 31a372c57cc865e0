"""The CLI attacked: every bad option, file and output path gets one line and exit code 2.

Most cases run in-process through ``main([...])`` (fast); what needs a fresh interpreter
(imports, logging, the persistent compilation cache) runs in a subprocess and is marked slow.
"""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxwise.cli import main
from jaxwise.data import make_blobs

TRAINING = ("spiral", "train", "label-errors")


def run(args, capsys):
    extra = (
        ["--no-progress", "--no-cache"]
        if args[0] in TRAINING
        else (["--no-cache"] if args[0] == "predict" else [])
    )
    code = main([*args, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(code, err, *fragments, exit_code=2):
    assert code == exit_code, err
    assert err.count("\n") == 1 and err.startswith("jaxwise: error: ") and "Traceback" not in err, (
        err
    )
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def write_csv(path, x, labels, names=None, label_name="kind"):
    names = names or [f"f{i}" for i in range(x.shape[1])]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*names, label_name])
        for row, label in zip(x, labels):
            writer.writerow([f"{v:.6g}" for v in row] + [label])
    return path


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def small_csv(tmp_path):
    x, y = make_blobs(150, 3, 3, seed=0)
    return write_csv(tmp_path / "small.csv", x, [["ant", "bee", "cat"][i] for i in y])


# ---------------------------------------------------------------------------
# Options: checked before any work, messages name the option
# ---------------------------------------------------------------------------

BAD_OPTIONS = [
    (["--lr", "nan"], "--lr must be finite"),
    (["--lr", "inf"], "--lr must be finite"),
    (["--lr", "0"], "--lr must be > 0.0"),
    (["--lr", "-1"], "--lr must be > 0.0"),
    (["--lr", "1e9"], "--lr must be <= 10.0"),
    (["--dp", "--clip-norm", "0"], "--clip-norm must be > 0.0"),
    (["--dp", "--clip-norm", "inf"], "--clip-norm must be finite"),
    (["--dp", "--noise-multiplier", "-1"], "--noise-multiplier must be >= 0.0"),
    (["--dp", "--noise-multiplier", "nan"], "--noise-multiplier must be finite"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--seed", str(2**32)], "--seed must be <= 4294967295"),
    (["--val-fraction", "0.95"], "--val-fraction must be < 0.9"),
    (["--val-fraction", "nan"], "--val-fraction must be finite"),
    (["--hidden", "100000,100000"], "--hidden 100000,100000: the model has 1e+10 parameters"),
    (["--stop-after", "99"], "--stop-after must be <= 50"),
]


@pytest.mark.parametrize("extra, message", BAD_OPTIONS)
def test_bad_train_option_is_one_line_naming_the_option(
    tmp_path, small_csv, capsys, extra, message
):
    out = tmp_path / "run"
    code, _, err = run(
        ["train", str(small_csv), "--label", "kind", "--out", str(out), *extra], capsys
    )
    assert_one_line(code, err, message)
    assert "alpha" not in err and "`" not in err
    assert not out.exists()  # refused before any work


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--noise", "nan"], "--noise must be finite"),
        (["--noise", "20"], "--noise must be < 10.0"),
        (["--dp", "--clip-norm", "nan"], "--clip-norm must be finite"),
        (["--seed", "-3"], "--seed must be >= 0"),
    ],
)
def test_bad_spiral_option(tmp_path, capsys, extra, message):
    code, _, err = run(["spiral", "--epochs", "1", "--out", str(tmp_path / "s"), *extra], capsys)
    assert_one_line(code, err, message)


def test_huge_hidden_gives_the_memory_estimate(tmp_path, small_csv, capsys):
    code, _, err = run(
        [
            "train",
            str(small_csv),
            "--label",
            "kind",
            "--hidden",
            "100000,100000",
            "--out",
            str(tmp_path / "r"),
        ],
        capsys,
    )
    assert_one_line(code, err, "GB to train", "GB of memory is available", "smaller --hidden")


# ---------------------------------------------------------------------------
# Files: garbage is rejected when loaded
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, message",
    [
        (
            "a,b,kind\n1,2,x\n1e39,4,y\n3,4,x\n",
            "value '1e39' in data row 1 (line 3), column 'a' overflows float32",
        ),
        (
            "a,b,kind\n3e38,2,x\n3e38,4,y\n3e38,4,x\n",
            "column 'a' has values so large that their float32 mean overflows",
        ),
        ("a,b,kind\n1,2,x\n3,4,y\x07\n", "control character in label column 'kind'"),
        ("1,2,cat\n3,4,dog\n", "no header row"),
    ],
)
def test_garbage_files_are_rejected(tmp_path, capsys, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    code, _, err = run(
        ["train", str(path), "--label", "kind", "--out", str(tmp_path / "o")], capsys
    )
    assert_one_line(code, err, message)


# ---------------------------------------------------------------------------
# Outputs: nothing the user wrote is overwritten
# ---------------------------------------------------------------------------


def test_label_errors_out_is_checked_before_training(tmp_path, small_csv, capsys):
    run_dir = tmp_path / "le"
    suspects = tmp_path / "suspects.csv"
    suspects.write_text("precious\n")
    code, _, err = run(
        [
            "label-errors",
            str(small_csv),
            "--label",
            "kind",
            "--out",
            str(suspects),
            "--run-dir",
            str(run_dir),
        ],
        capsys,
    )
    assert_one_line(code, err, "--out", "exists; pass --force")
    assert suspects.read_text() == "precious\n" and not run_dir.exists()
    code, _, err = run(
        [
            "label-errors",
            str(small_csv),
            "--label",
            "kind",
            "--out",
            str(tmp_path),
            "--run-dir",
            str(run_dir),
        ],
        capsys,
    )
    assert_one_line(code, err, "is a directory")
    assert not run_dir.exists()


def test_label_errors_reruns_with_the_same_run_dir_and_force(tmp_path, small_csv, capsys):
    common = [
        "label-errors",
        str(small_csv),
        "--label",
        "kind",
        "--epochs",
        "2",
        "--method",
        "gradnorm",
        "--top",
        "5",
        "--run-dir",
        str(tmp_path / "le"),
        "--out",
        str(tmp_path / "s.csv"),
        "--json",
    ]
    code, out, err = run(common, capsys)
    assert code == 0, err
    first = json.loads(out)
    code, out, err = run([*common, "--force"], capsys)
    assert code == 0, err
    second = json.loads(out)
    assert first["suspects"] == second["suspects"]  # same seed, same rows
    assert len(read_rows(tmp_path / "s.csv")) == 5


def test_label_errors_default_method_is_out_of_fold(tmp_path, capsys):
    from jaxwise.data import flip_labels

    x, y = make_blobs(300, 4, 3, seed=1)
    noisy, flipped = flip_labels(y, 15, 3, seed=2)
    path = write_csv(tmp_path / "noisy.csv", x, [["ant", "bee", "cat"][i] for i in noisy])
    code, out, err = run(
        [
            "label-errors",
            str(path),
            "--label",
            "kind",
            "--epochs",
            "20",
            "--top",
            "15",
            "--out",
            str(tmp_path / "s.csv"),
            "--run-dir",
            str(tmp_path / "le"),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["method"] == "oof" and len(summary["suspects"]) == 15
    found = {r["row"] for r in summary["suspects"]}
    assert len(found & set(flipped.tolist())) >= 10  # precision@K of the out-of-fold ranking
    for r in summary["suspects"]:
        assert r["suggested_label"] != r["given_label"] and 0.0 <= r["p_given"] <= 1.0
    p_given = [r["p_given"] for r in summary["suspects"]]
    assert p_given == sorted(p_given)  # one score ranks them all
    # the whole job is reported: the out-of-fold phase apart from the final model
    assert summary["oof"]["compiles"] == 1 and summary["oof"]["seconds"] > 0
    assert summary["final_model"]["compiles"] == summary["compiles"] == 1
    assert summary["oof"]["loaded_from_cache"] == 0  # --no-cache


def test_label_errors_top_defaults_to_the_estimated_count(tmp_path, capsys):
    from jaxwise.data import flip_labels

    x, y = make_blobs(200, 3, 2, seed=4)
    noisy, _ = flip_labels(y, 12, 2, seed=1)
    path = write_csv(tmp_path / "noisy.csv", x, noisy.tolist())
    common = ["label-errors", str(path), "--label", "kind", "--epochs", "2", "--no-plots"]
    code, out, err = run(
        [*common, "--out", str(tmp_path / "s.csv"), "--run-dir", str(tmp_path / "le"), "--json"],
        capsys,
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["top"] == summary["num_issues"] == len(summary["suspects"]) > 0
    assert len(read_rows(tmp_path / "s.csv")) == summary["num_issues"]
    assert not (tmp_path / "le" / "loss.png").exists()  # --no-plots
    code, out, err = run(
        [*common, "--out", str(tmp_path / "g.csv"), "--run-dir", str(tmp_path / "g"), "--method"]
        + ["gradnorm", "--json"],
        capsys,
    )
    assert code == 0, err
    assert len(json.loads(out)["suspects"]) == 20 and "oof" not in json.loads(out)


def test_label_errors_rows_are_pandas_iloc_rows(tmp_path, capsys):
    """``row`` is the 0-based data row of the file as given: ``pandas.read_csv(...).iloc[row]``."""
    pd = pytest.importorskip("pandas")
    from jaxwise.data import flip_labels

    x, y = make_blobs(240, 3, 3, seed=6)
    noisy, flipped = flip_labels(y, 20, 3, seed=2)
    path = tmp_path / "gaps.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["a", "b", "c", "kind"])
        for i, (row, label) in enumerate(zip(x, noisy)):
            cells = [f"{v:.6g}" for v in row]
            if i % 17 == 3:
                cells[1] = ""  # a missing value: the row is dropped with --drop-na
            writer.writerow([*cells, ["ant", "bee", "cat"][label]])
    code, out, err = run(
        [
            "label-errors",
            str(path),
            "--label",
            "kind",
            "--drop-na",
            "--epochs",
            "2",
            "--no-plots",
            "--top",
            "25",
            "--out",
            str(tmp_path / "s.csv"),
            "--run-dir",
            str(tmp_path / "le"),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    frame = pd.read_csv(path)
    suspects = json.loads(out)["suspects"]
    assert len(suspects) == 25
    for suspect in suspects:
        row = frame.iloc[suspect["row"]]
        assert row["kind"] == suspect["given_label"] and not row.isna().any()
    hits = {s["row"] for s in suspects} & set(flipped.tolist())
    assert len(hits) >= 12  # the flipped rows, named by their row in the file


def test_train_refuses_to_overwrite_a_foreign_file_but_tolerates_others(
    tmp_path, small_csv, capsys
):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "loss.png").write_text("my own picture")
    code, _, err = run(
        ["train", str(small_csv), "--label", "kind", "--epochs", "1", "--out", str(out)], capsys
    )
    assert_one_line(code, err, "--out", "loss.png exists and was not written by jaxwise")
    assert (out / "loss.png").read_text() == "my own picture" and not (out / "checkpoint").exists()
    (out / "loss.png").unlink()
    code, out_text, err = run(
        ["train", str(small_csv), "--label", "kind", "--epochs", "1", "--out", str(out), "--json"],
        capsys,
    )
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "keep me" and (out / "loss.png").exists()


def test_resume_keeps_the_full_loss_plot(tmp_path, small_csv, capsys):
    out = tmp_path / "r"
    common = [
        "train",
        str(small_csv),
        "--label",
        "kind",
        "--epochs",
        "4",
        "--out",
        str(out),
        "--json",
    ]
    assert run([*common, "--stop-after", "2"], capsys)[0] == 0
    code, text, err = run([*common, "--resume"], capsys)
    assert code == 0, err
    summary = json.loads(text)
    assert "loss_plot" in summary["outputs"] and "curves_plot" in summary["outputs"]
    epochs = [
        json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()
    ]
    assert epochs == [1, 2, 3, 4]


def test_resume_without_the_history_leaves_the_plot_alone(tmp_path, small_csv, capsys):
    out = tmp_path / "r"
    common = [
        "train",
        str(small_csv),
        "--label",
        "kind",
        "--epochs",
        "4",
        "--out",
        str(out),
        "--json",
    ]
    assert run([*common, "--stop-after", "2"], capsys)[0] == 0
    before = (out / "loss.png").read_bytes()
    (out / "metrics.jsonl").unlink()  # the first half's history is gone
    code, text, err = run([*common, "--resume"], capsys)
    assert code == 0, err
    assert "loss_plot" not in json.loads(text)["outputs"]
    assert (out / "loss.png").read_bytes() == before  # never replaced by a partial plot


# ---------------------------------------------------------------------------
# Errors: anticipated → exit 2, unexpected → exit 1 with a --debug hint
# ---------------------------------------------------------------------------


def test_checkpoint_error_is_exit_2(tmp_path, small_csv, capsys, monkeypatch):
    from jaxwise.checkpoint import CheckpointError
    from jaxwise.cli import _jobs as jobs

    def broken(cfg):
        raise CheckpointError(
            "checkpoint step 3 in /x is corrupted: `params.w` fails its CRC32 check"
        )

    monkeypatch.setattr(jobs, "run_train", broken)
    code, _, err = run(["train", str(small_csv), "--label", "kind"], capsys)
    assert_one_line(code, err, "fails its CRC32 check")


def test_unexpected_error_is_one_line_with_debug_hint(small_csv, capsys, monkeypatch):
    from jaxwise.cli import _jobs as jobs

    def broken(cfg):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(jobs, "run_train", broken)
    code, _, err = run(["train", str(small_csv), "--label", "kind"], capsys)
    assert_one_line(
        code, err, "unexpected RuntimeError: boom second line", "run with --debug", exit_code=1
    )
    with pytest.raises(RuntimeError, match="boom"):
        main(["--debug", "train", str(small_csv), "--label", "kind"])
    with pytest.raises(RuntimeError, match="boom"):
        main(["train", str(small_csv), "--label", "kind", "--debug"])


def test_run_that_trained_nothing_exits_1(small_csv, capsys, monkeypatch):
    from jaxwise.cli import _jobs as jobs
    from jaxwise.cli._jobs._common import check_run_health

    with pytest.raises(jobs.RunFailed, match="every one of the 8 training steps was skipped"):
        check_run_health(0.5, 8, 8, "d.csv")
    with pytest.raises(jobs.RunFailed, match="final training loss is nan"):
        check_run_health(float("nan"), 1, 8, "d.csv")
    check_run_health(0.5, 7, 8, "d.csv")  # some steps trained: a result, with `skipped` reported

    def diverged(cfg):
        check_run_health(float("inf"), 2, 8, "small.csv")

    monkeypatch.setattr(jobs, "run_train", diverged)
    code, _, err = run(["train", str(small_csv), "--label", "kind"], capsys)
    assert_one_line(code, err, "final training loss is inf (2 of 8 steps skipped", exit_code=1)


# ---------------------------------------------------------------------------
# predict, early stopping, metrics, strict JSON
# ---------------------------------------------------------------------------


@pytest.fixture
def trained(tmp_path, small_csv, capsys):
    out = tmp_path / "run"
    code, text, err = run(
        [
            "train",
            str(small_csv),
            "--label",
            "kind",
            "--epochs",
            "30",
            "--early-stopping",
            "3",
            "--out",
            str(out),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    return out, json.loads(text)


def test_train_json_metrics_and_early_stopping(trained):
    out, summary = trained
    assert summary["schema"] == 1 and summary["val_accuracy"] == summary["test_accuracy"]
    assert summary["batch_size"] == 120  # min(128, training rows) for a 150-row file
    assert summary["skipped"] == 0 and summary["compiles"] == 1
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {
        "epoch",
        "loss",
        "accuracy",
        "val_loss",
        "val_accuracy",
        "lr",
        "skipped",
        "seconds",
    } <= set(records[0])
    assert len(records) == summary["epochs_completed"]
    val_losses = [r["val_loss"] for r in records]
    assert summary["best_epoch"] == int(np.argmin(val_losses)) + 1
    if summary["stopped_early"]:
        assert summary["epochs_completed"] - summary["best_epoch"] == 3
    assert (out / "best").is_dir() and (out / "curves.png").is_file()


def test_predict_round_trip(tmp_path, small_csv, trained, capsys):
    out, summary = trained
    with open(small_csv, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    order = np.random.default_rng(0).permutation(
        len(body)
    )  # the run's validation split (seed 0, 20%)
    val = sorted(order[:30].tolist())
    new = tmp_path / "val.csv"
    with open(new, "w", newline="") as f:
        csv.writer(f).writerows(
            [header[::-1], *[body[i][::-1] for i in val]]
        )  # columns in another order
    preds = tmp_path / "preds.csv"
    code, text, err = run(["predict", str(out), str(new), "--out", str(preds), "--json"], capsys)
    assert code == 0, err
    result = json.loads(text)
    assert result["accuracy"] == pytest.approx(summary["val_accuracy"])
    table = read_rows(preds)
    probs = np.asarray([[float(r[f"p_{c}"]) for c in ("ant", "bee", "cat")] for r in table])
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    assert [r["predicted_label"] for r in table] == [
        ("ant", "bee", "cat")[i] for i in probs.argmax(1)
    ]


def test_predict_errors(tmp_path, small_csv, trained, capsys):
    out, _ = trained
    cases = [
        ("f0,f1,kind\n1,2,ant\n", "missing feature column(s) 'f2'"),
        ("f0,f1,f2,extra\n1,2,3,4\n", "unexpected column(s) 'extra'"),
        ("f0,f1,f2,kind\n1,2,3,dog\n", "class(es) the run never saw: 'dog'"),
    ]
    for i, (content, message) in enumerate(cases):
        path = tmp_path / f"bad{i}.csv"
        path.write_text(content)
        code, _, err = run(
            ["predict", str(out), str(path), "--out", str(tmp_path / f"p{i}.csv")], capsys
        )
        assert_one_line(code, err, message)
    code, _, err = run(
        ["predict", str(tmp_path / "nowhere"), str(small_csv), "--out", str(tmp_path / "p.csv")],
        capsys,
    )
    assert_one_line(code, err, "RUN_DIR", "no such directory")
    (tmp_path / "taken.csv").write_text("x")
    code, _, err = run(
        ["predict", str(out), str(small_csv), "--out", str(tmp_path / "taken.csv")], capsys
    )
    assert_one_line(code, err, "exists; pass --force")


def test_strict_json_never_prints_nan():
    from jaxwise.cli._jobs._common import jsonable

    value = jsonable(
        {"a": float("nan"), "b": [np.float32("inf"), 1.5], "c": np.int64(3), "d": np.bool_(True)}
    )
    assert value == {"a": None, "b": [None, 1.5], "c": 3, "d": True}
    json.dumps(value, allow_nan=False)


def test_spiral_no_plots(tmp_path, capsys):
    out = tmp_path / "s"
    code, text, err = run(
        ["spiral", "--epochs", "1", "--no-plots", "--json", "--out", str(out)], capsys
    )
    assert code == 1, err  # one epoch is too short for the accuracy guarantee, reported honestly
    summary = json.loads(text)
    assert summary["outputs"] == {} and not out.exists()
    assert summary["checks"]["compiles_once"]["ok"]


def test_many_classes_stay_small(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n, k = 600, 300
    x = rng.normal(size=(n, 4))
    labels = [f"c{i % k}" for i in range(n)]
    path = write_csv(tmp_path / "many.csv", x, labels)
    code, text, err = run(
        [
            "train",
            str(path),
            "--label",
            "kind",
            "--epochs",
            "1",
            "--json",
            "--out",
            str(tmp_path / "m"),
        ],
        capsys,
    )
    assert code == 0, err
    summary = json.loads(text)
    assert len(summary["classes"]) == k
    import matplotlib.image

    image = matplotlib.image.imread(summary["outputs"]["confusion_plot"])
    assert max(image.shape[:2]) < 2000  # 20 classes drawn, not 300


def test_numeric_labels_are_one_class_per_value(tmp_path, capsys):
    x, y = make_blobs(150, 3, 2, seed=0)
    spelled = [("1" if i % 2 else "1.0") if label else "0" for i, label in enumerate(y)]
    path = write_csv(tmp_path / "num.csv", x, spelled)
    code, text, err = run(
        [
            "train",
            str(path),
            "--label",
            "kind",
            "--epochs",
            "1",
            "--json",
            "--out",
            str(tmp_path / "n"),
        ],
        capsys,
    )
    assert code == 0, err
    assert json.loads(text)["classes"] == ["0", "1"]


# ---------------------------------------------------------------------------
# A fresh interpreter: imports, quiet logs, the persistent compilation cache
# ---------------------------------------------------------------------------


def _python(code, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )


@pytest.mark.slow
def test_help_version_and_lint_do_not_import_jax(tmp_path):
    source = tmp_path / "ok.py"
    source.write_text("x = 1\n")
    refused = ["train", str(source), "--label", "y", "--hidden", "100000,100000"]  # refused at once
    for argv in (["--help"], ["--version"], ["lint", str(source)], ["train", "--help"], refused):
        proc = _python(
            "import sys\nfrom jaxwise.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print('JAX-IMPORTED' if 'jax' in sys.modules else 'NO-JAX', file=sys.stderr)"
        )
        assert proc.stderr.strip().endswith("NO-JAX"), (argv, proc.stderr[-2000:])


@pytest.mark.slow
def test_second_run_loads_from_the_cache_and_says_so(tmp_path):
    env = {"JAXWISE_CACHE_DIR": str(tmp_path / "cache")}
    code = (
        "import sys\nfrom jaxwise.cli import main\n"
        "sys.exit(main(['spiral', '--epochs', '1', '--no-plots', '--no-progress', '--json']))"
    )
    first, second = (_python(code, env) for _ in range(2))
    for proc in (first, second):
        assert proc.returncode == 1, proc.stderr[
            -2000:
        ]  # 1 epoch: the accuracy check fails, honestly
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert (a["compile"]["compiled"], a["compile"]["loaded_from_cache"]) == (1, 0)
    assert (b["compile"]["compiled"], b["compile"]["loaded_from_cache"]) == (0, 1)
    assert b["checks"]["compiles_once"]["ok"]
    assert "loaded from the compilation cache 1×" in b["checks"]["compiles_once"]["detail"]
    assert a["params_sha256"] == b["params_sha256"]  # the cached program computes the same thing
    off = _python(code.replace("'--json'", "'--json', '--no-cache'"), env)
    assert json.loads(off.stdout)["compile"]["cache_dir"] is None


@pytest.mark.slow
def test_no_third_party_log_lines(tmp_path, small_csv):
    code = (
        "import sys\nfrom jaxwise.cli import main\n"
        f"sys.exit(main(['train', {str(small_csv)!r}, '--label', 'kind', '--epochs', '2', "
        "'--no-progress', "
        f"'--json', '--out', {str(tmp_path / 'q')!r}]))"
    )
    env = {"JAXWISE_CACHE_DIR": str(tmp_path / "cache")}
    ok = _python(code, env)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr[-2000:]
    again = _python(code, env)  # refused: a checkpoint exists; still one line and nothing else
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr[-2000:]


@pytest.mark.slow
def test_bench_outside_a_checkout_says_so(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "jaxwise.cli", "bench", "--benchmarks", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "no bench_all.py there" in proc.stderr


def test_bench_never_writes_into_the_package(tmp_path, capsys):
    import jaxwise

    package = os.path.dirname(jaxwise.__file__)
    code = main(["bench", "--out", os.path.join(package, "results"), "--only", "none"])
    _, err = capsys.readouterr()
    assert_one_line(code, err, "inside the installed jaxwise package")


def test_bench_all_assembles_into_the_named_directory(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_all", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_all.py")
    )
    assert spec is not None and spec.loader is not None
    bench_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_all)
    name = bench_all.scripts()[0].stem.removeprefix("bench_")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / f"{name}.md").write_text("## a section\n")
    path = bench_all.assemble(tmp_path)
    assert path == tmp_path / "RESULTS.md" and "## a section" in path.read_text()


def test_compile_tally_tells_compiles_from_cache_loads(tmp_path):
    import jax
    import jax.numpy as jnp

    from jaxwise.cli._jobs import CompileTally, persistent_cache

    before = jax.config.jax_compilation_cache_dir
    x = jnp.arange(5.0)

    def tripled(v):
        return v * 3.0 + 1.0

    with persistent_cache(tmp_path / "cache"):
        fn = jax.jit(tripled)
        first, second, third = CompileTally(), CompileTally(), CompileTally()
        with first.measure():
            fn(x).block_until_ready()
        with second.measure():
            fn(x).block_until_ready()  # in memory: nothing to compile or load
        fn.clear_cache()  # pyright: ignore[reportAttributeAccessIssue]  # jit's wrapper has clear_cache at run time
        with third.measure():
            fn(x).block_until_ready()  # from the persistent cache on disk
    assert (first.compiled, first.loaded) == (1, 0) and first.describe("f") == "f compiled 1×"
    assert (second.compiled, second.loaded) == (0, 0)
    assert (third.compiled, third.loaded) == (0, 1)
    assert third.describe("f") == "f loaded from the compilation cache 1×"
    assert jax.config.jax_compilation_cache_dir == before  # settings restored after the block


def test_unwritable_cache_directory_runs_without_the_cache(tmp_path):
    from jaxwise.cli._jobs import persistent_cache

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with persistent_cache(blocker / "cache") as used:
        assert used is None
    with persistent_cache(tmp_path / "ok") as used:
        assert used is not None
        assert used == tmp_path / "ok" and used.is_dir()


def test_strict_json_on_a_run_with_non_finite_metrics(tmp_path, capsys):
    x, y = make_blobs(150, 3, 3, seed=0)
    x = x.astype(np.float64)
    val_row = int(
        np.sort(np.random.default_rng(0).permutation(150)[:30])[0]
    )  # in the validation split
    x[val_row] = (
        3e38  # finite in float32, but its logits overflow: the validation loss is not finite
    )
    path = write_csv(tmp_path / "wild.csv", x, [["ant", "bee", "cat"][i] for i in y])
    out = tmp_path / "run"
    code, text, err = run(
        [
            "train",
            str(path),
            "--label",
            "kind",
            "--epochs",
            "3",
            "--json",
            "--early-stopping",
            "2",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    assert "NaN" not in text and "Infinity" not in text
    summary = json.loads(text)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["val_loss"] is None for r in records)  # not finite: null, never NaN
    assert all(r["loss"] is not None for r in records)  # the training rows are fine
    assert summary["skipped"] == 0 and summary["best_epoch"] is None
