"""`fit`'s hooks: the `Callback` protocol, cadences, lazy metrics, callback state across a resume.

The jaxwise callbacks (`Checkpointing`, `MetricLogging`, `ProgressBar`, `EarlyStopping`) are
ordinary callbacks; `fit` calls each at the steps its ``every`` says, reads a step's metrics
from the device only when a due callback looks at them, and saves and restores the state of
the callbacks that have one with the checkpoint (issue #49).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim, train
from jaxwise.compilation import CompileBudget
from jaxwise.train._loop import _callbacks


def _fresh():
    return train.TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), 0)


def _batches(n, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(8, 3)).astype(np.float32)
        out.append((x, x.sum(1)))
    return out


def _loss(p, batch):
    x, y = batch
    return jnp.mean((x @ p["w"] - y) ** 2)


class _Saver:
    """A checkpointer that keeps the metadata of each save in memory."""

    def __init__(self):
        self.metadata = []

    def save(self, tree, metadata=None):
        self.metadata.append((int(tree.step), metadata))


class _Record(train.Callback):
    """Records every hook call."""

    def __init__(self, every):
        self.every, self.calls = every, []

    def on_start(self, run):
        self.calls.append(("start", run.first, run.total))

    def on_step(self, step, state, metrics):
        self.calls.append(("step", step, int(state.step)))

    def on_end(self, step, state):
        self.calls.append(("end", step, None if state is None else int(state.step)))


def _scripted():
    """A program whose batch is the loss it reports (a host function: no compilation)."""

    def program(state, batch):
        metrics = {"loss": batch, "skipped": np.int32(0), "extra": batch * 2}
        return state.replace(step=state.step + 1), metrics

    return program


def test_a_callback_is_called_at_its_cadence_with_the_state_of_that_step():
    every3, never = _Record(3), _Record(None)
    step = train.make_step(train.value_and_grad(_loss))
    with CompileBudget(1, step, exact=True):
        state, report = train.fit(step, _fresh(), _batches(10), callbacks=[every3, never])
    assert report.steps == 10 and int(state.step) == 10
    assert every3.calls == [
        ("start", 0, 10),
        ("step", 3, 3),
        ("step", 6, 6),
        ("step", 9, 9),
        ("end", 10, 10),
    ]
    assert never.calls == [("start", 0, 10), ("end", 10, 10)]


def test_on_end_gets_no_state_when_fit_fails_and_every_callback_finishes():
    calls = _Record(1)

    def program(state, batch):
        if int(state.step) == 2:
            raise RuntimeError("the device fell over")
        return state.replace(step=state.step + 1), {"loss": np.float32(1.0)}

    with pytest.raises(RuntimeError, match="fell over"):
        train.fit(program, _fresh(), [0] * 5, prefetch=0, callbacks=[calls])
    assert calls.calls[-1] == ("end", 2, None)


def test_metrics_are_read_only_when_a_due_callback_looks(monkeypatch):
    reads = []
    real = _callbacks.scalars

    def counted(metrics):
        reads.append(tuple(sorted(metrics)))
        return real(metrics)

    monkeypatch.setattr(_callbacks, "scalars", counted)
    batches = [np.float32(v) for v in range(6, 0, -1)]

    # a callback that does not look: only fit's own read of the loss (one step late)
    quiet = train.LambdaCallback(lambda s, state, metrics: None)
    train.fit(_scripted(), _fresh(), batches, prefetch=0, callbacks=[quiet])
    assert reads == [("loss", "skipped")] * 6

    # one that looks every third step: every scalar of those steps (fit reuses them)
    reads.clear()
    seen = []
    looks = train.LambdaCallback(lambda s, state, m: seen.append(m["extra"]), every=3)
    train.fit(_scripted(), _fresh(), batches, prefetch=0, callbacks=[looks])
    everything = ("extra", "loss", "skipped")
    assert reads.count(everything) == 2 and reads.count(("loss", "skipped")) == 4
    assert len(reads) == 6 and seen == [8.0, 2.0]  # steps 3 and 6 read once, fully


def test_early_stopping_state_is_saved_and_a_resumed_run_stops_where_one_run_does():
    losses = [5.0, 4.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    batches = [np.float32(v) for v in losses]
    program = _scripted()

    whole, whole_report = train.fit(
        program, _fresh(), batches, prefetch=0, callbacks=[train.EarlyStopping(patience=2)]
    )
    assert whole_report.steps == 5  # best at 3, two steps without a better one

    saver = _Saver()
    half, _ = train.fit(
        program,
        _fresh(),
        batches,
        steps=4,
        prefetch=0,
        callbacks=[train.EarlyStopping(patience=2), train.Checkpointing(saver)],
    )
    step, meta = saver.metadata[-1]
    assert step == 4 and meta["fit"]["callbacks"] == {
        "EarlyStopping": {"best": 3.0, "best_step": 3, "bad": 1, "stopped": False}
    }
    stopper = train.EarlyStopping(patience=2)
    resumed, report = train.fit(
        program, half, batches, prefetch=0, resume=meta, callbacks=[stopper]
    )
    assert report.steps == 1 and int(resumed.step) == int(whole.step) == 5
    assert stopper.stopped and stopper.best_step == 3


def test_a_saved_callback_state_nobody_takes_is_warned_about():
    program = _scripted()
    meta = {"fit": {"batches": 0, "callbacks": {"Gone": {"x": 1}}}}
    with pytest.warns(train.ResumeWarning, match="a callback 'Gone' that none of `callbacks`"):
        train.fit(program, _fresh(), [np.float32(1.0)], prefetch=0, resume=meta)


def test_early_stopping_checks_its_arguments_and_names_a_missing_metric():
    with pytest.raises(ValueError, match="`patience` must be >= 1"):
        train.EarlyStopping(patience=0)
    with pytest.raises(ValueError, match="`mode` must be 'min' or 'max'"):
        train.EarlyStopping(patience=1, mode="lowest")
    with pytest.raises(ValueError, match="`min_delta` must be finite and >= 0"):
        train.EarlyStopping(patience=1, min_delta=-1.0)
    with pytest.raises(TypeError, match="`monitor` must be a metric's name"):
        train.EarlyStopping(3, patience=1)  # pyright: ignore[reportArgumentType]
    stop = train.EarlyStopping("val_loss", patience=1)
    with pytest.raises(
        ValueError, match=r"step 1 have no 'val_loss' \(they have \['extra', 'loss'"
    ):
        train.fit(_scripted(), _fresh(), [np.float32(1.0)], prefetch=0, callbacks=[stop])
    with pytest.raises(ValueError, match="not one its state_dict"):
        stop.load_state_dict({"best": "low"})


def test_early_stopping_modes_and_min_delta():
    rising = train.EarlyStopping("acc", patience=1, mode="max", min_delta=0.1)
    answers = [rising.on_step(s, None, {"acc": v}) for s, v in enumerate([0.5, 0.65, 0.7], 1)]  # pyright: ignore[reportArgumentType]
    assert answers == [False, False, True] and rising.best == 0.65
    nan = train.EarlyStopping(patience=2)
    assert [nan.on_step(s, None, {"loss": v}) for s, v in enumerate([np.nan, 1.0], 1)] == [  # pyright: ignore[reportArgumentType]
        False,
        False,
    ]
    assert nan.best == 1.0 and nan.best_step == 2


def test_a_callback_that_is_not_one_is_refused_by_name():
    program = _scripted()
    with pytest.raises(
        TypeError, match=r"`callbacks\[0\]` must be a train.Callback .* got _Record"
    ):
        train.fit(program, _fresh(), [], callbacks=[_Record])  # pyright: ignore[reportArgumentType]
    bad = _Record(0)
    with pytest.raises(ValueError, match=r"`callbacks\[0\]` \(_Record\) has `every` = 0"):
        train.fit(program, _fresh(), [], callbacks=[bad])
    bad.every = 2.5  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(TypeError, match=r"has `every` = 2.5"):
        train.fit(program, _fresh(), [], callbacks=[bad])
    with pytest.raises(TypeError, match="`on_step` must be a function"):
        train.LambdaCallback(3)  # pyright: ignore[reportArgumentType]


def test_checkpointing_is_called_after_the_others_of_its_step():
    order = []

    class Note(train.Callback):
        def on_step(self, step, state, metrics):
            order.append(("note", step))

    class Saver:
        def save(self, tree, metadata=None):
            order.append(("save", int(tree.step)))

    callbacks = [train.Checkpointing(Saver(), every=2), Note()]
    train.fit(_scripted(), _fresh(), [np.float32(1.0)] * 2, prefetch=0, callbacks=callbacks)
    assert order == [("note", 1), ("note", 2), ("save", 2)]


def test_a_writer_is_flushed_before_each_checkpoint_with_the_steps_it_holds():
    events = []

    class Writer:
        def write(self, step, scalars):
            events.append(("write", step))

        def flush(self):
            events.append(("flush",))

    class Saver:
        def save(self, tree, metadata=None):
            events.append(("save", int(tree.step)))

    callbacks = [train.Checkpointing(Saver(), every=2), train.MetricLogging([Writer()])]
    train.fit(_scripted(), _fresh(), [np.float32(1.0)] * 3, prefetch=0, callbacks=callbacks)
    assert events == [
        ("write", 1),
        ("write", 2),
        ("flush",),
        ("save", 2),
        ("write", 3),
        ("flush",),  # on_end of MetricLogging
        ("flush",),  # before the final save
        ("save", 3),
    ]


def test_a_writer_every_step_reads_each_steps_metrics_once(monkeypatch):
    reads = []
    real = _callbacks.scalars
    monkeypatch.setattr(_callbacks, "scalars", lambda m: reads.append(sorted(m)) or real(m))

    class Writer:
        def __init__(self):
            self.steps = []

        def write(self, step, scalars):
            self.steps.append(step)

        def flush(self):
            pass

    writer = Writer()
    batches = [np.float32(v) for v in range(5, 0, -1)]
    train.fit(_scripted(), _fresh(), batches, prefetch=0, callbacks=[train.MetricLogging([writer])])
    assert writer.steps == [1, 2, 3, 4, 5]
    assert reads == [["extra", "loss", "skipped"]] * 5  # one transfer a step, shared with fit
