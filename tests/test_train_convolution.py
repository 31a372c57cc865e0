"""Tests for jaxwise.train._convolution: canonical convolutions inside the scanned epoch.

XLA:CPU canonicalizes convolutions (for Eigen) only outside loops; a CNN epoch's gradient
convolutions inside the scan ran as naive loop nests (issue #29). These tests check the
rewrite against float64 and the compiled epoch's convolutions, never a timing.
"""

import re

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim
from jaxwise.compilation import CompileBudget
from jaxwise.train import TrainState, make_train_epoch, make_train_step
from jaxwise.train._convolution import canonical_convolutions, canonical_specs
from jaxwise.train._sampler import shuffle_hash

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
    with jax.enable_x64(True):
        want = jax.jit(run)(jnp.asarray(k64), jnp.asarray(x64))
    rewritten = canonical_convolutions(run)
    got = jax.jit(rewritten)(jnp.asarray(k64, jnp.float32), jnp.asarray(x64, jnp.float32))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == jnp.float32 and a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-4)
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
