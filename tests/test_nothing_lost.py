"""Nothing lost, ever: run directories, rows, races, full disks and signals (issue #25).

Each test is one finding of the attack: the exact outcome (exit code, the one line) and the
files on disk before and after (byte-identical where nothing may change). Runs are tiny
(60 rows, one hidden layer of 8, a few epochs) and share a persistent compilation cache,
so each training run after the first loads its program instead of compiling it.
Concurrency tests start real processes and synchronise through FIFOs
(``$JAXWISE_TEST_HOLD_LOCKS``): no sleeping, no timing.
"""

import csv
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from jaxwise.cli import main
from jaxwise.data import make_blobs

FLAGS = ["--no-progress", "--hidden", "8"]


@pytest.fixture(autouse=True)
def shared_compilation_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("JAXWISE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "jax-cache"))


def write_csv(path, n=60, seed=0):
    x, y = make_blobs(n, 3, 3, seed=seed)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["f0", "f1", "f2", "kind"])
        for row, label in zip(x, y):
            writer.writerow([f"{v:.6g}" for v in row] + [["ant", "bee", "cat"][label]])
    return path


@pytest.fixture
def data(tmp_path):
    return write_csv(tmp_path / "data.csv")


def cli(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def train(data, out, capsys, *extra, epochs=2):
    return cli(
        ["train", str(data), "--label", "kind", "--epochs", str(epochs), "--out", str(out)]
        + FLAGS
        + ["--no-plots", "--json", *extra],
        capsys,
    )


def label_errors(data, run_dir, suspects, capsys, *extra):
    args = ["label-errors", str(data), "--label", "kind", "--epochs", "2", "--method", "gradnorm"]
    args += ["--top", "3", "--run-dir", str(run_dir), "--out", str(suspects), *FLAGS, "--json"]
    return cli([*args, *extra], capsys)


def one_line(code, err, *fragments, exit_code=2):
    assert code == exit_code, err
    assert err.count("\n") == 1 and err.startswith("jaxwise: error: "), err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def snapshot(root):
    """Every file under ``root`` (the lock file aside) with its bytes."""
    root = Path(root)
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".jaxwise-run.lock"
    }


def leftovers(root):
    return sorted(
        str(p.relative_to(root))
        for p in Path(root).rglob("*")
        if p.name.endswith(".tmp") or "orbax-checkpoint-tmp" in p.name or "jaxwise-lock" in p.name
    )


def marker(root):
    return json.loads((Path(root) / ".jaxwise-run.json").read_text())


def steps(directory):
    return sorted(int(p.name) for p in Path(directory).iterdir() if p.name.isdigit())


# ---------------------------------------------------------------------------
# Run directories are owned by one run of one job
# ---------------------------------------------------------------------------


