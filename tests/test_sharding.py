"""Meshes and placement: data_mesh, place_state/place_batch, FSDP-style parameter sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import mesh_devices
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxwise import optim
from jaxwise.compilation import CompileCounter
from jaxwise.sharding import (
    data_mesh,
    fsdp_mesh,
    place_batch,
    place_state,
    replicated,
    state_shardings,
)
from jaxwise.train import TrainState, make_train_epoch, make_train_step
from jaxwise.train._program._placement import constrain_state


def loss_fn(params, batch):
    x, y = batch
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def init_params(key, d_in=64, hidden=256, d_out=8):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (d_in, hidden)) / np.sqrt(d_in),
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k2, (hidden, d_out)) / np.sqrt(hidden),
    }


def batches(n, size=32, d_in=64, d_out=8, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (
            rng.normal(size=(size, d_in)).astype(np.float32),
            rng.normal(size=(size, d_out)).astype(np.float32),
        )
        for _ in range(n)
    ]


def test_data_mesh_and_shardings():
    mesh = data_mesh(mesh_devices(4))
    assert mesh.axis_names == ("data",) and mesh.devices.size == 4
    assert data_mesh().devices.size == len(jax.devices())
    x = place_batch(np.ones((8, 3), np.float32), NamedSharding(mesh, P("data")))
    assert x.sharding.spec == P("data") and x.addressable_shards[0].data.shape == (2, 3)


def test_place_state_keeps_placed_leaves_and_types(key):
    mesh = data_mesh(mesh_devices(4))
    state = TrainState.create(init_params(key), optim.adam(1e-3), jax.random.key(3))
    placed = place_state(state, replicated(mesh))
    assert all(leaf.sharding == replicated(mesh) for leaf in jax.tree.leaves(placed))
    assert jnp.issubdtype(placed.key.dtype, jax.dtypes.prng_key)
    again = place_state(placed, replicated(mesh))
    assert all(a is b for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(placed)))


def test_fsdp_mesh_and_state_shardings_rule():
    mesh = fsdp_mesh(4, mesh_devices(8))
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    tree = {
        "big": jnp.zeros((64, 256)),  # largest dim 256 divisible by 4 -> sharded along axis 1
        "tall": jnp.zeros((512, 6)),  # axis 0
        "odd": jnp.zeros((1023, 3)),  # no dimension divisible by 4 -> replicated
        "small": jnp.zeros((16, 16)),  # below min_size -> replicated
        "count": jnp.zeros((), jnp.int32),
        "key": jax.random.key(0),
    }
    specs = jax.tree.map(lambda s: s.spec, state_shardings(tree, mesh))
    assert specs == {
        "big": P(None, "model"),
        "tall": P("model"),
        "odd": P(),
        "small": P(),
        "count": P(),
        "key": P(),
    }
    assert state_shardings({"x": jnp.zeros((64, 64))}, mesh, min_size=10**6)["x"].spec == P()
    plain = data_mesh(mesh_devices(4))
    assert state_shardings(tree, plain)["big"].spec == P()
    assert constrain_state(tree, plain) is tree
    with pytest.raises(ValueError, match=r"`model` \(3\) must divide the number of devices \(8\)"):
        fsdp_mesh(3, mesh_devices(8))
    with pytest.raises(ValueError, match="`model` must be >= 1"):
        fsdp_mesh(0)


def _train(mesh, optimizer, data):
    step = make_train_step(loss_fn, mesh=mesh)
    state = TrainState.create(init_params(jax.random.key(0)), optimizer, 0)
    with CompileCounter(step) as counter:
        for batch in data:
            state, metrics = step(state, batch)
    return step, state, counter.count


def test_fsdp_step_compiles_once_and_matches_replicated_training():
    data = batches(4)
    tx = optim.sgd(0.1, momentum=0.9)
    fsdp_step, fsdp, compiles = _train(fsdp_mesh(4, mesh_devices(8)), tx, data)
    _, replicated_state, _ = _train(data_mesh(mesh_devices(8)), tx, data)
    _, single, _ = _train(None, tx, data)
    assert compiles == 1
    assert fsdp.params["w1"].sharding.spec == P(None, "model")
    assert fsdp.opt_state[0].trace["w1"].sharding.spec == P(None, "model")  # momentum sharded too
    assert fsdp.params["b1"].sharding.spec == P()
    for name in ("w1", "b1", "w2"):
        np.testing.assert_allclose(
            np.asarray(fsdp.params[name]), np.asarray(single.params[name]), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(
            np.asarray(replicated_state.params[name]),
            np.asarray(single.params[name]),
            rtol=1e-5,
            atol=1e-6,
        )


def _argument_bytes(mesh, optimizer):
    step = make_train_step(loss_fn, mesh=mesh)
    state = TrainState.create(init_params(jax.random.key(0), d_in=128, hidden=512), optimizer, 0)
    batch = batches(1, d_in=128)[0]
    state, _ = step(state, batch)
    stats = step.jitted.lower(state, batch).compile().memory_analysis()
    assert stats is not None
    return stats.argument_size_in_bytes


def test_fsdp_holds_a_quarter_of_params_and_adam_moments_per_device():
    tx = optim.adam(1e-3)
    sharded = _argument_bytes(fsdp_mesh(4, mesh_devices(8)), tx)
    full = _argument_bytes(data_mesh(mesh_devices(8)), tx)
    state_bytes = 3 * 4 * (128 * 512 + 512 + 512 * 8)  # params + mu + nu, float32
    assert full >= state_bytes
    assert sharded < 0.30 * full  # ~1/4 of the big leaves per device (+ small replicated ones)


def test_fsdp_epoch_keeps_the_layout():
    tx = optim.sgd(0.1)
    mesh = fsdp_mesh(2, mesh_devices(4))
    epoch = make_train_epoch(loss_fn, 16, mesh=mesh)
    state = TrainState.create(init_params(jax.random.key(0)), tx, 0)
    x, y = (np.concatenate(parts) for parts in zip(*batches(2)))
    with CompileCounter(epoch) as counter:
        for _ in range(2):
            state, _ = epoch(state, (x, y))
    assert counter.count == 1 and int(state.step) == 8
    assert state.params["w1"].sharding.spec == P(None, "model")
