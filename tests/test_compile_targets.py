"""A counter or budget on one program counts that program's compiles, not a sibling's."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise import optim
from jaxwise.compilation import CompileBudget, CompileCounter
from jaxwise.train import TrainState, make_train_epoch, make_train_step


def _loss(params, batch):
    x, y = batch
    return jnp.mean((x @ params["w"] - y) ** 2)


def _data():
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    return x, x @ np.asarray([1.0, -2.0, 0.5], np.float32)


def _state(tx):
    return TrainState.create({"w": jnp.zeros(3)}, tx, jax.random.key(0))


def test_a_budget_on_one_epoch_ignores_another_epoch_of_the_same_loss():
    tx = optim.sgd(0.1)
    first, second = make_train_epoch(_loss, 4), make_train_epoch(_loss, 4)
    data = _data()
    with CompileCounter(first) as counter:
        second(_state(tx), data)
        assert counter.count == 0  # same loss, same source line: not this epoch's program
        with CompileBudget(1, first, exact=True):
            first(_state(tx), data)
            first(_state(tx), data)
    assert counter.count == 1 and len(counter.others) >= 1


def test_a_budget_on_one_step_ignores_another_step_of_the_same_loss():
    tx = optim.sgd(0.1)
    first, second = make_train_step(_loss), make_train_step(_loss)
    x, y = _data()
    with CompileCounter(first) as counter:
        second(_state(tx), (x[:4], y[:4]))
        with CompileBudget(1, first, exact=True):
            first(_state(tx), (x[:4], y[:4]))
    assert counter.count == 1


def test_a_jitted_wrapper_counts_the_functions_it_wraps():
    def make():
        def inner(x):
            return jax.make_jaxpr(lambda t: t * 2)(x) and x * 2  # traces inside the trace

        @functools.wraps(inner)
        def outer(x):
            return inner(x) + 1

        return jax.jit(outer)

    f, g = make(), make()
    with CompileCounter(f) as counter:
        g(jnp.ones(3))
        f(jnp.ones(3))
        f(jnp.ones(4))
    assert counter.count == 2 and [r.fun_name for r in counter.records] == ["jit(inner)"] * 2
