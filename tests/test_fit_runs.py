"""`fit` with metric writers and a grain pipeline: resumes see exactly the uninterrupted run.

Runs are stopped after a checkpoint (in process: ``steps=``; in a subprocess: SIGKILL from a
test hook in the checkpointer or a writer, so the kill point is deterministic) and resumed from
it; final parameters are compared bit for bit, and every writer's steps with the
uninterrupted run's, read back by TensorBoard's own reader.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from test_metrics import tb_scalars

from jaxwise import optim
from jaxwise.checkpoint import Checkpointer, CheckpointWarning
from jaxwise.metrics import JsonlWriter, TensorBoardWriter
from jaxwise.train import (
    Checkpointing,
    MetricLogging,
    Resume,
    ResumeError,
    StatefulIterator,
    TrainState,
    fit,
    make_train_step,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
import grain_pipeline as gp  # noqa: E402  # pyright: ignore[reportMissingImports]


def jsonl_steps(path):
    return [(r["step"], r["loss"]) for r in map(json.loads, path.read_text().splitlines())]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted run: its directory and final state."""
    root = tmp_path_factory.mktemp("whole")
    return root, gp.train(root)


def test_writers_get_every_step_as_the_report(tmp_path):
    tx = optim.adam(0.1)
    state = TrainState.create({"w": jnp.zeros(gp.FEATURES)}, tx, 0)
    writers = [JsonlWriter(tmp_path / "m.jsonl"), TensorBoardWriter(tmp_path / "tb")]
    logging = MetricLogging(writers)
    _, report = fit(make_train_step(gp.loss), state, gp.pipeline(), steps=10, callbacks=[logging])
    for w in writers:
        w.close()
    expected = [(i + 1, float(v)) for i, v in enumerate(report.losses)]
    assert jsonl_steps(tmp_path / "m.jsonl") == expected
    tb = tb_scalars(tmp_path / "tb")
    assert [s for s, _ in tb["loss"]] == list(range(1, 11))
    np.testing.assert_array_equal([v for _, v in tb["loss"]], np.float32(report.losses))
    assert tb["skipped"] == [(s, 0.0) for s in range(1, 11)]


def test_log_every(tmp_path):
    tx = optim.adam(0.1)
    state = TrainState.create({"w": jnp.zeros(gp.FEATURES)}, tx, 0)
    with JsonlWriter(tmp_path / "m.jsonl") as w:
        logging = MetricLogging([w], every=3)
        fit(make_train_step(gp.loss), state, gp.pipeline(), steps=10, callbacks=[logging])
    assert [s for s, _ in jsonl_steps(tmp_path / "m.jsonl")] == [3, 6, 9]


@pytest.mark.parametrize("stop", [3, 4, 13, 30])
def test_grain_resume_is_bit_identical(tmp_path, whole, stop):
    root, final = whole
    gp.train(tmp_path, steps=stop)  # stopped (checkpointed at `stop`), then resumed
    resumed = gp.train(tmp_path)
    assert int(resumed.step) == int(final.step) == 48
    np.testing.assert_array_equal(resumed.params["w"], final.params["w"])
    assert jsonl_steps(tmp_path / "metrics.jsonl") == jsonl_steps(root / "metrics.jsonl")
    assert tb_scalars(tmp_path / "tb") == tb_scalars(root / "tb")


def test_grain_loader_state_is_bytes_and_round_trips(tmp_path):
    import grain

    x = np.arange(64, dtype=np.float32).reshape(32, 2)
    loader = grain.DataLoader(
        data_source=x,  # pyright: ignore[reportArgumentType]  # an array is a random-access source
        sampler=grain.samplers.IndexSampler(
            32, shard_options=grain.sharding.ShardByJaxProcess(), shuffle=True, seed=0, num_epochs=1
        ),
        operations=[grain.transforms.Batch(4)],
        worker_count=0,
    )
    tx = optim.sgd(0.01)
    step = make_train_step(lambda p, b: jnp.mean((b @ p["w"]) ** 2))

    def run(steps, ckpt_dir, resume=None, state=None):
        state = state or TrainState.create({"w": jnp.ones(2)}, tx, 0)
        with Checkpointer(ckpt_dir) as ckpt:
            return fit(
                step, state, loader, steps=steps, resume=resume, callbacks=[Checkpointing(ckpt)]
            )

    full, _ = run(None, tmp_path / "a")
    part, _ = run(3, tmp_path / "b")
    from jaxwise.checkpoint import load_metadata

    meta = load_metadata(tmp_path / "b")
    assert set(meta["fit"]) == {"batches", "data", "fingerprint", "step", "trained"}
    assert "bytes" in meta["fit"]["data"] and meta["fit"]["trained"]["to"] == 3
    assert meta["fit"]["fingerprint"]["sources"][0]["length"] == 32  # the loader's source
    assert meta["fit"]["batches"] == 3
    resumed, report = run(None, tmp_path / "c", meta, part)
    assert report.steps == 5
    np.testing.assert_array_equal(resumed.params["w"], full.params["w"])


