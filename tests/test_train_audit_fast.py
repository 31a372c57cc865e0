"""The donation audit's fast path: a state that is the previous call's result.

Such a state's deleted-leaf and shared-buffer checks are deferred to a failing call
(`Audit.call`); these tests show that every mistake the full audit catches is still caught,
named, and leaves the state intact, when the state *object* is the previous result. Each runs
twice: on the host (CPU: the after-call check for live NumPy views still reads the leaves) and
off it (an accelerator's state, stood in for by `off_host`: the state is not even flattened,
and a mistake is named only once XLA refuses the call).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim
from jaxwise.train import DonationError, TrainState, make_train_step
from jaxwise.train._program import _donation


def loss(params, batch):
    return jnp.sum((batch @ params["w"] + params["b"]) ** 2)


@pytest.fixture(params=["host", "off-host"])
def trained(request, monkeypatch):
    if request.param == "off-host":
        monkeypatch.setattr(_donation, "off_host", lambda leaves: True)
    state = TrainState.create({"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}, optim.adam(1e-2), 0)
    step = make_train_step(loss)
    batch = jnp.ones((4, 3))
    state, _ = step(state, batch)  # the first call (full audit)
    state, _ = step(state, batch)  # a fast-path call
    return step, state, batch


def test_the_previous_result_takes_the_fast_path(trained, monkeypatch, request):
    step, state, batch = trained
    audit = step._audit
    off = audit._off_host  # learned from the first call's result
    assert off == (request.node.callspec.params["trained"] == "off-host")
    if off:  # nothing is read after the call either

        def no_read(*args):
            raise AssertionError("an off-host fast path read the donated leaves")

        monkeypatch.setattr(_donation, "kept", no_read)
    leaves = audit.before(state, batch)
    assert audit._fast  # the deferred checks
    assert audit._deferred == off and (leaves == []) == off  # off the host: not flattened
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
    if jax.default_backend() != "cpu" or step._audit._off_host:
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
