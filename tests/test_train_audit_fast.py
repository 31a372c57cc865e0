"""The donation audit's fast path: a state that is the previous call's result.

Such a state's deleted-leaf and shared-buffer checks are deferred to a failing call
(`Audit.call`); these tests show that every mistake the full audit catches is still caught,
named, and leaves the state intact, when the state *object* is the previous result.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim
from jaxwise.train import DonationError, TrainState, make_train_step


def loss(params, batch):
    return jnp.sum((batch @ params["w"] + params["b"]) ** 2)


@pytest.fixture
def trained():
    state = TrainState.create({"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}, optim.adam(1e-2), 0)
    step = make_train_step(loss)
    batch = jnp.ones((4, 3))
    state, _ = step(state, batch)  # the first call (full audit)
    state, _ = step(state, batch)  # a fast-path call
    return step, state, batch


def test_the_previous_result_takes_the_fast_path(trained):
    step, state, batch = trained
    audit = step._audit
    leaves = audit.before(state, batch)
    assert audit._fast  # the deferred checks
    result = audit.call(step.jitted, state, batch)
    audit.after(state, leaves, result)
    other = jax.tree.map(lambda x: x, result[0])  # same leaves, another object: full audit
    audit.before(other, batch)
    assert not audit._fast


def test_previous_result_donated_to_another_program_is_named(trained):
    step, state, batch = trained
    other = make_train_step(loss)
    other(state, batch)  # donates `state`, which is still `step`'s previous result
    with pytest.raises(DonationError, match=r"the array at `step` was already deleted"):
        step(state, batch)


def test_previous_result_with_a_shared_buffer_put_in_is_named(trained):
    step, state, batch = trained
    state.params["b"] = state.opt_state[0].mu["b"]  # a dict inside the frozen state, mutated
    with pytest.raises(DonationError, match=r"the same buffer appears at"):
        step(state, batch)
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(state))


def test_previous_result_read_as_the_batch_is_named(trained):
    step, state, _ = trained
    with pytest.raises(DonationError, match=r"`batch` leaf `<root>` is the state leaf `params.w`"):
        step(state, state.params["w"])
    assert not state.params["w"].is_deleted()
    many = {str(i): jnp.ones((4, 3)) for i in range(5)} | {"w": state.params["w"]}
    with pytest.raises(DonationError, match=r"`batch` leaf `w` is the state leaf `params.w`"):
        step(state, many)  # more than a few batch leaves: compared through one set


def test_previous_result_with_a_numpy_leaf_put_in_is_checked(trained):
    step, state, batch = trained
    state.params["b"] = np.zeros(2, np.float32)  # not a jax.Array: not donated, not flagged
    state, _ = step(state, batch)
    assert int(state.step) == 3


def test_live_view_of_the_previous_result_is_named(trained):
    step, state, batch = trained
    if jax.default_backend() != "cpu":
        pytest.skip("a NumPy view shares a buffer only on CPU")
    view = np.asarray(state.params["w"])
    with pytest.raises(DonationError, match=r"the donated state leaf `params.w` kept its buffer"):
        step(state, batch)
    del view


def test_an_unrelated_failure_is_not_blamed_on_donation(trained):
    step, state, _ = trained
    with pytest.raises(TypeError):
        step(state, jnp.ones((4, 5)))  # a shape error in the loss: not a DonationError
    assert not state.params["w"].is_deleted()
