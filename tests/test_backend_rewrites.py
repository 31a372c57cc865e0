"""The backend table of CPU-only rewrites (`jaxwise._shared._backends`), with the backend injected.

Each rewrite is on for ``"cpu"`` and off for ``"tpu"`` (where it was not measured faster), and
its results are the same either way. These run on the CPU: `assume_backend` only changes the
choice, never the device.
"""

import re

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import host_default, host_float64

from jaxwise import optim
from jaxwise._shared._backends import REWRITES, assume_backend, current_backend, rewrite_on
from jaxwise._shared._random import draw_length, flat_draw, padded_length
from jaxwise.compilation import CompileBudget, canonical_convolutions
from jaxwise.compilation._convolution import canonical_specs
from jaxwise.privacy import poisson_batch
from jaxwise.privacy._mechanisms._noise import flat_normal, flat_size
from jaxwise.train import TrainState, make_train_epoch


def test_the_table_says_cpu_on_and_tpu_off():
    assert set(REWRITES) == {"canonical_convolutions", "padded_draws", "branching_guard"}
    for name in REWRITES:
        assert rewrite_on(name, "cpu") and rewrite_on(name, "CPU")
        assert not rewrite_on(name, "tpu")
        assert rewrite_on(name, "gpu") == (name == "branching_guard")
        with assume_backend("tpu"):
            assert current_backend() == "tpu" and not rewrite_on(name)
        assert current_backend() == jax.default_backend()
    with pytest.raises(ValueError, match="`name` must be one of"):
        rewrite_on("conv", "cpu")
    with pytest.raises(TypeError, match="`backend`"):
        with assume_backend(""):
            pass


# -- the convolution rewrite ---------------------------------------------------------------

NCHW = ("NCHW", "OIHW", "NCHW")


def _conv_specs(jaxpr):
    specs = [
        tuple(tuple(s) for s in eqn.params["dimension_numbers"])
        for eqn in jaxpr.eqns
        if eqn.primitive.name == "conv_general_dilated"
    ]
    return specs + [s for sub in jex.subjaxprs(jaxpr) for s in _conv_specs(sub)]


def _scanned_grads(k, x):
    def body(c, _):
        def loss(k):
            y = jax.lax.conv_general_dilated(x, k * c, (1, 1), "SAME", dimension_numbers=NCHW)
            return jnp.sum(jnp.sin(y))

        return c * 0.5, jax.grad(loss)(k)

    return jax.lax.scan(body, jnp.ones(()), length=2)


def test_convolution_rewrite_is_on_for_cpu_and_off_for_tpu_with_equal_results():
    rng = np.random.default_rng(0)
    x64, k64 = rng.normal(size=(4, 2, 6, 6)), 0.3 * rng.normal(size=(3, 2, 3, 3))
    x, k = jnp.asarray(x64, jnp.float32), jnp.asarray(k64, jnp.float32)
    canonical = {tuple(canonical_specs(2))}
    results = {}
    for backend in ("cpu", "tpu"):
        f = canonical_convolutions(_scanned_grads, backend=backend)
        specs = set(_conv_specs(jax.make_jaxpr(f)(k, x).jaxpr))
        assert (specs == canonical) == (backend == "cpu"), backend
        with assume_backend(backend):  # the same choice, read from the context at trace time
            traced = canonical_convolutions(_scanned_grads)
            assert (set(_conv_specs(jax.make_jaxpr(traced)(k, x).jaxpr)) == canonical) == (
                backend == "cpu"
            )
        results[backend] = jax.jit(f)(k, x)
    with host_float64():  # the referee, in float64 on the host
        want = jax.jit(_scanned_grads)(jnp.asarray(k64), jnp.asarray(x64))
    for got in results.values():
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    # two programs, two float32 summation orders: within a few float32 units of the largest
    # term (a small entry took 2.5e-5 relative, 1.8e-6 absolute, on another x86 machine's
    # XLA:CPU, whose vector width sums in another order)
    for a, b in zip(jax.tree.leaves(results["cpu"]), jax.tree.leaves(results["tpu"])):
        scale = float(np.abs(np.asarray(b)).max())
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=2e-6 * scale)


DN = ("NHWC", "HWIO", "NHWC")


