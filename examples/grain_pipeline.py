"""A grain input pipeline (shuffle, map, batch, shard by process) whose position is checkpointed.

`train.fit` saves the grain iterator's state in each checkpoint's metadata beside the
`TrainState`; a run stopped after any checkpoint and resumed from it (``fit(..., resume=)`` with the
metadata of the step restored) sees exactly the batches an uninterrupted run sees, so its final
parameters are bit-identical. Metrics go to `metrics.jsonl` and TensorBoard event files.
"""

import sys
import tempfile
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import numpy as np

from jaxwise import optim
from jaxwise.checkpoint import Checkpointer, latest_step, load_metadata, restore
from jaxwise.metrics import JsonlWriter, TensorBoardWriter
from jaxwise.train import (
    Checkpointing,
    MetricLogging,
    TrainState,
    fit,
    make_train_step,
)

ROWS, FEATURES, BATCH, EPOCHS = 512, 8, 32, 3
TRUE_W = np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32)


def pipeline(seed: int = 0) -> grain.IterDataset:
    """Each process's shard of a shuffled, augmented, batched table, ``EPOCHS`` times over."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    rows = [(xi, np.float32(xi @ TRUE_W)) for xi in x]

    def noisy(i, row):  # a deterministic augmentation of the i-th row drawn
        xi, yi = row
        jitter = np.random.default_rng([seed, i]).normal(scale=0.01, size=FEATURES)
        return (xi + jitter.astype(np.float32), yi)

    ds = grain.MapDataset.source(rows)
    ds = ds[jax.process_index() :: jax.process_count()]  # shard by process (multi-host)
    ds = ds.repeat(EPOCHS).shuffle(seed=seed)  # a global shuffle over every epoch's rows
    ds = ds.map_with_index(noisy).batch(BATCH, drop_remainder=True)
    return ds.to_iter_dataset()


def loss(params, batch):
    x, y = batch
    return jnp.mean((x @ params["w"] - y) ** 2)


def train(directory: Path, *, steps: int | None = None, checkpointer=None) -> TrainState:
    """Train (or continue, when ``directory`` holds a checkpoint) and return the final state."""
    tx = optim.adam(0.05)
    state = TrainState.create({"w": jnp.zeros(FEATURES)}, tx, jax.random.key(0))
    ckpt = checkpointer or Checkpointer(directory / "checkpoint", keep=2)
    writers = [JsonlWriter(directory / "metrics.jsonl"), TensorBoardWriter(directory / "tb")]
    callbacks = [Checkpointing(ckpt, every=4), MetricLogging(writers)]
    resume = None
    if latest_step(directory / "checkpoint") is not None:  # resume: the newest usable step
        state = restore(directory / "checkpoint", state)  # (a damaged newest one is skipped)
        resume = load_metadata(directory / "checkpoint", step=int(state.step))  # its metadata
    try:
        step = make_train_step(loss)
        state, _ = fit(step, state, pipeline(), steps=steps, resume=resume, callbacks=callbacks)
    finally:
        for w in writers:
            w.close()
        if checkpointer is None:
            ckpt.close()
    return state


def main() -> None:
    root = Path(tempfile.mkdtemp())
    whole = train(root / "whole")
    train(root / "stopped", steps=18)  # stopped after 18 batches (checkpointed there)
    resumed = train(root / "stopped")
    same = bool(np.array_equal(whole.params["w"], resumed.params["w"]))
    lines = (root / "stopped" / "metrics.jsonl").read_text().splitlines()
    print(f"steps {int(whole.step)}, resumed run bit-identical: {same}, metrics lines {len(lines)}")
    print("max |w - true w|:", float(np.abs(np.asarray(whole.params["w"]) - TRUE_W).max()))
    assert same and len(lines) == int(whole.step)


if __name__ == "__main__" and not sys.flags.interactive:
    main()
