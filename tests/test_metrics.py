"""Metric writers: each read back by its own tool's reader; resumes never duplicate a step."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from needs import needs

from jaxwise.metrics import JsonlWriter, MetricWriter, MLflowWriter, TensorBoardWriter

needs_mlflow = needs("mlflow")
needs_tensorboard = needs("tensorboardX", "tensorboard")


def tb_scalars(logdir):
    """``{tag: [(step, value), ...]}`` through TensorBoard's own reader (what its UI shows)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def mlflow_history(writer, key):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=writer.tracking_uri)
    return [(m.step, m.value) for m in client.get_metric_history(writer.run_id, key)]


def jsonl(path, key="step"):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: JsonlWriter(p / "m.jsonl"), id="jsonl"),
        pytest.param(
            lambda p: TensorBoardWriter(p / "tb"), id="tensorboard", marks=needs_tensorboard
        ),
        pytest.param(
            lambda p: MLflowWriter(p / "mlruns", run_name="a"), id="mlflow", marks=needs_mlflow
        ),
    ],
)
def test_writers_are_metric_writers(tmp_path, make):
    w = make(tmp_path)
    assert isinstance(w, MetricWriter)
    w.close()


def test_jsonl_format_and_nonfinite(tmp_path):
    path = tmp_path / "sub" / "metrics.jsonl"
    with JsonlWriter(path, step_key="epoch") as w:
        w.write(1, {"loss": 0.25, "acc": np.float32(0.5)})  # pyright: ignore[reportArgumentType]  # NumPy scalars are accepted
        w.write(2, {"loss": float("nan")})
    assert jsonl(path) == [{"epoch": 1, "loss": 0.25, "acc": 0.5}, {"epoch": 2, "loss": None}]


def test_jsonl_resume_rewrites_to_the_restored_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with JsonlWriter(path) as w:
        for s in range(1, 8):
            w.write(s, {"loss": float(s)})
    with path.open("a") as f:
        f.write('{"step": 8, "lo')  # a line cut by a kill
    with JsonlWriter(path) as w:  # resumed from a checkpoint at step 4
        for s in range(5, 10):
            w.write(s, {"loss": 10.0 * s})
    steps = [(r["step"], r["loss"]) for r in jsonl(path)]
    assert steps == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)] + [(s, 10.0 * s) for s in range(5, 10)]


KILLED_WRITER = """
import os, signal, sys
from jaxwise.metrics import {cls}
w = {cls}(sys.argv[1])
for s in range(1, 8):
    w.write(s, {{"loss": float(s), "acc": 0.5}})
w.flush()  # on disk now: a kill after this loses nothing
os.kill(os.getpid(), signal.SIGKILL)  # never closed: its lock dies with it
"""


def killed_writer(cls, target):
    """Steps 1..7 written (and flushed) by a ``cls`` in a process then SIGKILLed."""
    code = KILLED_WRITER.format(cls=cls)
    done = subprocess.run([sys.executable, "-c", code, str(target)], check=False, timeout=120)
    assert done.returncode == -signal.SIGKILL


@needs_tensorboard
def test_tensorboard_read_back_and_resume_purges(tmp_path):
    killed_writer("TensorBoardWriter", tmp_path)
    assert tb_scalars(tmp_path)["loss"] == [(s, float(s)) for s in range(1, 8)]
    with TensorBoardWriter(tmp_path) as w2:  # resumed at step 5 after the kill
        for s in range(5, 10):
            w2.write(s, {"loss": 10.0 * s})
    got = tb_scalars(tmp_path)
    assert got["loss"] == [(s, float(s)) for s in range(1, 5)] + [
        (s, 10.0 * s) for s in range(5, 10)
    ]
    assert got["acc"] == [(s, 0.5) for s in range(1, 5)]  # the killed run's later ones purged


@needs_mlflow
def test_mlflow_read_back_and_resume_keeps_the_run(tmp_path):
    w = MLflowWriter(tmp_path / "mlruns", run_name="run-1", params={"lr": 0.1})
    for s in range(1, 6):
        w.write(s, {"loss": float(s)})
    w.flush()
    w2 = MLflowWriter(tmp_path / "mlruns", run_name="run-1")
    assert w2.run_id == w.run_id
    for s in range(3, 9):  # 3..5 already in the run: skipped
        w2.write(s, {"loss": 10.0 * s})
    w2.close()
    assert mlflow_history(w2, "loss") == [(s, float(s)) for s in range(1, 6)] + [
        (s, 10.0 * s) for s in range(6, 9)
    ]
    other = MLflowWriter(tmp_path / "mlruns", run_name="run-2")
    assert other.run_id != w.run_id
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=w.tracking_uri).get_run(w.run_id)
    assert run.data.params == {"lr": "0.1"}
    other.close()


@pytest.mark.parametrize(
    "step, scalars, error, match",
    [
        (-1, {"loss": 1.0}, TypeError, "`step` must be an int >= 0"),
        (1.5, {"loss": 1.0}, TypeError, "`step` must be an int >= 0"),
        (True, {"loss": 1.0}, TypeError, "`step`"),
        (1, [("loss", 1.0)], TypeError, "`scalars` must be a mapping"),
        (1, {"loss": "high"}, TypeError, r"`scalars\['loss'\]` must be a real number"),
        (1, {3: 1.0}, TypeError, "keys must be non-empty strings"),
    ],
)
@pytest.mark.parametrize(
    "kind",
    [
        "jsonl",
        pytest.param("tensorboard", marks=needs_tensorboard),
        pytest.param("mlflow", marks=needs_mlflow),
    ],
)
def test_bad_scalars(tmp_path, kind, step, scalars, error, match):
    w = {
        "jsonl": lambda: JsonlWriter(tmp_path / "m.jsonl"),
        "tensorboard": lambda: TensorBoardWriter(tmp_path / "tb"),
        "mlflow": lambda: MLflowWriter(tmp_path / "ml", run_name="x"),
    }[kind]()
    with pytest.raises(error, match=match):
        w.write(step, scalars)
    w.close()
    with pytest.raises(ValueError, match="is closed"):
        w.write(1, {"loss": 1.0})


