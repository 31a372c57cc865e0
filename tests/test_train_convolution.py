"""Tests for jaxwise.compilation.canonical_convolutions: canonical convolutions in the epoch.

XLA:CPU canonicalizes convolutions (for Eigen) only outside loops; a CNN epoch's gradient
convolutions inside the scan ran as naive loop nests (issue #29). These tests check the
rewrite against float64 and the compiled epoch's convolutions, never a timing; and that it
keeps keyword arguments and collectives' axis names inside ``shard_map`` and a named ``vmap``
(issue #36: `NameError: Found an unbound axis name` through `make_train_epoch`).
"""

import functools
import re

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import host_float64, mesh_devices
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxwise import optim
from jaxwise.compilation import CompileBudget, canonical_convolutions
from jaxwise.compilation._convolution import canonical_specs
from jaxwise.train import TrainState, make_train_epoch, make_train_step
from jaxwise.train._program._sampler import shuffle_hash

CASES = [
    # (input shape, kernel shape, dimension numbers, keyword arguments)
    ((2, 3, 9, 8), (4, 3, 3, 2), ("NCHW", "OIHW", "NCHW"), {"window_strides": (2, 1)}),
    (
        (2, 9, 8, 6),
        (3, 3, 3, 4),
        ("NHWC", "HWIO", "NHWC"),
        {"rhs_dilation": (2, 1), "feature_group_count": 2},
    ),
    ((2, 9, 5), (3, 5, 4), ("NWC", "WIO", "NCW"), {"lhs_dilation": (2,), "padding": [(1, 2)]}),
    ((2, 4, 4, 5, 3), (2, 2, 2, 3, 4), ("NDHWC", "DHWIO", "NDHWC"), {}),
]

# canonical_convolutions is XLA:CPU's rewrite: elsewhere `fn` runs as it is, and the tests
# check the numbers only (the program's structure is checked where the rewrite is on).
ON_CPU = jax.default_backend() == "cpu"
XLA_CPU_ONLY = "inspects XLA:CPU's rewritten convolutions (the rewrite is for XLA:CPU only)"


def _conv_loss(dn, kw):
    def loss(k, x):
        strides = kw.get("window_strides", (1,) * (x.ndim - 2))
        padding = kw.get("padding", "SAME")
        rest = {key: v for key, v in kw.items() if key not in ("window_strides", "padding")}
        y = jax.lax.conv_general_dilated(x, k, strides, padding, dimension_numbers=dn, **rest)
        return jnp.sum(jnp.sin(y))

    return loss


def _nested(loss):
    """Gradients in a scan, through remat, a cond and a jit: every kind of sub-program."""

    def run(k, x):
        def body(c, _):
            grads = jax.grad(jax.checkpoint(loss), argnums=(0, 1))(k * c, x)
            value = jax.lax.cond(c > 0, lambda: jax.jit(loss)(k * c, x), lambda: 0.0 * c)
            return c * 0.5, (grads, value)

        return jax.lax.scan(body, jnp.ones((), k.dtype), length=2)

    return run


@pytest.mark.parametrize("xs, ks, dn, kw", CASES, ids=[c[2][0] for c in CASES])
def test_rewrite_matches_float64_in_every_sub_program(xs, ks, dn, kw):
    rng = np.random.default_rng(0)
    x64, k64 = rng.normal(size=xs), rng.normal(size=ks)
    run = _nested(_conv_loss(dn, kw))
    with host_float64():
        want = jax.jit(run)(jnp.asarray(k64), jnp.asarray(x64))
    rewritten = canonical_convolutions(run)
    got = jax.jit(rewritten)(jnp.asarray(k64, jnp.float32), jnp.asarray(x64, jnp.float32))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == jnp.float32 and a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-4)
    if not ON_CPU:  # XLA_CPU_ONLY: elsewhere the program is `run` itself
        return
    # every convolution of the rewritten program, at every depth, is canonical
    specs = _conv_specs(jax.make_jaxpr(rewritten)(jnp.ones(ks), jnp.ones(xs)).jaxpr)
    assert len(specs) == 5  # forward x3 (grad, cond, remat recompute), kernel and input grads
    assert set(specs) == {tuple(canonical_specs(len(xs) - 2))}
    before = _conv_specs(jax.make_jaxpr(run)(jnp.ones(ks), jnp.ones(xs)).jaxpr)
    assert len(before) == 5 and set(before) != set(specs)  # the gradients were not canonical


def _conv_specs(jaxpr):
    """The dimension numbers of every convolution in ``jaxpr``, sub-programs included."""
    specs = [
        tuple(tuple(s) for s in eqn.params["dimension_numbers"])
        for eqn in jaxpr.eqns
        if eqn.primitive.name == "conv_general_dilated"
    ]
    return specs + [s for sub in jex.subjaxprs(jaxpr) for s in _conv_specs(sub)]


