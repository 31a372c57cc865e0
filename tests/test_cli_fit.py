"""The CLI's training jobs run on `train.fit`: same models as before, writers, resume, kills.

``tests/data/cli_golden-jax<version>.npz`` holds the final parameters the jobs trained with
their own epoch loop (``jobs/_loop.py``, commit 96af08f), written by
``tests/data/make_cli_golden.py`` under that JAX (``tests/goldens.py``). On the machine that
wrote it the parameters agree bit for bit; another CPU (AVX-512 rather than AVX2, say) may
compile the same program with other vector code and move the last bits, so the comparison
allows a few float32 ulps (an error in the loop moves them far more); on a JAX without its own
file, whose XLA orders sums differently, 64 ulps.
"""

import json
import os
import sys
from pathlib import Path

import goldens
import numpy as np
import pytest
from host64 import host_default
from needs import needs

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
import make_cli_golden as golden  # noqa: E402  # pyright: ignore[reportMissingImports]

GOLDEN, EXACT = goldens.load("cli")
ULPS = 8 if EXACT else 64


def _assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        # a few float32 ulps of the largest parameter: XLA's code differs between CPUs
        np.testing.assert_allclose(a, b, rtol=0, atol=ULPS * np.spacing(np.abs(b).max()))


def _expected(name: str) -> list[np.ndarray]:
    count = sum(1 for key in GOLDEN.files if key.startswith(f"{name}/"))
    return [GOLDEN[f"{name}/{i}"] for i in range(count)]


# The golden parameters were recorded on XLA:CPU: the jobs run on the CPU device on any machine
# (an accelerator's arithmetic differs by more than a few ulps after hundreds of steps).


@pytest.mark.parametrize("name", sorted(golden.CONFIGS))
def test_the_train_job_trains_the_same_model_as_before_for_the_same_seed(tmp_path, name):
    csv_path = golden.blobs_csv(tmp_path / "blobs.csv")
    with host_default():
        got = golden.train_params(csv_path, tmp_path / name, golden.CONFIGS[name])
    _assert_same(got, _expected(name))


def test_the_spiral_job_trains_the_same_model_as_before_for_the_same_seed():
    with host_default():
        got = golden.spiral_params()
    _assert_same(got, _expected("spiral"))


# ---------------------------------------------------------------------------
# fit's callbacks
# ---------------------------------------------------------------------------


def _regression():
    import jax.numpy as jnp

    from jaxwise import optim
    from jaxwise.train import TrainState, make_train_step

    x = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    batches = [(x, x @ np.asarray([1.0, -2.0, 0.5], np.float32))] * 6
    loss = lambda p, b: jnp.mean((b[0] @ p["w"] - b[1]) ** 2)  # noqa: E731
    state = TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), 0)
    return make_train_step(loss), state, batches


def test_callbacks_see_each_batchs_own_state_and_can_stop_fit(tmp_path):
    from jaxwise.checkpoint import Checkpointer, load_metadata
    from jaxwise.compilation import CompileBudget
    from jaxwise.train import Checkpointing, LambdaCallback, fit

    step, state, batches = _regression()
    seen, meta = [], {"note": 0}

    def watch(batch, state, scalars):
        seen.append((batch, int(state.step), scalars["loss"], np.array(state.params["w"])))
        meta["note"] = batch  # the metadata is read at each save
        return batch == 4

    manual, s = [], state  # the same steps by hand (copies: fit donates the state)
    for b in batches[:4]:
        s, m = step(s, b)
        manual.append((float(m["loss"]), np.array(s.params["w"])))
    step, state, batches = _regression()
    with Checkpointer(tmp_path, async_save=True) as ck, CompileBudget(1, step, exact=True):
        saving = Checkpointing(ck, every=3, metadata=meta)
        state, report = fit(
            step, state, batches, prefetch=0, callbacks=[saving, LambdaCallback(watch)]
        )
    assert report.steps == 4 and int(state.step) == 4 and report.checkpoints == (3, 4)
    assert [(b, s) for b, s, _, _ in seen] == [(1, 1), (2, 2), (3, 3), (4, 4)]
    for (_, _, loss, w), (want_loss, want_w) in zip(seen, manual):
        assert loss == want_loss
        np.testing.assert_array_equal(w, want_w)
    assert load_metadata(tmp_path, step=3)["note"] == 3
    assert load_metadata(tmp_path, step=4)["note"] == 4


