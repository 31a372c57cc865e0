"""`jaxwise._shared._buffers`: was a donated buffer reused? Both JAX forms of a live NumPy view,
and no false alarm where XLA merely declines to reuse a buffer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise._shared._buffers import buffer_ids, donated_buffers, kept, unvouch, vouch

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="a NumPy view shares a buffer only on CPU"
)


def _donating(x):
    return jax.jit(lambda a: a + 1.0, donate_argnums=0)(x)


def test_a_clean_donation_keeps_nothing():
    x = jnp.arange(64.0)
    out = _donating(x)
    assert x.is_deleted() and kept([x], donated_buffers([x]), out) == []
    np.testing.assert_array_equal(np.asarray(out), np.arange(64.0) + 1.0)


def test_a_clean_donation_of_a_leaf_held_twice_reads_its_address_and_keeps_nothing():
    x = jnp.arange(64.0)
    again = {"x": x}  # a second holder: no longer the fast answer, the buffer is compared
    before = donated_buffers([x])
    assert before is not None and before[0] == (x.unsafe_buffer_pointer(),)
    out = _donating(x)
    assert x.is_deleted() and kept([x], before, out) == []
    del again


def test_no_address_is_read_unless_some_leaf_is_held_beyond_its_pytree():
    # a training loop's state: each leaf held by its container and the leaves list only; a
    # NumPy view's memoryview holds the array too, so only then are the buffers compared
    state = {"w": jnp.arange(8.0), "b": {"c": jnp.zeros(3)}}
    assert donated_buffers(jax.tree.leaves(state)) is None
    view = np.asarray(state["b"]["c"])  # noqa: JW011 - the pitfall under test
    leaves = jax.tree.leaves(state)
    before = donated_buffers(leaves)
    assert before is not None and all(len(ids) == 1 for ids in before)
    out = jax.jit(lambda s: jax.tree.map(lambda a: a + 1.0, s), donate_argnums=0)(state)
    assert [leaves[i] is state["b"]["c"] for i in kept(leaves, before, out)] == [True]
    del view


def test_a_live_numpy_view_is_kept_whatever_jax_does_with_the_array():
    x = jnp.arange(64.0)
    view = np.asarray(x)  # noqa: JW011 - the pitfall under test
    before = donated_buffers([x])
    out = _donating(x)
    # JAX <= 0.12.0 leaves x alive; 0.12.1 deletes it while the view keeps its buffer
    assert kept([x], before, out) == [0]
    np.testing.assert_array_equal(view, np.arange(64.0))  # the old buffer, still readable
    del view


def test_without_addresses_only_an_undeleted_array_counts():
    x = jnp.arange(64.0)
    view = np.asarray(x)  # noqa: JW011 - the pitfall under test
    out = _donating(x)
    assert kept([x], None, out) == ([] if x.is_deleted() else [0])
    del view


def test_a_buffer_xla_declines_to_reuse_without_a_view_is_no_alarm():
    # XLA:CPU copies a donated buffer it cannot use in place (here: one device_put without
    # aliasing); the array is deleted, no output lives in its buffer, and nothing holds it
    x = jax.device_put(np.arange(64.0, dtype=np.float32), may_alias=False)
    before = donated_buffers([x])
    out = _donating(x)
    assert kept([x], before, out) == []


def test_buffer_ids_of_a_sharded_array_name_every_shard():
    devices = jax.devices("cpu")[:4]
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    x = jax.device_put(jnp.arange(16.0), spec)
    assert len(set(buffer_ids(x))) == len(devices)
    deleted = jnp.arange(3.0)
    deleted.delete()
    assert buffer_ids(deleted) == (id(deleted),)


def test_non_arrays_are_neither_measured_nor_kept():
    assert donated_buffers([1.0, "x"]) is None
    x = jnp.arange(4.0)
    before = donated_buffers([x, 3])
    assert before is not None and before[1] == ()
    out = _donating(x)
    assert kept([x, 3], before, out) == []


def test_a_donated_sharded_array_is_checked_shard_by_shard():
    # one C-level call per leaf is the fast path; a multi-shard array has no single buffer
    # pointer, so the check falls back to every shard's buffer, with the same answer
    mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:4]), ("d",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    x = jax.device_put(jnp.arange(16.0), spec)
    plain = jnp.arange(4.0)
    held = (x, plain)  # a second holder of each: the buffers are read
    before = donated_buffers([x, plain])
    assert before is not None and len(before[0]) == 4 and len(before[1]) == 1
    out = jax.jit(lambda a, b: (a + 1.0, b * 2.0), donate_argnums=(0, 1))(x, plain)
    assert x.is_deleted() and plain.is_deleted()
    assert kept([x, plain], before, out) == []
    np.testing.assert_array_equal(np.asarray(out[0]), np.arange(16.0) + 1.0)
    del held


def test_a_deleted_output_is_not_read_for_its_buffer():
    x = jnp.arange(64.0)
    view = np.asarray(x)  # noqa: JW011 - the pitfall under test
    before = donated_buffers([x])
    out = _donating(x)
    other = jnp.ones(3)
    other.delete()
    assert kept([x], before, (out, other)) == [0]  # the view still holds x's buffer
    del view


def test_a_check_nested_in_a_vouched_call_of_the_same_leaves_reads_no_address():
    # an audited step found no view possible and vouches for its leaves during the call; a
    # watch of the program it calls checks the same leaves from a list of its own (one more
    # reference each), and reads nothing either — but only for exactly those leaves
    state = {"w": jnp.arange(8.0), "b": jnp.zeros(3)}
    outer = jax.tree.leaves(state)
    assert donated_buffers(outer) is None
    nested = list(outer)  # the second holder the watch's list is
    assert donated_buffers(nested) is not None
    previous = vouch(outer)
    try:
        assert donated_buffers(list(outer)) is None
        assert donated_buffers([*outer, jnp.ones(2)]) is not None  # not the same leaves
        assert donated_buffers(outer[::-1]) is not None
    finally:
        unvouch(previous)
    assert donated_buffers(nested) is not None