def test_a_program_without_convolutions_is_unchanged():
    def f(a, b):
        return jax.lax.scan(lambda c, x: (c + x @ b, c), a, jnp.ones((3, 2)))

    a, b = jnp.ones(2), jnp.eye(2)
    assert str(jax.make_jaxpr(canonical_convolutions(f))(a, b)) == str(jax.make_jaxpr(f)(a, b))


DN = ("NHWC", "HWIO", "NHWC")


def cnn_loss(p, batch):
    x, y = batch
    h = jax.lax.conv_general_dilated(x, p["c1"], (1, 1), "SAME", dimension_numbers=DN)
    h = jax.nn.relu(h)
    h = jax.lax.conv_general_dilated(h, p["c2"], (2, 2), "SAME", dimension_numbers=DN)
    logits = jax.nn.relu(h).reshape(x.shape[0], -1) @ p["w"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


@pytest.fixture
def cnn():
    ks = jax.random.split(jax.random.key(0), 4)
    params = {
        "c1": 0.3 * jax.random.normal(ks[0], (3, 3, 1, 4)),
        "c2": 0.2 * jax.random.normal(ks[1], (3, 3, 4, 8)),
        "w": 0.1 * jax.random.normal(ks[2], (4 * 4 * 8, 3)),
    }
    x = jax.random.normal(ks[3], (24, 8, 8, 1))
    data = (x, (x[:, 0, 0, 0] > 0).astype(jnp.int32))
    tx = optim.sgd(0.1)
    return tx, TrainState.create(params, tx, 0), data


@pytest.mark.skipif(not ON_CPU, reason=XLA_CPU_ONLY)
def test_cnn_epoch_compiles_only_canonical_convolutions(cnn):
    """The regression test of issue #29: the scan body's gradient convolutions run via Eigen."""
    tx, state, data = cnn
    epoch = make_train_epoch(cnn_loss, 8, donate=False)
    hlo = epoch.jitted.lower(state, data).compile().as_text() or ""
    assert "while" in hlo
    labels = re.findall(r"convolution\(.*?dim_labels=(\S+?),", hlo)
    assert len(labels) >= 5  # 2 forward, 2 kernel gradients, 1 input gradient
    assert set(labels) == {"b01f_01io->b01f"}


def test_cnn_epoch_equals_the_steps_and_compiles_once(cnn):
    tx, state, data = cnn
    twin = jax.tree.map(lambda a: jnp.array(a, copy=True), state)
    epoch = make_train_epoch(cnn_loss, 8)
    with CompileBudget(1, epoch, exact=True):
        new, metrics = epoch(state, data)
    order = np.asarray(jnp.argsort(shuffle_hash(twin.key, twin.step, 24))).reshape(3, 8)
    step = make_train_step(cnn_loss)
    losses = []
    for idx in order:
        twin, m = step(twin, (data[0][idx], data[1][idx]))
        losses.append(float(m["loss"]))
    np.testing.assert_allclose(np.asarray(metrics["loss"]), losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(twin.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


# -- keyword arguments, collectives and named axes (issue #36) -----------------------------

NCHW = ("NCHW", "OIHW", "NCHW")


def _conv(x, k):
    return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=NCHW)


def _conv_data(dtype=jnp.float32):
    """``(x, k)`` in ``dtype`` (float64: call it under ``jax.enable_x64``)."""
    rng = np.random.default_rng(1)
    x, k = rng.normal(size=(8, 2, 5, 5)), 0.3 * rng.normal(size=(3, 2, 3, 3))
    return jnp.asarray(x, dtype), jnp.asarray(k, dtype)


def test_keyword_arguments_are_kept():
    def f(x, k, *, scale, shift=0.0):
        return scale * _conv(x, k) + shift

    x, k = _conv_data()
    got = jax.jit(canonical_convolutions(f))(x, k, scale=2.0, shift=jnp.float32(1.0))
    np.testing.assert_allclose(got, f(x, k, scale=2.0, shift=1.0), rtol=1e-5, atol=1e-5)
    got = canonical_convolutions(f)(x, k=k, scale=3.0)
    np.testing.assert_allclose(got, f(x, k, scale=3.0), rtol=1e-5, atol=1e-5)


def _sharded_grads(collective):
    """Kernel gradients of a conv loss in a scan, the loss reduced by ``collective`` inside
    ``shard_map`` over 4 devices (the sub-programs are traced inside the mesh axes)."""
    mesh = Mesh(np.asarray(mesh_devices(4)), ("data",))

    def loss(k, x):
        def body(k, x):
            return collective(jnp.sum(jnp.sin(_conv(x, k))), "data")

        spec = (P(), P("data"))
        return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P())(k, x)

    def run(k, x):
        def step(c, _):
            value, grad = jax.value_and_grad(loss)(k * c, x)
            return c * 0.5, (value, grad)

        return jax.lax.scan(step, jnp.ones((), k.dtype), length=2)[1]

    return run


@pytest.mark.parametrize("collective", [jax.lax.psum, jax.lax.pmean], ids=["psum", "pmean"])
def test_rewrite_inside_shard_map_with_a_collective(collective):
    x, k = _conv_data()
    run = _sharded_grads(collective)
    rewritten = canonical_convolutions(run)
    values, grads = jax.jit(rewritten)(k, x)
    with host_float64():
        x64, k64 = _conv_data(jnp.float64)
        want_values, want_grads = jax.jit(run)(k64, x64)
    np.testing.assert_allclose(values, want_values, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grads, want_grads, rtol=1e-4, atol=1e-4)
    if not ON_CPU:  # XLA_CPU_ONLY
        return
    specs = _conv_specs(jax.make_jaxpr(rewritten)(k, x).jaxpr)
    assert len(specs) == 2  # the forward and the kernel gradient, both in shard_map bodies
    assert set(specs) == {tuple(canonical_specs(2))}
    assert set(_conv_specs(jax.make_jaxpr(run)(k, x).jaxpr)) != set(specs)


@pytest.mark.parametrize(
    "mapper", [jax.vmap, functools.partial(jax.pmap, devices=mesh_devices(3))], ids=["vmap", "pmap"]
)
def test_rewrite_inside_a_named_axis(mapper):
    """``canonical_convolutions`` traced inside a ``vmap``/``pmap`` with ``axis_name``."""

    def per_model(k, x):
        def step(c, _):
            grad = jax.grad(lambda k: jax.lax.psum(jnp.sum(jnp.sin(_conv(x, k))), "m"))(k * c)
            return c * 0.5, grad

        return jax.lax.scan(step, jnp.ones((), k.dtype), length=2)[1]

    x, k = _conv_data()
    ks = jnp.stack([k, 2 * k, -k])
    rewritten = mapper(canonical_convolutions(per_model), in_axes=(0, None), axis_name="m")
    got = rewritten(ks, x)
    with host_float64():
        x64, k64 = _conv_data(jnp.float64)
        ks64 = jnp.stack([k64, 2 * k64, -k64])
        want = jax.jit(jax.vmap(per_model, (0, None), axis_name="m"))(ks64, x64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if ON_CPU:  # XLA_CPU_ONLY
        specs = _conv_specs(jax.make_jaxpr(rewritten)(ks, x).jaxpr)
        assert specs and set(specs) == {tuple(canonical_specs(2))}


def sharded_cnn_loss(collective):
    """A non-canonical (NCHW) convolution inside ``shard_map``, the loss a ``collective``."""
    mesh = Mesh(np.asarray(mesh_devices(4)), ("data",))

    def body(p, x, y):
        h = jax.nn.relu(_conv(x, p["c"]))
        logits = h.reshape(x.shape[0], -1) @ p["w"]
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1)
        return collective(jnp.mean(nll), "data")

    def loss(p, batch):
        spec = (P(), P("data"), P("data"))
        return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P())(p, *batch)

    return loss


