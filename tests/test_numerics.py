"""Tests for jaxwise.numerics against naive versions, NumPy float64, jax.nn and Optax."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from host64 import host_float64
from jax.test_util import check_grads
from tolerance import rtol

from jaxwise import numerics as jn
from jaxwise.compilation import CompileBudget


def _finite(tree):
    return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(tree))


# ---------------------------------------------------------------------------
# Elementwise functions: (ours, naive, dangerous points, normal points,
#                         float64 value, float64 derivative)
# ---------------------------------------------------------------------------

ELEMENTWISE = {
    "safe_sqrt": (
        jn.safe_sqrt,
        lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0),
        [0.0],
        [0.3, 2.0, 7.5],
        np.sqrt,
        lambda x: 0.5 / np.sqrt(x),
    ),
    "safe_log": (
        jn.safe_log,
        lambda x: jnp.where(x > 0, jnp.log(x), 0.0),
        [0.0],
        [0.01, 0.5, 40.0],
        np.log,
        lambda x: 1.0 / x,
    ),
    "sinc": (
        jn.sinc,
        lambda x: jnp.sin(jnp.pi * x) / (jnp.pi * x),
        [0.0],
        [0.003, 0.25, 1.7, -2.2],
        np.sinc,
        lambda x: (np.cos(np.pi * x) - np.sinc(x)) / x,
    ),
    "logit": (
        jn.logit,
        lambda p: jnp.log(p) - jnp.log1p(-p),
        [0.0, 1.0],
        [0.01, 0.3, 0.9],
        lambda p: np.log(p / (1 - p)),
        lambda p: 1.0 / (p * (1 - p)),
    ),
}


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_naive_breaks_ours_does_not(name):
    ours, naive, danger, _, _, _ = ELEMENTWISE[name]
    for x in danger:
        assert not np.isfinite(float(jax.grad(naive)(x))), f"naive {name} should fail at {x}"
        assert np.isfinite(float(ours(x))) and np.isfinite(float(jax.grad(ours)(x)))
        assert np.isfinite(float(jax.grad(jax.grad(ours))(x)))


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_values_and_gradients_match_float64(name):
    ours, naive, _, normal, value64, deriv64 = ELEMENTWISE[name]
    x = np.asarray(normal, np.float64)
    with host_float64():
        xj = jnp.asarray(x)
        np.testing.assert_allclose(ours(xj), value64(x), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ours(xj), naive(xj), rtol=1e-12)
        grads = jax.vmap(jax.grad(ours))(xj)
        np.testing.assert_allclose(grads, deriv64(x), rtol=1e-9)
        for point in x[1:3]:
            check_grads(jax.jit(ours), (point,), order=2, modes=("fwd", "rev"), eps=1e-6)


def test_elementwise_float32_matches_float64(rng):
    x = rng.uniform(0.05, 0.95, size=64)
    for name, (ours, _, _, _, value64, deriv64) in ELEMENTWISE.items():
        # safe_log and logit are a float32 log: the device's log accuracy (table) bounds them
        np.testing.assert_allclose(
            ours(x.astype(np.float32)),
            value64(x),
            rtol=rtol("log", floor=2e-5),
            atol=1e-6,
            err_msg=name,
        )
        g = jax.vmap(jax.grad(ours))(jnp.asarray(x, jnp.float32))
        np.testing.assert_allclose(g, deriv64(x), rtol=2e-4, atol=1e-5, err_msg=name)


def test_sinc_derivatives_at_zero():
    with host_float64():
        assert float(jax.grad(jn.sinc)(0.0)) == 0.0
        np.testing.assert_allclose(
            float(jax.grad(jax.grad(jn.sinc))(0.0)), -(np.pi**2) / 3, rtol=1e-12
        )


def test_logit_clipped_values():
    assert float(jn.logit(0.0)) == -20.0 and float(jn.logit(1.0)) == 20.0


def test_safe_log_fill():
    assert float(jn.safe_log(0.0)) == pytest.approx(np.log(np.finfo(np.float32).tiny))
    assert float(jn.safe_log(-3.0, fill=-1.0)) == -1.0
    assert float(0.0 * jn.safe_log(0.0)) == 0.0


def test_double_where_generic():
    f = lambda x: jn.double_where(lambda t: 1.0 / t, x, x != 0, 1.0, 0.0)  # noqa: E731
    naive = lambda x: jnp.where(x != 0, 1.0 / x, 0.0)  # noqa: E731
    assert np.isnan(float(jax.grad(naive)(0.0)))
    assert float(jax.grad(f)(0.0)) == 0.0 and float(jax.grad(f)(2.0)) == -0.25
    with pytest.raises(TypeError, match="`fn` must be callable"):
        jn.double_where(3, 1.0, True, 1.0, 0.0)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="`ok` must be a boolean"):
        jn.double_where(jnp.log, 1.0, 1, 1.0, 0.0)


@pytest.mark.parametrize(
    ("ok_shape", "x_shape"), [((3,), (4,)), ((2, 3), (3, 2)), ((5, 1), (4, 2))]
)
def test_double_where_names_ok_when_it_does_not_broadcast(ok_shape, x_shape):
    x, ok = jnp.ones(x_shape), jnp.ones(ok_shape, bool)
    with pytest.raises(ValueError, match=r"`ok` must broadcast against `x`: got `ok` of shape"):
        jn.double_where(jnp.log, x, ok, 1.0, 0.0)
    with pytest.raises(ValueError, match="`ok` must broadcast"):  # also under jit
        jax.jit(lambda x, ok: jn.double_where(jnp.log, x, ok, 1.0, 0.0))(x, ok)


def test_double_where_broadcasts_ok_as_numpy_does():
    x = jnp.arange(1.0, 7.0).reshape(2, 3)
    ok = jnp.asarray([[True], [False]])
    out = jn.double_where(jnp.log, x, ok, 1.0, -1.0)
    # broadcasting is the point: the same device's log where `ok`, the fill elsewhere
    same_device = np.where(np.asarray(ok), np.asarray(jnp.log(x)), -1.0)
    np.testing.assert_allclose(np.asarray(out), same_device, rtol=1e-6)
    expected = np.where(np.asarray(ok), np.log(np.asarray(x, np.float64)), -1.0)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=rtol("log", floor=1e-6))


# ---------------------------------------------------------------------------
# entropy
# ---------------------------------------------------------------------------


def test_entropy_zero_probability():
    p = jnp.array([0.5, 0.5, 0.0])
    naive = lambda p: -jnp.sum(p * jnp.log(p))  # noqa: E731
    assert np.isnan(float(naive(p))) and not _finite(jax.grad(naive)(p))
    assert float(jn.entropy(p)) == pytest.approx(np.log(2.0))
    assert _finite(jax.grad(jn.entropy)(p)) and _finite(jax.hessian(jn.entropy)(p))


def test_entropy_matches_float64_and_gradient(rng):
    p = rng.dirichlet(np.ones(6), size=4)
    with host_float64():
        np.testing.assert_allclose(jn.entropy(jnp.asarray(p)), -(p * np.log(p)).sum(-1), rtol=1e-12)
        g = jax.grad(lambda q: jn.entropy(q).sum())(jnp.asarray(p))
        np.testing.assert_allclose(g, -(np.log(p) + 1), rtol=1e-10)
        check_grads(jax.jit(lambda q: jn.entropy(q)), (jnp.asarray(p[0]),), order=2, eps=1e-6)
        mask = jnp.asarray([True, True, True, False, False, False])
        np.testing.assert_allclose(
            jn.entropy(jnp.asarray(p[0]), where=mask), -(p[0, :3] * np.log(p[0, :3])).sum()
        )


# ---------------------------------------------------------------------------
# safe_norm and cosine_similarity
# ---------------------------------------------------------------------------


def test_safe_norm_zero_vector_and_hvp():
    zero = jnp.zeros(4)
    assert np.isnan(np.asarray(jax.grad(jnp.linalg.norm)(zero))).all()
    assert np.asarray(jax.grad(jn.safe_norm)(zero)).tolist() == [0.0] * 4
    hvp = jax.jvp(jax.grad(jn.safe_norm), (zero,), (jnp.ones(4),))[1]
    assert _finite(hvp)
    assert _finite(jax.hessian(jn.safe_norm)(zero))


@pytest.mark.parametrize(
    "axis, keepdims", [(None, False), (0, False), (1, True), ((0, 1), False), (-1, False)]
)
def test_safe_norm_matches_float64(rng, axis, keepdims):
    x = rng.normal(size=(5, 7))
    with host_float64():
        ours = jn.safe_norm(jnp.asarray(x), axis=axis, keepdims=keepdims)
        np.testing.assert_allclose(
            ours, np.linalg.norm(x, axis=axis, keepdims=keepdims), rtol=1e-13
        )
        g = jax.grad(lambda v: jn.safe_norm(v, axis=axis).sum())(jnp.asarray(x))
        n = np.linalg.norm(x, axis=axis, keepdims=True)
        np.testing.assert_allclose(g, x / n, rtol=1e-12)
        check_grads(
            jax.jit(lambda v: jn.safe_norm(v, axis=axis, keepdims=keepdims)),
            (jnp.asarray(x),),
            order=2,
        )


def test_safe_norm_extreme_magnitudes():
    for scale in (1e-30, 1e30):
        x = jnp.asarray([3.0, 4.0], jnp.float32) * scale
        assert float(jn.safe_norm(x)) == pytest.approx(5.0 * scale, rel=1e-6)
        np.testing.assert_allclose(jax.grad(jn.safe_norm)(x), [0.6, 0.8], rtol=1e-6)
    assert (
        float(jnp.linalg.norm(jnp.asarray([3e-30, 4e-30], jnp.float32))) == 0.0
    )  # naive underflows


def _cos_grad64(a, b):
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cos = a @ b / (na * nb)
    return b / (na * nb) - cos * a / na**2


def test_cosine_similarity_matches_float64(rng):
    a, b = rng.normal(size=(8, 5)), rng.normal(size=(8, 5))
    with host_float64():
        aj, bj = jnp.asarray(a), jnp.asarray(b)
        expected = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        np.testing.assert_allclose(jn.cosine_similarity(aj, bj), expected, rtol=1e-12)
        ga = jax.grad(lambda x: jn.cosine_similarity(x, bj[0]))(aj[0])
        np.testing.assert_allclose(ga, _cos_grad64(a[0], b[0]), rtol=1e-10)
        gb = jax.grad(lambda y: jn.cosine_similarity(aj[0], y))(bj[0])
        np.testing.assert_allclose(gb, _cos_grad64(b[0], a[0]), rtol=1e-10)
        check_grads(
            jax.jit(jn.cosine_similarity), (aj[1], bj[1]), order=2, modes=("rev",), eps=1e-6
        )
        np.testing.assert_allclose(jn.cosine_similarity(aj.T, bj.T, axis=0), expected, rtol=1e-12)


def test_cosine_similarity_zero_and_tiny_vectors():
    naive = lambda a, b: a @ b / (jnp.linalg.norm(a) * jnp.linalg.norm(b))  # noqa: E731
    zero, b = jnp.zeros(3), jnp.asarray([1.0, 2.0, 2.0])
    assert not _finite(jax.grad(naive)(zero, b))
    assert float(jn.cosine_similarity(zero, b)) == 0.0
    grads = jax.grad(jn.cosine_similarity, argnums=(0, 1))(zero, b)
    assert _finite(grads)
    assert float(jn.cosine_similarity(zero, zero)) == 0.0 and _finite(
        jax.grad(jn.cosine_similarity)(zero, zero)
    )
    tiny = jnp.asarray([1e-30, 2e-30, 2e-30], jnp.float32)
    assert float(jn.cosine_similarity(tiny, b)) == pytest.approx(1.0, abs=1e-6)


def test_vmap_grad_over_batches_with_zero_vectors(rng):
    a = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32).at[2].set(0.0)
    b = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32).at[4].set(0.0)
    g_norm = jax.vmap(jax.grad(jn.safe_norm))(a)
    g_cos = jax.vmap(jax.grad(jn.cosine_similarity, argnums=(0, 1)))(a, b)
    assert _finite(g_norm) and _finite(g_cos)
    assert np.asarray(g_norm[2]).tolist() == [0.0] * 4


# ---------------------------------------------------------------------------
# logsumexp / softmax / log_softmax
# ---------------------------------------------------------------------------

HARD_ROWS = {
    "overflow": [1000.0, 999.0, -1000.0, 0.0],
    "negative overflow": [-1000.0, -1001.0, -1005.0, -1000.5],
    "tiny probabilities": [0.0, -50.0, -100.0, -120.0],
    "ordinary": [0.3, -1.2, 2.5, 0.0],
}


def _log_softmax64(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("row", HARD_ROWS)
def test_softmax_family_matches_jax_nn_and_float64(row):
    x = jnp.asarray([HARD_ROWS[row]], jnp.float32)
    ref = _log_softmax64(HARD_ROWS[row])
    np.testing.assert_allclose(jn.log_softmax(x)[0], ref, rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(jn.log_softmax(x), jax.nn.log_softmax(x), rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(jn.softmax(x)[0], np.exp(ref), rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(jn.softmax(x), jax.nn.softmax(x), rtol=1e-6, atol=1e-30)
    lse64 = np.max(HARD_ROWS[row]) + np.log(
        np.exp(np.asarray(HARD_ROWS[row]) - np.max(HARD_ROWS[row])).sum()
    )
    np.testing.assert_allclose(
        jn.logsumexp(x, axis=-1)[0], lse64, rtol=rtol("log", "exp", floor=1e-6)
    )
    np.testing.assert_allclose(jn.logsumexp(x, axis=-1), jax.nn.logsumexp(x, axis=-1), rtol=1e-6)
    assert _finite(jax.grad(lambda v: jn.log_softmax(v)[0, 0])(x))


def test_tiny_probability_log_softmax_beats_log_of_softmax():
    x = jnp.asarray([0.0, -120.0])
    assert np.isinf(float(jnp.log(jax.nn.softmax(x))[1]))
    assert float(jn.log_softmax(x)[1]) == pytest.approx(-120.0)


def test_masked_softmax_family(rng):
    x = jnp.asarray(rng.normal(size=(3, 5)) * 3, jnp.float32)
    mask = jnp.asarray(
        [[True, False, True, True, False], [False] * 5, [True] * 5],
    )
    sm = jn.softmax(x, where=mask)
    assert float(sm[0, 1]) == 0.0 and float(sm[0, 4]) == 0.0
    assert np.asarray(sm[1]).tolist() == [0.0] * 5  # fully masked row: zeros
    rows = jnp.asarray([0, 2])
    np.testing.assert_allclose(sm[rows], jax.nn.softmax(x, where=mask)[rows], rtol=1e-6)
    ls = jn.log_softmax(x, where=mask)
    assert _finite(ls)
    cols = jnp.asarray([0, 2, 3])
    np.testing.assert_allclose(ls[0, cols], jax.nn.log_softmax(x, where=mask)[0, cols], rtol=1e-6)
    lse = jn.logsumexp(x, axis=-1, where=mask)
    assert _finite(lse) and float(lse[1]) == np.finfo(np.float32).min
    np.testing.assert_allclose(lse[0], jax.nn.logsumexp(x[0], where=mask[0]), rtol=1e-6)
    for f in (
        lambda v: jn.softmax(v, where=mask).sum(),
        lambda v: (jn.softmax(v, where=mask) * v).sum(),
        lambda v: jn.log_softmax(v, where=mask)[:, 0].sum(),
        lambda v: jn.logsumexp(v, axis=-1, where=mask).sum(),
    ):
        g = jax.grad(f)(x)
        assert _finite(g) and np.asarray(g[1]).tolist() == [0.0] * 5


def test_softmax_gradient_matches_float64(rng):
    x = rng.normal(size=(6,))
    with host_float64():
        check_grads(jax.jit(lambda v: jn.softmax(v)), (jnp.asarray(x),), order=2)
        check_grads(jax.jit(lambda v: jn.log_softmax(v)), (jnp.asarray(x),), order=2)
        check_grads(jax.jit(lambda v: jn.logsumexp(v)), (jnp.asarray(x),), order=2)
        w = rng.normal(size=6)
        g = jax.grad(lambda v: jn.softmax(v) @ w)(jnp.asarray(x))
        p = np.exp(_log_softmax64(x))
        np.testing.assert_allclose(g, p * (w - p @ w), rtol=1e-10)


def test_softmax_axis_and_infinite_inputs():
    x = jnp.asarray([[1.0, 2.0], [3.0, 5.0]])
    np.testing.assert_allclose(jn.softmax(x, axis=0), jax.nn.softmax(x, axis=0), rtol=1e-6)
    np.testing.assert_allclose(jn.logsumexp(x), jax.nn.logsumexp(x), rtol=1e-6)
    ninf = jnp.asarray([-jnp.inf, -jnp.inf])
    assert float(jn.logsumexp(ninf)) == float(jax.nn.logsumexp(ninf)) == -np.inf


def test_mask_logits_low_precision():
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
        logits = jnp.asarray([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]], dtype)
        mask = jnp.asarray([[True, False, True], [False, False, False]])
        masked = jn.mask_logits(logits, mask)
        assert float(masked[0, 1]) == float(jnp.finfo(dtype).min)
        assert not bool(jnp.any(jnp.isinf(masked)))
        p = jn.softmax(masked, where=mask)
        assert _finite(p) and float(p[0, 1]) == 0.0


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: jn.softmax(jnp.arange(3)), TypeError, "floating-point"),
        (
            lambda: jn.softmax(jnp.ones((2, 3)), where=jnp.ones(4, bool)),
            ValueError,
            "does not broadcast",
        ),
        (lambda: jn.softmax(jnp.ones((2, 3)), where=jnp.ones((2, 3))), TypeError, "boolean mask"),
        (lambda: jn.log_softmax(jnp.ones(3), axis=2), ValueError, "axis"),
        (lambda: jn.mask_logits(jnp.ones(3), jnp.ones(2, bool)), ValueError, "mask"),
        (lambda: jn.safe_sqrt(jnp.arange(3)), TypeError, "`x`"),
        (lambda: jn.cosine_similarity(jnp.ones(3), jnp.ones(4)), ValueError, "do not broadcast"),
        (
            lambda: jn.cosine_similarity(jnp.ones(3), jnp.ones(3, jnp.float16)),
            TypeError,
            "same dtype",
        ),
    ],
)
def test_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------------------
# cross_entropy
# ---------------------------------------------------------------------------


def test_cross_entropy_matches_optax_and_float64_gradient(rng):
    logits = rng.normal(size=(16, 10)) * 4
    labels = rng.integers(0, 10, size=16)
    ours = jn.cross_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(labels))
    peer = optax.softmax_cross_entropy_with_integer_labels(
        jnp.asarray(logits, jnp.float32), jnp.asarray(labels)
    )
    np.testing.assert_allclose(ours, peer.mean(), rtol=1e-6)
    logp = _log_softmax64(logits)
    np.testing.assert_allclose(ours, -logp[np.arange(16), labels].mean(), rtol=1e-6)
    grad = jax.grad(jn.cross_entropy)(jnp.asarray(logits, jnp.float32), jnp.asarray(labels))
    expected = (np.exp(logp) - np.eye(10)[labels]) / 16
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)
    with host_float64():
        check_grads(
            jax.jit(lambda z: jn.cross_entropy(z, jnp.asarray(labels[:3]))),
            (jnp.asarray(logits[:3]),),
            order=1,
            modes=("rev",),
        )


def test_cross_entropy_weights_and_masked_padding(rng):
    logits = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
    labels = jnp.asarray([0, 1, 2, 3, 0, 0])
    weights = jnp.asarray([1.0, 2.0, 0.5, 1.0, 0.0, 0.0])
    class_mask = jnp.ones((6, 5), bool).at[4:].set(False)  # two padding rows, fully masked
    loss = jn.cross_entropy(logits, labels, class_mask=class_mask, weights=weights)
    nll = -_log_softmax64(np.asarray(logits, np.float64))[np.arange(6), np.asarray(labels)]
    w = np.asarray(weights, np.float64)
    np.testing.assert_allclose(loss, (w * nll).sum() / w.sum(), rtol=rtol("log", "exp", floor=1e-6))
    grad = jax.grad(lambda z: jn.cross_entropy(z, labels, class_mask=class_mask, weights=weights))(
        logits
    )
    assert _finite(grad) and float(jnp.abs(grad[4:]).max()) == 0.0
    zero = jn.cross_entropy(logits, labels, weights=jnp.zeros(6))
    assert float(zero) == 0.0 and _finite(
        jax.grad(lambda z: jn.cross_entropy(z, labels, weights=jnp.zeros(6)))(logits)
    )

    # -inf masking (the classic bug) turns the same zero-weight padding rows into NaN:
    def naive(z):
        logp = jax.nn.log_softmax(jnp.where(class_mask, z, -jnp.inf))
        return (
            -(jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0] * weights).sum()
            / weights.sum()
        )

    assert np.isnan(float(naive(logits)))


def test_cross_entropy_bad_labels_and_jit_behaviour():
    logits = jnp.zeros((3, 4))
    with pytest.raises(TypeError, match="integer class indices"):
        jn.cross_entropy(logits, jnp.asarray([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"in \[0, 4\), got values in \[0, 4\]"):
        jn.cross_entropy(logits, jnp.asarray([0, 1, 4]))
    with pytest.raises(ValueError, match=r"got values in \[-1, 1\]"):
        jn.cross_entropy(logits, jnp.asarray([0, 1, -1]))
    with pytest.raises(ValueError, match="labels` must have shape"):
        jn.cross_entropy(logits, jnp.asarray([0, 1]))
    with pytest.raises(ValueError, match="weights"):
        jn.cross_entropy(logits, jnp.asarray([0, 1, 2]), weights=jnp.ones(2))
    jitted = jax.jit(jn.cross_entropy)
    assert np.isnan(float(jitted(logits, jnp.asarray([0, 1, 4]))))
    assert np.isnan(float(jitted(logits, jnp.asarray([0, 1, -1]))))


def test_cross_entropy_compiles_once_under_jit(rng):
    jitted = jax.jit(jn.cross_entropy)
    batches = [
        (jnp.asarray(rng.normal(size=(8, 3)), jnp.float32), jnp.asarray(rng.integers(0, 3, 8)))
        for _ in range(4)
    ]
    with CompileBudget(1, "cross_entropy") as budget:
        for logits, labels in batches:
            jitted(logits, labels)
    assert budget.count == 1


# ---------------------------------------------------------------------------
# straight-through estimators
# ---------------------------------------------------------------------------


def test_round_ste_and_straight_through():
    x = jnp.asarray([0.2, 1.6, -2.5])
    np.testing.assert_array_equal(jn.round_ste(x), jnp.round(x))
    np.testing.assert_array_equal(jax.grad(lambda v: jn.round_ste(v).sum())(x), jnp.ones(3))
    assert float(jax.grad(lambda v: jnp.round(v).sum())(x).sum()) == 0.0  # why STE exists
    sign = jn.straight_through(jnp.sign)
    np.testing.assert_array_equal(sign(x), jnp.sign(x))
    np.testing.assert_array_equal(jax.grad(lambda v: (sign(v) * 3.0).sum())(x), 3.0 * jnp.ones(3))
    with pytest.raises(ValueError, match="preserve the shape"):
        jn.straight_through(jnp.sum)(x)
    with pytest.raises(TypeError, match="callable"):
        jn.straight_through("round")  # pyright: ignore[reportArgumentType]  # bad input on purpose


# ---------------------------------------------------------------------------
# NaN in, NaN out; finite in, finite out (issue #16)
# ---------------------------------------------------------------------------

NAN_IN_NAN_OUT = {
    "safe_norm": lambda: jn.safe_norm(jnp.asarray([jnp.nan, 1.0])),
    "safe_sqrt": lambda: jn.safe_sqrt(jnp.nan),
    "safe_log": lambda: jn.safe_log(jnp.nan),
    "logit": lambda: jn.logit(jnp.nan),
    "entropy": lambda: jn.entropy(jnp.asarray([0.5, jnp.nan])),
    "sinc": lambda: jn.sinc(jnp.nan),
    "cosine_similarity": lambda: jn.cosine_similarity(jnp.asarray([jnp.nan, 1.0]), jnp.ones(2)),
    "logsumexp(where=)": lambda: jn.logsumexp(jnp.asarray([jnp.nan, 1.0]), where=jnp.ones(2, bool)),
    "softmax(where=)": lambda: jn.softmax(jnp.asarray([jnp.nan, 1.0]), where=jnp.ones(2, bool)),
    "log_softmax(where=)": lambda: jn.log_softmax(
        jnp.asarray([jnp.nan, 1.0]), where=jnp.ones(2, bool)
    ),
    "cross_entropy": lambda: jn.cross_entropy(jnp.asarray([[jnp.nan, 1.0]]), jnp.asarray([1])),
}


@pytest.mark.parametrize("name", sorted(NAN_IN_NAN_OUT))
def test_nan_in_nan_out(name):
    out = np.asarray(NAN_IN_NAN_OUT[name]())
    assert np.isnan(out).all(), (name, out)


def test_safe_functions_still_safe_at_singular_points_after_nan_fix():
    assert float(jn.safe_sqrt(0.0)) == 0.0 and float(jax.grad(jn.safe_sqrt)(0.0)) == 0.0
    assert float(jn.logit(1.0)) == 20.0 and float(jax.grad(jn.logit)(0.0)) == 0.0
    assert jax.grad(jn.safe_norm)(jnp.zeros(3)).tolist() == [0.0, 0.0, 0.0]
    assert float(jn.entropy(jnp.asarray([1.0, 0.0]))) == 0.0


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_safe_log_low_precision_fill_is_its_own_tiny(dtype):
    out = jn.safe_log(jnp.asarray([0.0, 2.0], dtype))
    assert out.dtype == dtype
    expected = np.log(float(jnp.finfo(dtype).tiny))
    assert float(out[0]) == pytest.approx(expected, rel=1e-2)
    assert float(out[1]) == pytest.approx(np.log(2.0), rel=1e-2)


def test_cross_entropy_empty_batch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"`logits` of shape \(0, 3\) is empty"):
        jn.cross_entropy(jnp.zeros((0, 3)), jnp.zeros((0,), jnp.int32))
    with pytest.raises(ValueError, match="`logits` of shape"):
        jn.cross_entropy(jnp.zeros((2, 0)), jnp.zeros((2,), jnp.int32))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_cross_entropy_label_in_masked_class_is_finite(dtype):
    logits = jnp.asarray([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]] * 8, dtype)
    labels = jnp.asarray([2, 0] * 8)
    mask = jnp.asarray([True, True, False])
    loss = jn.cross_entropy(logits, labels, class_mask=mask)
    assert loss.dtype == dtype and np.isfinite(float(loss))
    grad = jax.grad(lambda z: jn.cross_entropy(z, labels, class_mask=mask).astype(jnp.float32))(
        logits
    )
    assert _finite(grad)
    # the masked-label rows contribute the clamp, the others their float64 nll
    z = np.asarray(logits, np.float64)[1, :2]
    nll = np.log(np.exp(z).sum()) - z[0]
    clamp = -np.log(np.finfo(np.float32).tiny)
    assert float(loss) == pytest.approx((nll + clamp) / 2, rel=1e-2)


def test_float16_cross_entropy_matches_float64(rng):
    logits = rng.normal(0, 4, size=(64, 10))
    labels = rng.integers(0, 10, 64)
    ours = jn.cross_entropy(jnp.asarray(logits, jnp.float16), jnp.asarray(labels))
    z = logits - logits.max(-1, keepdims=True)
    expected = np.mean(np.log(np.exp(z).sum(-1)) - z[np.arange(64), labels])
    assert ours.dtype == jnp.float16
    assert float(ours) == pytest.approx(expected, rel=5e-3)


def test_logsumexp_over_an_empty_axis_is_a_clear_error():
    with pytest.raises(ValueError, match=r"`x` of shape \(2, 0\) is empty"):
        jn.logsumexp(jnp.zeros((2, 0)), axis=1)


@pytest.mark.parametrize(
    ("call", "error", "argument"),
    [
        (lambda: jn.safe_sqrt(None), TypeError, "x"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: jn.safe_log("abc"), TypeError, "x"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: jn.safe_log(jnp.ones(2), fill=float("nan")), ValueError, "fill"),
        (lambda: jn.safe_norm({"a": 1}), TypeError, "x"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: jn.entropy(jnp.asarray([1, 0])), TypeError, "p"),
        (lambda: jn.cosine_similarity(None, jnp.ones(2)), TypeError, "a"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: jn.softmax(jnp.ones(3), where=jnp.ones(3)), TypeError, "where"),
        (lambda: jn.cross_entropy("logits", jnp.asarray([0])), TypeError, "logits"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: jn.double_where("log", jnp.ones(2), jnp.ones(2, bool), 1.0, 0.0), TypeError, "fn"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: jn.double_where(jnp.log, None, jnp.ones(2, bool), 1.0, 0.0), TypeError, "x"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: jn.straight_through(3), TypeError, "fn"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
    ],
)
def test_numerics_bad_input_names_the_argument(call, error, argument):
    with pytest.raises(error, match=f"`{argument}`"):
        call()