def test_without_callbacks_fit_is_unchanged_by_them():
    from jaxwise.train import LambdaCallback, fit

    step, state, batches = _regression()
    _, plain = fit(step, state, batches, prefetch=0)
    step, state, batches = _regression()
    nothing = LambdaCallback(lambda step, state, metrics: None)
    _, called = fit(step, state, batches, prefetch=0, callbacks=[nothing])
    np.testing.assert_array_equal(plain.losses, called.losses)


@pytest.mark.parametrize(
    ("callbacks", "message"),
    [
        (lambda s, b, m: None, "`callbacks` must be a list, got function"),
        (
            [3],
            r"`callbacks\[0\]` must be a train.Callback \(every, on_start, on_step, on_end\), "
            "got int",
        ),
        ([lambda s, b, m: None], r"got function: a function is one as train.LambdaCallback"),
    ],
)
def test_fit_names_a_bad_callback(callbacks, message):
    from jaxwise.train import fit

    step, state, batches = _regression()
    with pytest.raises(TypeError, match=message):
        fit(step, state, batches, callbacks=callbacks)


# ---------------------------------------------------------------------------
# The CLI's writers: --log jsonl,tensorboard,mlflow, across --resume and a SIGKILL
# ---------------------------------------------------------------------------

TRAIN = ["--label", "colour", "--batch-size", "16", "--hidden", "8"]
QUIET = ["--no-progress", "--no-cache", "--no-plots", "--json"]


def train_cli(csv_path, out, capsys, *extra, epochs=4):
    from jaxwise.cli import main

    args = ["train", str(csv_path), *TRAIN, "--epochs", str(epochs), "--out", str(out)]
    code = main([*args, *QUIET, *extra])
    stdout, err = capsys.readouterr()
    return code, stdout, err


def history(out):
    """metrics.jsonl without the wall-clock seconds: ``[(epoch, {name: value})]``."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [
        (r.pop("epoch"), {k: v for k, v in r.items() if k != "seconds"})
        for r in map(json.loads, lines)
    ]


def tb_scalars(logdir):
    """``{tag: [(step, value), ...]}`` through TensorBoard's own reader (what its UI shows)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def mlflow_scalars(out):
    """``{key: [(step, value), ...]}`` of the run's one MLflow run, through MLflow's client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("jaxwise")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        for key in run.data.metrics
    }


def assert_same_steps(out, reference):
    """TensorBoard's read-back equals metrics.jsonl step by step, and both equal ``reference``."""
    records = history(out)
    assert records == reference
    scalars = tb_scalars(out / "tensorboard")
    assert set(scalars) == {*records[0][1], "seconds"}
    for name in records[0][1]:
        assert scalars[name] == [(e, float(np.float32(r[name]))) for e, r in records], name
    assert [s for s, _ in scalars["seconds"]] == [e for e, _ in records]


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    return golden.blobs_csv(tmp_path_factory.mktemp("data") / "blobs.csv")


@pytest.fixture(scope="module")
def straight(blobs, tmp_path_factory):
    """An uninterrupted 4-epoch run's history (the reference of the resumed runs)."""
    from jaxwise.cli import main

    out = tmp_path_factory.mktemp("straight") / "run"
    args = ["train", str(blobs), *TRAIN, "--epochs", "4", "--out", str(out), *QUIET]
    assert main([*args, "--log", "tensorboard"]) == 0
    return out, history(out)


@needs("mlflow", "tensorboardX", "tensorboard")
def test_every_writer_holds_every_epoch_once(blobs, straight, tmp_path, capsys):
    out = tmp_path / "run"
    code, text, err = train_cli(blobs, out, capsys, "--log", "jsonl,tensorboard,mlflow")
    assert code == 0, err
    outputs = json.loads(text)["outputs"]
    assert outputs["tensorboard"] == str(out / "tensorboard")
    assert outputs["mlflow"] == str(out / "mlruns")
    assert_same_steps(out, straight[1])
    assert_same_steps(straight[0], straight[1])
    logged = mlflow_scalars(out)
    for name in ("loss", "accuracy", "val_loss", "val_accuracy", "lr", "skipped"):
        assert logged[name] == [(e, pytest.approx(r[name], rel=1e-7)) for e, r in straight[1]]