@pytest.mark.parametrize("collective", [jax.lax.psum, jax.lax.pmean], ids=["psum", "pmean"])
def test_sharded_conv_loss_trains_through_the_epoch_compiled_once(collective):
    """Issue #36: this epoch raised `NameError: Found an unbound axis name: data`."""
    ks = jax.random.split(jax.random.key(2), 3)
    params = {
        "c": 0.3 * jax.random.normal(ks[0], (3, 2, 3, 3)),
        "w": 0.1 * jax.random.normal(ks[1], (3 * 5 * 5, 2)),
    }
    x = jax.random.normal(ks[2], (24, 2, 5, 5))
    data = (x, (x[:, 0, 2, 2] > 0).astype(jnp.int32))
    state = TrainState.create(params, optim.sgd(0.1), 0)
    twin = jax.tree.map(lambda a: jnp.array(a, copy=True), state)
    loss = sharded_cnn_loss(collective)
    epoch = make_train_epoch(loss, 8)
    with CompileBudget(1, epoch, exact=True):
        new, metrics = epoch(state, data)
    order = np.asarray(jnp.argsort(shuffle_hash(twin.key, twin.step, 24))).reshape(3, 8)
    step = make_train_step(loss)  # the un-rewritten program, step by step
    losses = []
    for idx in order:
        twin, m = step(twin, (data[0][idx], data[1][idx]))
        losses.append(float(m["loss"]))
    np.testing.assert_allclose(np.asarray(metrics["loss"]), losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(twin.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    if ON_CPU:  # XLA_CPU_ONLY
        hlo = epoch.jitted.lower(new, data).compile().as_text() or ""
        labels = re.findall(r"convolution\(.*?dim_labels=(\S+?),", hlo)
        assert labels and set(labels) == {"b01f_01io->b01f"}