def test_bad_constructor_arguments(tmp_path):
    with pytest.raises(TypeError, match="`path` must be a path"):
        JsonlWriter(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`step_key`"):
        JsonlWriter(tmp_path / "m", step_key="")
    with pytest.raises(TypeError, match="`logdir` must be a path"):
        TensorBoardWriter(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`run_name` must be a non-empty string"):
        MLflowWriter(tmp_path, run_name="")
    with pytest.raises(TypeError, match="`params` must be a mapping"):
        MLflowWriter(tmp_path, run_name="a", params=[1])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "hidden, make, extra",
    [
        ("tensorboardX", lambda p: TensorBoardWriter(p), "tensorboard"),
        ("mlflow", lambda p: MLflowWriter(p, run_name="a"), "mlflow"),
    ],
)
def test_missing_extra_names_it(tmp_path, monkeypatch, hidden, make, extra):
    import sys

    for name in list(sys.modules):
        if name == hidden or name.startswith(hidden + "."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, hidden, None)
    with pytest.raises(ImportError, match=rf"pip install 'jaxwise\[{extra}\]'"):
        make(tmp_path)


@needs_mlflow
def test_mlflow_file_store_flag_is_only_a_default(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    MLflowWriter(tmp_path, run_name="a").close()
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"


def test_jsonl_never_deletes_another_writers_lines(tmp_path):
    """A `jaxwise train` run's file is keyed `epoch`: a `step` writer refuses it by name."""
    path = tmp_path / "metrics.jsonl"
    cli_lines = '{"epoch": 1, "loss": 0.5}\n{"epoch": 2, "loss": 0.4}\n'
    path.write_text(cli_lines)
    w = JsonlWriter(path)
    with pytest.raises(ValueError, match=r"no numeric 'step' field.*step_key='epoch'"):
        w.write(10, {"loss": 0.1})
    w.close()
    assert path.read_text() == cli_lines  # untouched
    with JsonlWriter(path, step_key="epoch") as w:  # the file's own key continues it
        w.write(3, {"loss": 0.3})
    assert [r["epoch"] for r in jsonl(path)] == [1, 2, 3]


def test_jsonl_float_steps_and_foreign_lines_are_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1.0, "loss": 1}\n# a note\n[1, 2]\n{"step": 2.0, "loss": 2}\n')
    with JsonlWriter(path) as w:  # resumed at step 2: only the float step 2.0 goes
        w.write(2, {"loss": 20.0})
    assert path.read_text().splitlines() == [
        '{"step": 1.0, "loss": 1}',
        "# a note",
        "[1, 2]",
        '{"step": 2, "loss": 20.0}',
    ]


@needs_mlflow
@pytest.mark.parametrize("name", ["acc@1", "err%", "x" * 251, "../up", "/abs"])
def test_mlflow_refuses_a_bad_metric_name_at_write(tmp_path, name):
    w = MLflowWriter(tmp_path / "ml", run_name="r")
    with pytest.raises(ValueError, match="not accepted by MLflow"):
        w.write(1, {"loss": 1.0, name: 1.0})
    w.write(1, {"loss": 1.0, "acc:1 / top-5_x.y": 1.0})  # every character MLflow allows
    w.close()  # the flush succeeds: nothing bad was queued
    assert mlflow_history(w, "loss") == [(1, 1.0)]


@needs_mlflow
def test_mlflow_continued_run_logs_a_new_metric_from_its_first_step(tmp_path):
    w = MLflowWriter(tmp_path / "ml", run_name="r")
    for s in range(1, 4):
        w.write(s, {"loss": float(s)})
    w.close()
    w2 = MLflowWriter(tmp_path / "ml", run_name="r")
    for s in range(2, 6):
        w2.write(s, {"loss": 10.0 * s, "acc": 0.1 * s})
    w2.close()
    assert [s for s, _ in mlflow_history(w2, "loss")] == [1, 2, 3, 4, 5]
    assert mlflow_history(w2, "acc") == [(s, 0.1 * s) for s in range(2, 6)]


@needs_mlflow
@pytest.mark.parametrize("run_name", ["bob's run", 'say "hi"', 'it\'s "both"'])
def test_mlflow_run_names_with_quotes_continue_their_run(tmp_path, run_name):
    w = MLflowWriter(tmp_path / "ml", run_name=run_name)
    w.write(1, {"loss": 1.0})
    w.close()
    other = MLflowWriter(tmp_path / "ml", run_name="plain")
    w2 = MLflowWriter(tmp_path / "ml", run_name=run_name)
    assert w2.run_id == w.run_id != other.run_id
    w2.close()
    other.close()


def test_mlflow_refuses_a_file_as_its_store(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("x")
    for given in (path, path.as_uri()):
        with pytest.raises(ValueError, match="`tracking_uri` must be a directory"):
            MLflowWriter(given, run_name="r")
    assert path.read_text() == "x"