def _cnn_loss(p, batch):
    x, y = batch
    h = jax.nn.relu(jax.lax.conv_general_dilated(x, p["c"], (1, 1), "SAME", dimension_numbers=DN))
    logits = h.reshape(x.shape[0], -1) @ p["w"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


def test_cnn_epoch_rewrites_only_where_the_table_says_and_trains_the_same():
    # The rewrite exists for XLA:CPU, and the check reads XLA:CPU's convolution layouts from the
    # compiled program (XLA:TPU writes its own, and shows dots as convolutions): both choices
    # are compiled for the host on any machine.
    with host_default():
        _cnn_epoch_rewrites_only_where_the_table_says_and_trains_the_same()


def _cnn_epoch_rewrites_only_where_the_table_says_and_trains_the_same():
    ks = jax.random.split(jax.random.key(0), 3)
    params = {
        "c": 0.3 * jax.random.normal(ks[0], (3, 3, 1, 4)),
        "w": 0.1 * jax.random.normal(ks[1], (6 * 6 * 4, 3)),
    }
    x = jax.random.normal(ks[2], (16, 6, 6, 1))
    data = (x, (x[:, 0, 0, 0] > 0).astype(jnp.int32))
    out = {}
    for backend in ("cpu", "tpu"):
        state = TrainState.create(params, optim.sgd(0.1), 0)
        with assume_backend(backend):
            epoch = make_train_epoch(_cnn_loss, 8, donate=False)
            with CompileBudget(1, epoch, exact=True):
                out[backend] = epoch(state, data)
            hlo = epoch.jitted.lower(state, data).compile().as_text() or ""
            labels = set(re.findall(r"convolution\(.*?dim_labels=(\S+?),", hlo))
            assert (labels == {"b01f_01io->b01f"}) == (backend == "cpu"), labels
    (a, ma), (b, mb) = out["cpu"], out["tpu"]
    np.testing.assert_allclose(np.asarray(ma["loss"]), np.asarray(mb["loss"]), rtol=1e-5)
    for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-6)


# -- padded draws ----------------------------------------------------------------------------


def _draw_sizes(fn, *args):
    """The sizes of the random draws in ``fn``'s program (``random_bits`` outputs)."""
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    found = []

    def walk(j):
        for eqn in j.eqns:
            if eqn.primitive.name in ("random_bits", "threefry2x32"):
                found.extend(int(np.prod(v.aval.shape)) for v in eqn.outvars)
        for sub in jex.subjaxprs(j):
            walk(sub)

    walk(jaxpr)
    return found


@pytest.mark.parametrize("n", [5, 67331])
def test_draws_are_padded_for_cpu_only_and_bit_identical(n):
    key = jax.random.key(3)
    assert draw_length(n, "cpu") == padded_length(n) > n and draw_length(n, "tpu") == n
    got = {}
    for backend in ("cpu", "tpu"):
        with assume_backend(backend):

            def normal(k):
                return flat_draw(lambda k, s: jax.random.normal(k, s), k, n)

            coin = flat_draw(lambda k, s: jax.random.bernoulli(k, 0.3, s), key, n)
            sizes = _draw_sizes(normal, key)
            got[backend] = (np.asarray(jax.jit(normal)(key)), np.asarray(coin))
        assert max(sizes) == draw_length(n, backend)
    direct = np.asarray(jax.random.normal(key, (n,)))
    assert got["cpu"][0].tobytes() == got["tpu"][0].tobytes() == direct.tobytes()
    assert np.array_equal(got["cpu"][1], got["tpu"][1])


def test_poisson_mask_and_dp_noise_are_the_same_for_either_backend():
    key = jax.random.key(11)
    like = {"w": jnp.zeros((7, 3)), "b": jnp.zeros(5)}  # 26 entries: padded to 32 on CPU
    out = {}
    for backend in ("cpu", "tpu"):
        with assume_backend(backend):
            idx, mask, over = jax.jit(lambda k: poisson_batch(k, 1001, 0.05, 120))(key)
            z = jax.jit(lambda k: flat_normal(k, like, extra=1))(key)
            out[backend] = (np.asarray(idx), np.asarray(mask), bool(over), np.asarray(z))
            assert flat_size(like) == 32  # the noise vector's layout: padded on every backend
    cpu, tpu = out["cpu"], out["tpu"]
    assert np.array_equal(cpu[0], tpu[0]) and np.array_equal(cpu[1], tpu[1]) and cpu[2] == tpu[2]
    assert cpu[3].shape == (40,) and tpu[3].shape == (33,)
    assert cpu[3][:33].tobytes() == tpu[3].tobytes()  # the gradient's block and the policy's