def test_resume_errors(tmp_path):
    tx = optim.adam(0.1)
    state = TrainState.create({"w": jnp.zeros(gp.FEATURES)}, tx, 0)
    step = make_train_step(gp.loss)
    batch = next(iter(gp.pipeline()))
    saved = {"fit": {"batches": 4, "data": {"json": {"next_index": 4}}}}
    with pytest.raises(ResumeError, match="has no `get_state`/`set_state`"):
        fit(step, state, [batch] * 3, resume=saved)
    assert isinstance(iter(gp.pipeline()), StatefulIterator)
    with pytest.raises(ResumeError, match="holds no data position"):
        fit(step, state, gp.pipeline(), resume={"fit": {"batches": 4}})
    with pytest.raises(TypeError, match="`metadata` must be the checkpoint's metadata"):
        Resume([1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`writers\[0\]` must be a jaxwise.metrics.MetricWriter"):
        MetricLogging([print])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="`writers` must be a list"):
        MetricLogging(JsonlWriter(tmp_path / "m"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`every`"):
        MetricLogging([], every=0)


def test_a_grain_run_resumed_over_other_rows_is_refused_by_name(tmp_path):
    """256 rows saved, 200 rows given to the resume: refused, not continued silently."""
    import grain

    def pipeline(rows):
        x = np.random.default_rng(0).normal(size=(rows, gp.FEATURES)).astype(np.float32)
        ds = grain.MapDataset.source([(xi, np.float32(xi @ gp.TRUE_W)) for xi in x])
        return ds.shuffle(seed=0).batch(32, drop_remainder=True).to_iter_dataset()

    tx = optim.adam(0.1)
    step = make_train_step(gp.loss)
    with Checkpointer(tmp_path / "ck") as ckpt:
        fresh = TrainState.create({"w": jnp.zeros(gp.FEATURES)}, tx, 0)
        state, _ = fit(step, fresh, pipeline(256), steps=3, callbacks=[Checkpointing(ckpt)])
    from jaxwise.checkpoint import load_metadata

    saved = load_metadata(tmp_path / "ck")
    assert saved["fit"]["fingerprint"]["sources"][0]["length"] == 256
    with pytest.raises(ResumeError, match=r"length 256 \(now 200\)"):
        fit(step, state, pipeline(200), resume=saved)
    _, report = fit(step, state, pipeline(256), resume=saved)
    assert report.steps == 8 - 3  # the same rows: continued after the 3 batches trained


KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {examples!r})
    import grain_pipeline as gp
    from jaxwise.checkpoint import Checkpointer, CheckpointWarning
    from jaxwise.metrics import JsonlWriter

    where, at = {where!r}, {at!r}

    class KillAfterSave(Checkpointer):  # the hook: SIGKILL once the save of step `at` is done
        def save(self, state, metadata=None):
            out = super().save(state, metadata)
            if where == "checkpoint" and int(state.step) == at:
                self.wait()
                os.kill(os.getpid(), signal.SIGKILL)
            return out

    write = JsonlWriter.write

    def kill_in_writer(self, step, scalars):  # the hook: SIGKILL between two checkpoints
        write(self, step, scalars)
        if where == "writer" and step == at:
            self.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    JsonlWriter.write = kill_in_writer
    root = Path(sys.argv[1])
    gp.train(root, checkpointer=KillAfterSave(root / "checkpoint", keep=2, async_save={sync!r}))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("where, at", [("checkpoint", 8), ("writer", 11), ("writer", 45)])
def test_sigkill_then_resume_is_bit_identical(tmp_path, whole, where, at):
    root, final = whole
    script = KILLED.format(examples=str(EXAMPLES), where=where, at=at, sync=where == "checkpoint")
    env = {**os.environ, "PYTHONPATH": str(Path(str(gp.__file__)).parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, timeout=300)
    assert proc.returncode == -signal.SIGKILL
    logged = [s for s, _ in jsonl_steps(tmp_path / "metrics.jsonl")]
    assert logged[-1] >= at  # the killed run logged past its last checkpoint (writer kills)
    with pytest.warns(CheckpointWarning, match="took over the writer lock"):  # the killed one
        resumed = gp.train(tmp_path)
    np.testing.assert_array_equal(resumed.params["w"], final.params["w"])
    assert jsonl_steps(tmp_path / "metrics.jsonl") == jsonl_steps(root / "metrics.jsonl")
    assert tb_scalars(tmp_path / "tb") == tb_scalars(root / "tb")
