"""Nothing lost, nothing over-claimed by `fit` and its callbacks (issue #50's fit cases).

Each test is one finding of the attack on the fifth round's `fit`: before its fix, the case
trained silently on the wrong batches, wrote a metric step twice, failed deep at the first
save, or stopped (or crashed) without naming the callback. The next attack extends this file.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim, train
from jaxwise.checkpoint import Checkpointer, CheckpointWarning, load_metadata, restore
from jaxwise.metrics import JsonlWriter


def _loss(p, batch):
    x, y = batch
    return jnp.mean((x @ p["w"] - y) ** 2)


def _batches(n, seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(8, 3)).astype(np.float32)
        out.append((x, x @ np.asarray([1.0, -2.0, 0.5], np.float32)))
    return out


def _fresh():
    return train.TrainState.create({"w": jnp.zeros(3)}, optim.adam(0.05), 0)


def _flip_array_data(step_dir):
    """Flip bytes in the middle of the step's largest file that is not its metadata."""
    files = [p for p in step_dir.rglob("*") if p.is_file() and "meta" not in p.parts[-2:]]
    target = max(files, key=lambda p: p.stat().st_size)
    blob = bytearray(target.read_bytes())
    for i in range(len(blob) // 3, len(blob) // 3 + 16):
        blob[i] ^= 0x5A
    target.write_bytes(bytes(blob))


def test_a_damaged_newest_step_never_resumes_with_the_metadata_of_another_step(tmp_path):
    """Before: restore fell back to step 4, load_metadata described step 6, and `fit`
    continued after batch 6: batches 5-6 were never trained and the run ended at step 6."""
    step, batches = train.make_train_step(_loss), _batches(8)
    whole, _ = train.fit(step, _fresh(), batches)
    path = tmp_path / "ck"
    with Checkpointer(path, keep=5) as ck:
        train.fit(step, _fresh(), batches, steps=6, callbacks=[train.Checkpointing(ck, every=2)])
    _flip_array_data(path / "6")
    with pytest.warns(CheckpointWarning, match="skipped damaged checkpoint step 6"):
        state = restore(path, like=_fresh())
    assert int(state.step) == 4
    newest = load_metadata(path)  # still step 6's: the metadata is intact
    assert newest["fit"]["batches"] == 6
    with pytest.raises(train.ResumeError, match=r"checkpoint of step 6, but `state` is at step 4"):
        train.fit(step, state, batches, resume=newest)
    assert int(state.step) == 4  # refused before a step: the state is untouched
    resumed, report = train.fit(
        step, state, batches, resume=load_metadata(path, step=int(state.step))
    )
    assert report.steps == 4 and int(resumed.step) == 8
    np.testing.assert_array_equal(np.asarray(resumed.params["w"]), np.asarray(whole.params["w"]))


def test_one_writer_in_two_metric_loggings_is_refused_before_a_step(tmp_path):
    """Before: a writer in an every=1 and an every=2 group wrote steps 2 and 4 twice."""
    step = train.make_train_step(_loss)
    state = _fresh()
    with JsonlWriter(tmp_path / "m.jsonl") as writer:
        groups = [train.MetricLogging([writer]), train.MetricLogging([writer], every=2)]
        with pytest.raises(ValueError, match=r"writer JsonlWriter is in two MetricLogging"):
            train.fit(step, state, _batches(4), callbacks=groups)
    written = tmp_path / "m.jsonl"  # opened lazily: nothing written, no file
    assert (not written.exists() or written.read_text() == "") and int(state.step) == 0
    other = JsonlWriter(tmp_path / "other.jsonl")
    with pytest.raises(ValueError, match=r"`writers\[1\]` is `writers\[0\]` \(JsonlWriter\)"):
        train.MetricLogging([other, other])
    other.close()
    with JsonlWriter(tmp_path / "a.jsonl") as a, JsonlWriter(tmp_path / "b.jsonl") as b:
        groups = [train.MetricLogging([a]), train.MetricLogging([b], every=2)]
        train.fit(step, state, _batches(4), callbacks=groups)
    steps = [json.loads(line)["step"] for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_a_class_where_an_instance_belongs_is_refused_when_the_callback_is_made():
    """Before: Checkpointing(Checkpointer, every=2) was accepted and failed at the first save
    with an AttributeError."""
    with pytest.raises(TypeError, match=r"got the class Checkpointer: make one"):
        train.Checkpointing(Checkpointer, every=2)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match=r"`writers\[0\]` must be .* instance .* got JsonlWriter"):
        train.MetricLogging([JsonlWriter])  # pyright: ignore[reportArgumentType]
    with pytest.raises(
        TypeError, match=r"`callbacks\[0\]` must be a train.Callback .* ProgressBar"
    ):
        train.fit(lambda s, b: (s, {}), _fresh(), [], callbacks=[train.ProgressBar])  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize(
    "answer, shown",
    [
        (np.asarray([True, False]), "returned ndarray '[ True False]'"),
        ("no", "returned str 'no'"),
        (1, "returned int '1'"),
        (jnp.asarray(True), "returned ArrayImpl"),
    ],
)
def test_a_callback_answer_that_is_not_a_bool_is_refused_naming_the_callback(answer, shown):
    """Before: a 2-element array gave NumPy's "truth value is ambiguous" naming no callback,
    and the string "no" stopped the loop."""
    step = train.make_train_step(_loss)
    callbacks = [train.LambdaCallback(lambda s, state, metrics: answer, every=2)]
    with pytest.raises(TypeError) as caught:
        train.fit(step, _fresh(), _batches(4), callbacks=callbacks)
    message = str(caught.value)
    assert "`callbacks[0]` (LambdaCallback).on_step" in message and shown in message
    assert "at step 2" in message and "must return True (stop), False or None" in message


@pytest.mark.parametrize("answer, steps", [(True, 2), (np.bool_(True), 2), (False, 4), (None, 4)])
def test_a_bool_or_none_answer_stops_or_goes_on(answer, steps):
    step = train.make_train_step(_loss)
    stop = train.LambdaCallback(lambda s, state, metrics: answer, every=2)
    state, report = train.fit(step, _fresh(), _batches(4), callbacks=[stop])
    assert report.steps == steps == int(jax.device_get(state.step))
