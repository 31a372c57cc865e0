"""The donation audit of jaxwise steps on real-code forms (regressions found by the corpus).

A step called inside the user's own donating ``jax.jit``, a step under ``jax.disable_jit()``,
and the same buffer at two paths appearing after the first call.
"""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import pytest

from jaxwise import optim
from jaxwise._shared import _events
from jaxwise.compilation import CompileCounter
from jaxwise.train import DonationError, TrainState, make_train_step


def loss(params, batch):
    return jnp.mean((batch @ params["w"]) ** 2)


def setup():
    tx = optim.adam(1e-2)
    state = TrainState.create({"w": jnp.ones((2, 1))}, tx, 0)
    return tx, state, jnp.ones((4, 2))


def test_step_inside_the_users_donating_jit_is_not_audited():
    tx, state, batch = setup()
    step = make_train_step(loss)
    outer = jax.jit(lambda s, b: step(s, b), donate_argnums=0)
    reference, _ = make_train_step(loss)(setup()[1], batch)
    with CompileCounter(outer) as counter:
        for _ in range(3):
            state, metrics = outer(state, batch)
    assert counter.count == 1 and int(state.step) == 3
    assert float(metrics["loss"]) < float(loss(reference.params, batch)) + 1.0  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs


def test_step_under_disable_jit_warns_once_and_runs():
    tx, state, batch = setup()
    step = make_train_step(loss)
    jitted_state, _ = make_train_step(loss)(setup()[1], batch)
    with pytest.warns(RuntimeWarning, match="donation audit is off under jax.disable_jit") as seen:
        with jax.disable_jit():
            eager_state, _ = step(state, batch)
            first = eager_state.params["w"]
            for _ in range(2):
                eager_state, _ = step(eager_state, batch)
    assert len(seen) == 1 and not state.params["w"].is_deleted()  # nothing donated
    assert jnp.allclose(first, jitted_state.params["w"], atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state, _ = step(eager_state, batch)  # jitted again: audited, no warning
    assert int(state.step) == 4


def test_duplicate_buffers_after_the_first_call_are_named():
    tx, state, batch = setup()
    step = make_train_step(loss)
    state, _ = step(state, batch)
    adam = state.opt_state[0]
    shared = dataclasses.replace(state, opt_state=(adam._replace(nu=adam.mu), *state.opt_state[1:]))
    with pytest.raises(
        DonationError,
        match=r"the same buffer appears at `opt_state.0.mu.w` and "
        r"`opt_state.0.nu.w`",
    ) as info:
        step(shared, batch)
    assert info.value.argument == "state.opt_state[0].nu['w']"
    assert not adam.mu["w"].is_deleted()  # refused before the call: nothing donated


def test_every_donation_error_is_published_with_its_program():
    tx, state, batch = setup()
    step = make_train_step(loss)
    old = state
    state, _ = step(state, batch)
    heard = []
    stop = _events.subscribe(heard.append)
    try:
        with pytest.raises(DonationError, match="already deleted") as info:
            step(old, batch)
    finally:
        stop()
    name = step.jitted.__name__  # pyright: ignore[reportAttributeAccessIssue]  # a jitted function
    assert [(e.function, e.argument) for e in heard] == [(name, "state.step")]
    assert heard[0].error is info.value
    assert type(heard[0]).__module__ == "jaxwise._shared._events"