def test_label_errors_refuses_a_train_run_and_force_starts_afresh(tmp_path, data, capsys):
    run = tmp_path / "run"
    assert train(data, run, capsys)[0] == 0
    (run / "notes.txt").write_text("mine")
    before = snapshot(run)
    code, _, err = label_errors(data, run, tmp_path / "s.csv", capsys)
    one_line(code, err, f"--run-dir {run} holds a `jaxwise train` run", "--force")
    assert snapshot(run) == before and not (tmp_path / "s.csv").exists()
    code, _, err = label_errors(data, run, tmp_path / "s.csv", capsys, "--force")
    assert code == 0, err
    assert marker(run)["job"] == "label-errors" and not (run / "checkpoint").exists()
    assert (run / "notes.txt").read_text() == "mine"  # not jaxwise's: kept
    epochs = [
        json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    assert epochs == [1, 2]  # the label-errors run's history only, never mixed


def test_train_refuses_another_configuration_unless_force(tmp_path, data, capsys):
    run = tmp_path / "run"
    assert train(data, run, capsys)[0] == 0
    before = snapshot(run)
    code, _, err = train(data, run, capsys, epochs=3)
    one_line(code, err, "holds a `jaxwise train` run with other settings (epochs 2, now 3)")
    assert snapshot(run) == before
    other = write_csv(tmp_path / "other.csv", seed=1)
    code, _, err = train(other, run, capsys)
    one_line(code, err, "holds a `jaxwise train` run with other data")
    assert snapshot(run) == before
    code, text, err = train(data, run, capsys, "--force", epochs=3)
    assert code == 0, err
    summary = json.loads(text)
    assert summary["resumed_from_epoch"] is None and summary["epochs_completed"] == 3
    assert [
        json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()
    ] == [
        1,
        2,
        3,
    ]
    assert marker(run)["run_id"] != json.loads(before[".jaxwise-run.json"])["run_id"]
    code, _, err = train(data, run, capsys, "--force", "--resume", epochs=3)
    one_line(code, err, "--resume continues the run in --out, --force starts it afresh")


def test_predict_and_spiral_refuse_a_label_errors_run(tmp_path, data, capsys):
    run = tmp_path / "le"
    assert label_errors(data, run, tmp_path / "s.csv", capsys)[0] == 0
    before = snapshot(run)
    code, _, err = cli(
        ["predict", str(run), str(data), "--out", str(tmp_path / "p.csv"), "--json"], capsys
    )
    one_line(code, err, "holds a `jaxwise label-errors` run, not a `jaxwise train` run")
    code, _, err = cli(["spiral", "--epochs", "1", "--out", str(run), "--no-progress"], capsys)
    one_line(code, err, "holds a `jaxwise label-errors` run; choose another --out")
    assert snapshot(run) == before and not (tmp_path / "p.csv").exists()


def test_label_errors_reruns_in_its_own_run_dir(tmp_path, data, capsys):
    run, suspects = tmp_path / "le", tmp_path / "s.csv"
    code, first, err = label_errors(data, run, suspects, capsys)
    assert code == 0, err
    code, _, err = label_errors(data, run, suspects, capsys)
    one_line(code, err, f"--out {suspects}: the file exists; pass --force")
    code, second, err = label_errors(data, run, suspects, capsys, "--force")
    assert code == 0, err
    assert json.loads(first)["suspects"] == json.loads(second)["suspects"]


# ---------------------------------------------------------------------------
# Checkpoints are tied to their run
# ---------------------------------------------------------------------------


def test_stray_and_foreign_steps_are_never_adopted(tmp_path, data, capsys):
    run, other = tmp_path / "run", tmp_path / "other"
    assert train(data, run, capsys, "--stop-after", "2", epochs=4)[0] == 0
    assert train(data, other, capsys, "--seed", "1", epochs=4)[0] == 0
    own = steps(run / "checkpoint")[-1]  # epoch 2's step (one is saved every epoch)
    foreign = steps(other / "checkpoint")[-1]  # another run's step 4: a higher number
    shutil.copytree(other / "checkpoint" / str(foreign), run / "checkpoint" / str(foreign))
    shutil.copytree(run / "checkpoint" / str(own), run / "checkpoint" / str(own + 1000))
    code, text, err = cli(
        ["predict", str(run), str(data), "--out", str(tmp_path / "p.csv"), "--json"], capsys
    )
    assert code == 0, err
    assert json.loads(text)["checkpoint_epoch"] == 2  # the epoch it really loaded: its own
    assert err.count("\n") == 1 and err.startswith("jaxwise: warning: skipped checkpoint")
    assert f"step {own + 1000} (its metadata says step {own}" in err
    assert f"step {foreign} (written by another run)" in err
    code, text, err = train(data, run, capsys, "--resume", epochs=4)
    assert code == 0, err
    assert json.loads(text)["resumed_from_epoch"] == 2 and "skipped checkpoint" in err
    assert (run / "checkpoint" / f"{foreign}.stray-0").is_dir()  # moved aside, not lost
    assert [
        json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()
    ] == [
        1,
        2,
        3,
        4,
    ]
    code, text, err = train(data, run, capsys, "--resume", epochs=4)  # a second --resume
    assert code == 0, err
    assert json.loads(text)["epochs_completed"] == 4


def test_a_crashed_runs_best_step_is_never_adopted(tmp_path, data, capsys):
    run = tmp_path / "run"
    early = ["--early-stopping", "9"]
    assert train(data, run, capsys, *early, "--stop-after", "5", epochs=6)[0] == 0
    shutil.rmtree(run / "checkpoint")  # it crashed before its last checkpoint
    crashed = steps(run / "best")[-1]
    code, text, err = train(data, run, capsys, *early, "--stop-after", "2", epochs=6)
    assert code == 0, err
    summary = json.loads(text)
    assert summary["best_epoch"] <= 2
    assert f"skipped checkpoint step {crashed} (written by another run)" in err
    code, text, err = cli(
        ["predict", str(run), str(data), "--out", str(tmp_path / "p.csv"), "--json"], capsys
    )
    assert code == 0, err
    assert json.loads(text)["checkpoint_epoch"] == summary["best_epoch"]


def test_a_run_of_an_older_jaxwise_still_resumes_and_predicts(tmp_path, data, capsys, monkeypatch):
    from jaxwise.cli._jobs._outputs import RunDir

    claim = RunDir.claim

    def without_run_id(self, *args, **kwargs):
        claim(self, *args, **kwargs)
        self.run_id = None  # an older jaxwise: its checkpoints carry no run id
        return self

    run = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(RunDir, "claim", without_run_id)
        assert train(data, run, capsys, "--stop-after", "1")[0] == 0
    legacy = {"job": "train", "files": marker(run)["files"]}
    (run / ".jaxwise-run.json").write_text(json.dumps(legacy))
    code, text, err = train(data, run, capsys, "--resume")
    assert code == 0 and err == "", err
    assert json.loads(text)["resumed_from_epoch"] == 1
    code, text, err = cli(
        ["predict", str(run), str(data), "--out", str(tmp_path / "p.csv"), "--json"], capsys
    )
    assert code == 0, err
    assert json.loads(text)["checkpoint_epoch"] == 2


def test_predict_on_damaged_metadata_says_damaged(tmp_path, data, capsys):
    run = tmp_path / "run"
    assert train(data, run, capsys, "--checkpoint-every", "2")[0] == 0  # one step: epoch 2's
    (step,) = steps(run / "checkpoint")
    meta = run / "checkpoint" / str(step) / "meta" / "metadata"
    meta.write_bytes(meta.read_bytes()[:40])  # truncated
    code, _, err = cli(["predict", str(run), str(data), "--out", str(tmp_path / "p.csv")], capsys)
    one_line(code, err, "the checkpoint is damaged", f"step {step} (its metadata is unreadable")
    code, _, err = train(data, run, capsys, "--resume")
    one_line(code, err, "--resume: no usable checkpoint in", "its metadata is unreadable")


def test_resume_with_a_non_utf8_metrics_file_is_one_line(tmp_path, data, capsys):
    run = tmp_path / "run"
    assert train(data, run, capsys, "--stop-after", "1")[0] == 0
    (run / "metrics.jsonl").write_bytes(b'{"epoch": 1}\n\xff\xfe garbage\n')
    before = snapshot(run)
    code, _, err = train(data, run, capsys, "--resume")
    one_line(code, err, f"{run / 'metrics.jsonl'} is not UTF-8 text (byte 13)")
    assert snapshot(run) == before


# ---------------------------------------------------------------------------
# Two processes, one directory: the second is refused at once and writes nothing
# ---------------------------------------------------------------------------


def _jaxwise(*args):
    return [sys.executable, "-m", "jaxwise.cli", *map(str, args)]


class Held:
    """A jaxwise process that stops, holding its locks, until released (FIFO handshake)."""

    def __init__(self, tmp_path, *args):
        self.dir = tmp_path / f"hold-{len(list(tmp_path.glob('hold-*')))}"
        self.dir.mkdir()
        os.mkfifo(self.dir / "held")
        os.mkfifo(self.dir / "release")
        env = dict(os.environ, JAXWISE_TEST_HOLD_LOCKS=str(self.dir))
        self.proc = subprocess.Popen(
            _jaxwise(*args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.pid = self._wait_until_held()

    def _wait_until_held(self):
        import select

        fd = os.open(self.dir / "held", os.O_RDONLY | os.O_NONBLOCK)
        try:
            text = b""
            while not text:
                if self.proc.poll() is not None:
                    out, err = self.proc.communicate()
                    raise AssertionError(f"ended before taking its locks: {err[-2000:]}")
                if select.select([fd], [], [], 1.0)[0]:
                    text = os.read(fd, 64)
            return int(text)
        finally:
            os.close(fd)

    def release(self):
        with open(self.dir / "release", "w") as fifo:
            fifo.write("go")
        out, err = self.proc.communicate(timeout=600)
        return self.proc.returncode, out, err


def refused(*args):
    proc = subprocess.run(_jaxwise(*args), capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stderr


@pytest.mark.slow
def test_a_second_process_on_a_run_directory_is_refused_at_once(tmp_path, data, capsys):
    run = tmp_path / "run"
    assert train(data, run, capsys, "--stop-after", "1")[0] == 0
    common = ["--label", "kind", "--epochs", "2", *FLAGS]
    held = Held(tmp_path, "train", data, *common, "--no-plots", "--out", run, "--resume")
    before = snapshot(run)
    holder = f"process {held.pid} on host {socket.gethostname()} (jaxwise train {data}"
    code, err = refused("train", data, *common, "--no-plots", "--out", run, "--resume")
    one_line(code, err, f"--out {run} is in use by {holder}")
    code, err = refused("predict", run, data, "--out", tmp_path / "p.csv")
    one_line(code, err, f"RUN_DIR {run} is in use by {holder}")
    code, err = refused(
        "label-errors", data, *common, "--run-dir", run, "--out", tmp_path / "s.csv"
    )
    one_line(code, err, f"--run-dir {run} is in use by {holder}")
    assert snapshot(run) == before and not (tmp_path / "p.csv").exists()
    code, out, err = held.release()
    assert code == 0 and err == "", err
    assert [
        json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()
    ] == [1, 2]
    assert leftovers(run) == []


@pytest.mark.slow
def test_two_label_errors_never_replace_each_others_output(tmp_path, data):
    suspects = tmp_path / "s.csv"
    common = ["--label", "kind", "--epochs", "2", "--method", "gradnorm", *FLAGS]
    held = Held(
        tmp_path, "label-errors", data, *common, "--run-dir", tmp_path / "a", "--out", suspects
    )
    code, err = refused(
        "label-errors", data, *common, "--run-dir", tmp_path / "b", "--out", suspects
    )
    one_line(code, err, f"--out {suspects} is being written by process {held.pid}")
    assert not (tmp_path / "b").exists() and not suspects.exists()
    code, out, err = held.release()
    assert code == 0, err
    assert suspects.is_file() and leftovers(tmp_path) == []


@pytest.mark.slow
def test_the_lock_of_a_killed_process_is_taken_over_with_one_line(tmp_path, data, capsys):
    run = tmp_path / "run"
    held = Held(
        tmp_path,
        "train",
        data,
        "--label",
        "kind",
        "--epochs",
        "2",
        *FLAGS,
        "--no-plots",
        "--out",
        run,
    )
    held.proc.send_signal(signal.SIGKILL)
    held.proc.communicate()
    code, text, err = train(data, run, capsys)
    assert code == 0, err
    host = socket.gethostname()
    assert err.count("\n") == 1
    assert err.startswith(
        f"jaxwise: warning: --out {run} was locked by process {held.pid} on host {host} "
        f"(jaxwise train {data} --label kind"
    )
    assert err.endswith("), which ended without releasing it; taking it over\n")


# ---------------------------------------------------------------------------
# A full disk anywhere: one line naming the path, nothing left behind, nothing lost
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A trained run (1 of 2 epochs, plots on) and its data, copied by each test that uses it."""
    root = tmp_path_factory.mktemp("base")
    data = write_csv(root / "data.csv")
    args = ["train", str(data), "--label", "kind", "--epochs", "2", "--stop-after", "1"]
    assert main([*args, *FLAGS, "--out", str(root / "run")]) == 0
    return root


@pytest.fixture
def run_copy(tmp_path, base_run, capsys):
    capsys.readouterr()
    shutil.copytree(base_run, tmp_path, dirs_exist_ok=True)
    return tmp_path / "data.csv", tmp_path / "run"


class _FullFile:
    """A file whose writes fail as on a full disk."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)


def fill_disk_for(monkeypatch, fragment):
    """Every file opened for writing whose name contains ``fragment`` hits a full disk."""
    import builtins
    import io

    original = io.open

    def faulty(file, mode="r", *args, **kwargs):
        f = original(file, mode, *args, **kwargs)
        writing = any(m in mode for m in "wax+")
        return _FullFile(f) if writing and fragment in os.fspath(file) else f

    monkeypatch.setattr(io, "open", faulty)
    monkeypatch.setattr(builtins, "open", faulty)


def fill_disk_for_checkpoints(monkeypatch):
    import orbax.checkpoint as ocp

    from jaxwise.checkpoint import _checkpointer, _safety

    # orbax's writer (the multi-process format) hits the full disk; the single-process format
    # meets a real one in test_a_real_full_disk_refuses_the_checkpoint_and_keeps_the_last
    monkeypatch.setattr(_checkpointer, "writes_natively", lambda: False)
    monkeypatch.setattr(_safety, "check_space", lambda target, needed: None)

    def save(self, directory, args):
        tmp = Path(f"{directory}.orbax-checkpoint-tmp") / "state.orbax-checkpoint-tmp"
        tmp.mkdir(parents=True)
        (tmp / "d").write_bytes(b"half a step")
        raise ValueError(f"RESOURCE_EXHAUSTED: writing \"{tmp}\": [os_error_code='28']")

    monkeypatch.setattr(ocp.Checkpointer, "save", save)


def full_disk_line(code, err, path):
    one_line(code, err, f"no space left on device writing {path}", "intact")


@pytest.mark.parametrize("target", ["metrics.jsonl", "loss.png", "checkpoint"])
def test_a_full_disk_during_training(run_copy, capsys, monkeypatch, target):
    data, run = run_copy
    before = snapshot(run)
    if target == "checkpoint":
        fill_disk_for_checkpoints(monkeypatch)
    else:
        fill_disk_for(monkeypatch, target)
    args = ["train", str(data), "--label", "kind", "--epochs", "2", "--resume", *FLAGS]
    code, _, err = cli([*args, "--out", str(run)], capsys)
    monkeypatch.undo()
    full_disk_line(code, err, run / target)
    assert leftovers(run) == []
    after = snapshot(run)
    kept = {k: v for k, v in before.items() if k.startswith("checkpoint/") or k == "loss.png"}
    assert {k: after.get(k) for k in kept} == kept  # the previous checkpoint, byte for byte
    if target == "metrics.jsonl":
        assert after == before
    if target == "checkpoint":  # epoch 2 trained and recorded; its checkpoint never written
        history = after.pop("metrics.jsonl")
        assert history.startswith(before.pop("metrics.jsonl")) and history.count(b"\n") == 2
        assert after == before
    code, text, err = cli([*args, "--out", str(run), "--json"], capsys)  # space again: it resumes
    assert code == 0, err
    assert json.loads(text)["epochs_completed"] == 2


@pytest.mark.parametrize("job", ["predict", "label-errors"])
def test_a_full_disk_writing_an_output_file(run_copy, capsys, monkeypatch, job):
    data, run = run_copy
    out = run.parent / "out.csv"
    fill_disk_for(monkeypatch, "out.csv")
    if job == "predict":
        code, _, err = cli(["predict", str(run), str(data), "--out", str(out)], capsys)
    else:
        code, _, err = label_errors(data, run.parent / "le", out, capsys)
    full_disk_line(code, err, out)
    assert not out.exists() and leftovers(run.parent) == []


@pytest.fixture
def small_disk(tmpfs):
    return tmpfs("4m")


def test_a_real_full_disk_refuses_the_checkpoint_and_keeps_the_last(small_disk, data, capsys):
    run = small_disk / "run"
    args = ["train", str(data), "--label", "kind", "--epochs", "2", *FLAGS, "--out", str(run)]
    assert cli([*args, "--stop-after", "1"], capsys)[0] == 0
    before = snapshot(run)
    stat = os.statvfs(small_disk)
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 16 * 1024))
    code, _, err = cli([*args, "--resume"], capsys)
    full_disk_line(code, err, run / "checkpoint")
    assert "(the checkpoint needs about" in err and leftovers(run) == []
    after = snapshot(run)
    kept = {k: v for k, v in before.items() if k.startswith("checkpoint/")}
    assert {k: after.get(k) for k in kept} == kept
    filler.unlink()
    code, text, err = cli([*args, "--resume", "--json"], capsys)
    assert code == 0, err
    assert [
        json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()
    ] == [1, 2]


# ---------------------------------------------------------------------------
# Signals during a checkpoint write: it completes, the CLI ends cleanly
# ---------------------------------------------------------------------------

SIGNAL_DURING_SAVE = textwrap.dedent(
    """
    import os, signal, sys
    import orbax.checkpoint as ocp
    from jaxwise.checkpoint import _checkpointer
    from jaxwise.cli import main
    _checkpointer.writes_natively = lambda: False  # the signal arrives inside orbax's write
    original = ocp.Checkpointer.save
    def save(self, *args, **kwargs):
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))  # in the middle of the write
        return original(self, *args, **kwargs)
    ocp.Checkpointer.save = save
    sys.exit(main(sys.argv[2:]))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, code, line", [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")]
)
def test_a_signal_during_a_checkpoint_write(tmp_path, data, name, code, line):
    from jaxwise.checkpoint import latest_step

    run = tmp_path / "run"
    args = ["train", data, "--label", "kind", "--epochs", "1", *FLAGS, "--no-plots", "--out", run]
    proc = subprocess.run(
        [sys.executable, "-c", SIGNAL_DURING_SAVE, name, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (proc.returncode, proc.stderr) == (code, f"jaxwise: {line}\n")
    assert latest_step(run / "checkpoint") is not None and leftovers(run) == []


# ---------------------------------------------------------------------------
# Every data row is accounted for: `row` is the file's own numbering (pandas .iloc)
# ---------------------------------------------------------------------------


def messy_csv(path):
    """90 examples; data row 20 has only delimiters, 41 is blank, 62 spans two lines."""
    x, y = make_blobs(90, 3, 3, seed=0)
    lines = ["f0,f1,f2,kind"]
    for i, (row, label) in enumerate(zip(x, y)):
        if i == 20:
            lines.append(",,,")
        if i == 40:
            lines.append("")
        cells = [f"{v:.6g}" for v in row]
        if i == 60:
            cells[1] = f'"{cells[1]}\n"'
        lines.append(",".join([*cells, ["ant", "bee", "cat"][label]]))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_row_of_delimiters_is_an_error_or_dropped_and_counted(tmp_path, capsys):
    data = messy_csv(tmp_path / "messy.csv")
    code, _, err = train(data, tmp_path / "run", capsys)
    one_line(code, err, "data row 20 (line 22) is empty (every cell is missing)", "--drop-na")
    assert not (tmp_path / "run").exists()
    code, text, err = train(data, tmp_path / "run", capsys, "--drop-na")
    assert code == 0, err
    summary = json.loads(text)
    assert (summary["rows"], summary["dropped_rows"], summary["blank_lines"]) == (90, 1, 1)
    assert summary["train_rows"] + summary["validation_rows"] == 90


def test_every_output_row_is_the_files_row(tmp_path, capsys):
    import pandas as pd

    data = messy_csv(tmp_path / "messy.csv")
    frame = pd.read_csv(data, skip_blank_lines=False)
    code, text, err = label_errors(
        data, tmp_path / "le", tmp_path / "s.csv", capsys, "--drop-na", "--top", "90"
    )
    assert code == 0, err
    suspects = json.loads(text)["suspects"]
    assert len(suspects) == 90
    assert all(frame.iloc[s["row"]]["kind"] == s["given_label"] for s in suspects)
    with open(tmp_path / "s.csv", newline="") as f:
        assert [int(r["row"]) for r in csv.DictReader(f)] == [s["row"] for s in suspects]
    run = tmp_path / "run"
    assert train(data, run, capsys, "--drop-na")[0] == 0
    code, text, err = cli(
        ["predict", str(run), str(data), "--out", str(tmp_path / "p.csv"), "--drop-na", "--json"],
        capsys,
    )
    assert code == 0, err
    with open(tmp_path / "p.csv", newline="") as f:
        rows = [int(r["row"]) for r in csv.DictReader(f)]
    complete = [i for i in range(len(frame)) if frame.iloc[i].notna().all()]
    assert rows == complete and 20 not in rows and 41 not in rows and 62 in rows
    summary = json.loads(text)
    assert (summary["rows"], summary["dropped_rows"], summary["blank_lines"]) == (90, 1, 1)


def test_a_symlink_loop_as_input_is_named(tmp_path, capsys):
    (tmp_path / "a.csv").symlink_to(tmp_path / "b.csv")
    (tmp_path / "b.csv").symlink_to(tmp_path / "a.csv")
    code, _, err = train(tmp_path / "a.csv", tmp_path / "run", capsys)
    one_line(code, err, "a.csv: a symlink loop")
    code, _, err = cli(
        ["predict", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--out", "p.csv"], capsys
    )
    one_line(code, err, "RUN_DIR", "a.csv: a symlink loop")


# ---------------------------------------------------------------------------
# DP padding never reads a real row
# ---------------------------------------------------------------------------


def test_a_nan_in_data_row_0_only_skips_the_dp_steps_that_sample_it():
    import jax
    import jax.numpy as jnp

    from jaxwise import optim
    from jaxwise.privacy import PoissonSampler, make_dp_train_epoch, poisson_batch
    from jaxwise.train import TrainState

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    y = (x @ np.asarray([1.0, -2.0, 0.5], np.float32)).astype(np.float32)
    x[0, 1] = np.nan  # data row 0: what the padding slots used to read

    def loss(params, example):
        return (example[0] @ params - example[1]) ** 2

    tx = optim.sgd(0.05)
    epoch = make_dp_train_epoch(loss, 8, clip_norm=5.0, noise_multiplier=0.5)
    state = TrainState.create(jnp.zeros(3), tx, jax.random.key(1))
    sampler = PoissonSampler(8)
    keys, _ = sampler.plan(state.key, state.step, 64)
    samples_row_0 = []
    for k in keys:
        idx, mask, _ = poisson_batch(k, 64, 8 / 64, sampler.width(64))
        assert (np.asarray(idx)[~np.asarray(mask)] == 64).all()  # padding: out of range
        samples_row_0.append(0 in np.asarray(idx)[np.asarray(mask)].tolist())
    new, metrics = epoch(state, (jnp.asarray(x), jnp.asarray(y)))
    skipped = np.asarray(metrics["skipped"]).astype(bool)
    assert any(samples_row_0) and not all(samples_row_0)
    np.testing.assert_array_equal(skipped, samples_row_0)  # before: every step skipped
    assert np.isfinite(np.asarray(new.params)).all() and np.abs(np.asarray(new.params)).sum() > 0
