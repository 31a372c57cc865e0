"""Whose error it is, marked at the call boundaries (``_shared/_blame.py``), not read from frames.

A training program's first call names the shapes it was given when the user's loss fails
(plain and DP gradients alike, and through a user's wrapper); an error raised anywhere else
(the wrapper's own code) and jaxwise's own precise errors raised inside the loss (an MLP's
shape check, an adapter's refusal) pass unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxwise import optim
from jaxwise._shared._blame import from_user_loss, own, own_errors, user_loss
from jaxwise.models import init_mlp, mlp_apply
from jaxwise.privacy import dp_gradient_fn
from jaxwise.train import TrainState, make_step, value_and_grad

PREFIX = "the loss function failed on its first call"


def mismatched(params, example):  # per-example: (3,) weights against 2 features
    return jnp.dot(example[0], params["w"]) - example[1]


def mean_mismatched(params, batch):
    return jnp.mean(jax.vmap(lambda x, y: mismatched(params, (x, y)))(*batch))


def _state(params):
    return TrainState.create(params, optim.sgd(0.1), 0)


BATCH = (jnp.ones((4, 2)), jnp.ones(4))
PARAMS = {"w": jnp.ones(3)}
SHAPES = "with params['w']: float32[3] and batch[0]: float32[4, 2], batch[1]: float32[4]"


@pytest.mark.parametrize("kind", ["plain", "dp"])
def test_a_failing_loss_is_named_with_its_shapes(kind):
    gradient = (
        value_and_grad(mean_mismatched)
        if kind == "plain"
        else dp_gradient_fn(mismatched, clip_norm=1.0, noise_multiplier=0.0)
    )
    with pytest.raises(TypeError) as err:
        make_step(gradient)(_state(PARAMS), BATCH)
    assert str(err.value).startswith(PREFIX) and SHAPES in str(err.value)
    cause = err.value.__cause__  # the loss's own error, chained
    assert cause is not None and from_user_loss(cause)


class Checking:
    """A user's wrapper that forwards the protocol and refuses some batches itself."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def requirements(self):
        return self.inner.requirements

    def init(self, params):
        return self.inner.init(params)

    def __call__(self, params, model_state, batch, state, *, key, mask, context):
        if batch[1].ndim != 1:
            raise ValueError("Checking: the labels must be a vector")
        return self.inner(params, model_state, batch, state, key=key, mask=mask, context=context)


def test_a_wrappers_own_error_passes_unchanged_and_its_loss_is_still_named():
    inner = dp_gradient_fn(mismatched, clip_norm=1.0, noise_multiplier=0.0)
    with pytest.raises(ValueError) as refused:
        make_step(Checking(inner))(_state(PARAMS), (jnp.ones((4, 2)), jnp.ones((4, 1))))
    assert str(refused.value) == "Checking: the labels must be a vector"
    with pytest.raises(TypeError) as named:  # the inner loss fails: named through the wrapper
        make_step(Checking(inner))(_state(PARAMS), BATCH)
    assert str(named.value).startswith(PREFIX) and SHAPES in str(named.value)


def test_a_jaxwise_error_inside_the_loss_passes_unchanged():
    params = init_mlp(0, (3, 4, 2))

    def loss(p, batch):  # mlp_apply checks the feature count itself
        return jnp.mean(mlp_apply(p, batch[0]) ** 2)

    with pytest.raises(ValueError) as err:
        make_step(value_and_grad(loss))(_state(params), BATCH)
    assert str(err.value) == "`x` has 2 features, the MLP expects 3"


def test_the_marks():
    def failing(params, batch):
        """Its docstring."""
        raise ValueError("bad shapes")

    wrapped = user_loss(failing)
    assert wrapped.__name__ == "failing" and wrapped.__doc__ == "Its docstring."
    with pytest.raises(ValueError) as err:
        wrapped(1, 2)
    assert from_user_loss(err.value)

    def adapter(params, batch):
        raise own(TypeError("do not pass `key`"))

    with pytest.raises(TypeError) as err:
        user_loss(adapter)(1, 2)
    assert not from_user_loss(err.value)  # the innermost mark wins

    def checked(params, batch):
        with own_errors():
            raise ValueError("`x` has 2 features")

    with pytest.raises(ValueError) as err:
        user_loss(checked)(1, 2)
    assert not from_user_loss(err.value)

    def interrupted(params, batch):
        raise KeyError("k")  # not a TypeError or ValueError: never marked

    with pytest.raises(KeyError) as err:
        user_loss(interrupted)(1, 2)
    assert not from_user_loss(err.value)
    assert not from_user_loss(ValueError("raised outside any loss"))