@needs("mlflow", "tensorboardX", "tensorboard")
def test_resume_continues_every_writer_without_a_step_twice(blobs, straight, tmp_path, capsys):
    out = tmp_path / "run"
    log = ["--log", "tensorboard,mlflow"]
    assert train_cli(blobs, out, capsys, *log, "--stop-after", "2")[0] == 0
    code, text, err = train_cli(blobs, out, capsys, *log, "--resume")
    assert code == 0, err
    assert json.loads(text)["resumed_from_epoch"] == 2
    assert_same_steps(out, straight[1])
    assert [s for s, _ in mlflow_scalars(out)["loss"]] == [1, 2, 3, 4]


def test_an_unknown_writer_is_named_with_the_valid_ones(blobs, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        train_cli(blobs, tmp_path / "run", capsys, "--log", "tensorboard,wandb")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --log: unknown writer 'wandb'" in err
    assert "jsonl, tensorboard, mlflow" in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("writer", "module"), [("tensorboard", "tensorboardX"), ("mlflow", "mlflow")]
)
def test_a_missing_writer_extra_is_one_line_with_the_install_hint(
    blobs, tmp_path, capsys, monkeypatch, writer, module
):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    code, _, err = train_cli(blobs, tmp_path / "run", capsys, "--log", writer)
    assert code == 2 and err.count("\n") == 1
    assert f"--log {writer} needs {module}" in err and f"pip install 'jaxwise[{writer}]'" in err
    assert not (tmp_path / "run").exists()


def test_checkpoint_every_is_checked_and_spaces_the_checkpoints(blobs, tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = train_cli(blobs, out, capsys, "--checkpoint-every", "3", epochs=5)
    assert code == 0, err
    steps = sorted(int(p.name) for p in (out / "checkpoint").iterdir() if p.name.isdigit())
    assert len(steps) == 2 and steps[1] == 5 * steps[0] // 3  # epochs 3 and 5 (the end)
    with pytest.raises(SystemExit) as exit_:
        train_cli(blobs, tmp_path / "other", capsys, "--checkpoint-every", "0")
    assert exit_.value.code == 2


KILLED_AT = """
import os, sys
from jaxwise.cli._jobs import _fitting
call = _fitting.EvaluatedEpoch.__call__

def held(self, state, data):
    if self.epochs_done == int(os.environ["HOLD_AT_EPOCH"]):  # epochs before it are logged
        with open(os.environ["HOLD_FIFO"], "w") as fifo:
            fifo.write(str(os.getpid()))
        with open(os.environ["HOLD_FIFO"] + ".never") as fifo:  # blocks until killed
            fifo.read()
    return call(self, state, data)

_fitting.EvaluatedEpoch.__call__ = held
from jaxwise.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("at_epoch", [1, 3])
def test_sigkill_then_resume_equals_the_uninterrupted_run(blobs, straight, tmp_path, at_epoch):
    import select
    import signal
    import subprocess

    out, fifo = tmp_path / "run", tmp_path / "held"
    os.mkfifo(fifo)
    os.mkfifo(f"{fifo}.never")
    args = ["train", str(blobs), *TRAIN, "--epochs", "4", "--out", str(out), *QUIET]
    args += ["--log", "tensorboard"]
    env = dict(os.environ, HOLD_AT_EPOCH=str(at_epoch), HOLD_FIFO=str(fifo))
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_AT, *args], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:  # the process says when it is inside epoch `at_epoch + 1` (bounded wait)
        for _ in range(600):
            if proc.poll() is not None or select.select([fd], [], [], 1.0)[0]:
                break
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert int(os.read(fd, 64)) == proc.pid
    finally:
        os.close(fd)
    for _ in range(600):  # the checkpoint of epoch `at_epoch` appears (written asynchronously)
        if any(p.name.isdigit() for p in (out / "checkpoint").iterdir()):
            break
        select.select([], [], [], 0.1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert [e for e, _ in history(out)] == list(range(1, at_epoch + 1))
    resumed = subprocess.run(
        [sys.executable, "-m", "jaxwise.cli", *args, "--resume"], capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads(resumed.stdout)["resumed_from_epoch"] <= at_epoch
    assert_same_steps(out, straight[1])


@needs("mlflow", "tensorboardX", "tensorboard")
def test_the_readme_tensorboard_block_runs(blobs, tmp_path, monkeypatch, capsys):
    import shlex

    from jaxwise.cli import main

    text = (Path(__file__).parents[1] / "README.md").read_text()
    block = text.split("### Watch a run in TensorBoard or MLflow", 1)[1]
    block = block.split("```console\n", 1)[1].split("```", 1)[0]
    train, board, ui = (shlex.split(line) for line in block.strip().splitlines())
    assert train[:2] == ["jaxwise", "train"] and board[:2] == ["tensorboard", "--logdir"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / train[2]).write_bytes(blobs.read_bytes().replace(b"colour", b"kind"))
    assert main([*train[1:], "--epochs", "2", "--hidden", "8", *QUIET]) == 0, capsys.readouterr()
    scalars = tb_scalars(tmp_path / board[2])
    assert [s for s, _ in scalars["val_loss"]] == [1, 2]
    assert ui[-1] == "runs/mine/mlruns" and mlflow_scalars(tmp_path / "runs/mine")["loss"]


@needs("mlflow", "tensorboardX", "tensorboard")
def test_spiral_logs_every_epoch_to_every_writer(tmp_path, capsys):
    from jaxwise.cli import main

    out = tmp_path / "spiral"
    args = ["spiral", "--epochs", "3", "--batch-size", "64", "--out", str(out), *QUIET]
    assert main([*args, "--log", "tensorboard,mlflow"]) in (0, 1)  # 3 epochs: checks may fail
    summary = json.loads(capsys.readouterr().out)
    assert summary["outputs"]["metrics"] == str(out / "metrics.jsonl")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert sum(r["skipped"] for r in records) == summary["skipped"]
    scalars = tb_scalars(out / "tensorboard")
    assert scalars["loss"] == [(r["epoch"], float(np.float32(r["loss"]))) for r in records]
    assert [s for s, _ in mlflow_scalars(out)["accuracy"]] == [1, 2, 3]
    assert main([*args]) in (0, 1)  # a re-run replaces the history, never appends to it
    capsys.readouterr()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3


def test_label_errors_logs_its_final_models_epochs(blobs, tmp_path, capsys):
    from jaxwise.cli import main

    run_dir = tmp_path / "le"
    args = ["label-errors", str(blobs), *TRAIN, "--epochs", "2", "--method", "gradnorm"]
    args += ["--run-dir", str(run_dir), "--out", str(tmp_path / "s.csv"), *QUIET]
    assert main([*args, "--log", "tensorboard"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["outputs"]["tensorboard"] == str(
        run_dir / "tensorboard"
    )
    records = history(run_dir)
    assert [e for e, _ in records] == [1, 2]
    scalars = tb_scalars(run_dir / "tensorboard")
    assert scalars["val_loss"] == [(e, float(np.float32(r["val_loss"]))) for e, r in records]


def test_early_stopping_count_is_its_callback_state_and_older_checkpoints_resume(
    blobs, tmp_path, capsys
):
    """The CLI's callbacks share no metadata dict: early stopping's count is `BestEpoch`'s
    state in `fit`'s record; a checkpoint of an older jaxwise (top-level keys) still resumes."""
    import json

    from jaxwise.checkpoint import load_metadata
    from jaxwise.cli import main
    from jaxwise.cli._jobs.tabular import _Continued

    out = tmp_path / "run"
    args = ["train", str(blobs), *TRAIN, "--epochs", "3", "--early-stopping", "5", *QUIET]
    assert main([*args, "--out", str(out), "--stop-after", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    meta = load_metadata(out / "checkpoint")
    state = meta["fit"]["callbacks"]["BestEpoch"]
    assert meta["fit"]["batches"] == 2 and "epoch" not in meta and "bad_epochs" not in meta
    assert state["best_step"] == summary["best_epoch"] and state["stopped"] is False
    continued = _Continued.saved(meta)
    assert continued.epoch == 2 and continued.progress["best_epoch"] == summary["best_epoch"]
    older = {"epoch": 2, "best_val_loss": 0.5, "best_epoch": 1, "bad_epochs": 1}
    older |= {"stopped_early": False}
    for saved in (older, {**older, "fit": {"batches": 2}}):
        continued = _Continued.saved(saved)
        assert continued.epoch == 2 and continued.progress == {
            k: v for k, v in older.items() if k != "epoch"
        }
    assert main([*args, "--out", str(out), "--resume"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["resumed_from_epoch"] == 2 and resumed["epochs_completed"] == 3
    assert resumed["best_epoch"] is not None
