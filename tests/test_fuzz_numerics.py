"""Property-based tests (hypothesis) of the promises of jaxwise.numerics.

1. Finite in, finite out: for finite inputs the safe functions give finite values *and*
   finite gradients (including zero vectors, zero probabilities, fully masked rows).
2. NaN in, NaN out: a NaN input entry is never hidden (it reaches the output).
3. Float64 is the referee: float32 results agree with NumPy float64.

Shapes are fixed (8 entries) so that every example reuses the same compiled programs; each
property runs ≤ 50 examples with no deadline.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tolerance import rtol

from jaxwise import numerics as jn

N = 8
# No deadline and no wall-clock health check: a host stall (another process, a compile on an
# accelerator) may make one draw slow; what is checked is the values, never the time.
FUZZ = settings(
    max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)

finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)
vectors = hnp.arrays(np.float32, N, elements=finite)
# vectors with exact zeros and tiny/huge entries mixed in: the singular points
special = st.sampled_from([0.0, 0.0, 1e-30, -1e-30, 1e30, -1e30, 1.0])
edgy_vectors = hnp.arrays(np.float32, N, elements=st.one_of(finite, special))
probabilities = hnp.arrays(np.float32, N, elements=st.floats(0.0, 1.0, width=32))
masks = hnp.arrays(np.bool_, N)
nan_index = st.integers(0, N - 1)


def _all_finite(tree):
    return all(bool(np.isfinite(np.asarray(leaf)).all()) for leaf in jax.tree.leaves(tree))


@jax.jit
def _elementwise_and_grads(x):
    fns = {"safe_sqrt": jn.safe_sqrt, "safe_log": jn.safe_log, "logit": jn.logit, "sinc": jn.sinc}
    values = {k: f(x) for k, f in fns.items()}
    grads = {k: jax.vmap(jax.grad(f))(x) for k, f in fns.items()}
    return values, grads


@FUZZ
@given(edgy_vectors)
def test_elementwise_finite_in_finite_out(x):
    values, grads = _elementwise_and_grads(jnp.asarray(x))
    assert _all_finite(values) and _all_finite(grads)


@FUZZ
@given(vectors, nan_index)
def test_elementwise_nan_in_nan_out(x, i):
    x = x.copy()
    x[i] = np.nan
    values, _ = _elementwise_and_grads(jnp.asarray(x))
    for name, out in values.items():
        assert np.isnan(np.asarray(out)[i]), name


@jax.jit
def _norms(a, b):
    return {
        "norm": jn.safe_norm(a),
        "cos": jn.cosine_similarity(a, b),
        "grad_norm": jax.grad(jn.safe_norm)(a),
        "grad_cos": jax.grad(jn.cosine_similarity, argnums=(0, 1))(a, b),
    }


@FUZZ
@given(edgy_vectors, edgy_vectors)
def test_norm_and_cosine_finite_and_match_float64(a, b):
    out = _norms(jnp.asarray(a), jnp.asarray(b))
    assert _all_finite(out)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norm64 = np.linalg.norm(a64)
    assert float(out["norm"]) == pytest.approx(norm64, rel=1e-5, abs=1e-37)
    nb = np.linalg.norm(b64)
    cos64 = 0.0 if norm64 == 0 or nb == 0 else float(np.dot(a64 / norm64, b64 / nb))
    assert float(out["cos"]) == pytest.approx(cos64, abs=1e-5)


@FUZZ
@given(vectors, nan_index)
def test_norm_and_cosine_nan_in_nan_out(a, i):
    a = a.copy()
    a[i] = np.nan
    out = _norms(jnp.asarray(a), jnp.ones(N, jnp.float32))
    assert np.isnan(float(out["norm"])) and np.isnan(float(out["cos"]))


@jax.jit
def _entropy_and_grad(p):
    return jn.entropy(p), jax.grad(jn.entropy)(p)


@FUZZ
@given(probabilities)
def test_entropy_finite_and_matches_float64(p):
    value, grad = _entropy_and_grad(jnp.asarray(p))
    assert np.isfinite(float(value))
    assert np.isfinite(np.asarray(grad)[p > 0]).all()  # d(−p log p)/dp = −log p − 1 at p > 0
    p64 = p.astype(np.float64)
    expected = -np.sum(np.where(p64 > 0, p64 * np.log(np.where(p64 > 0, p64, 1.0)), 0.0))
    # a same-sign sum of p·log p: its relative error is at most log's (the device's table)
    assert float(value) == pytest.approx(expected, rel=rtol("log", floor=1e-5), abs=1e-6)


@FUZZ
@given(probabilities, nan_index)
def test_entropy_nan_in_nan_out(p, i):
    p = p.copy()
    p[i] = np.nan
    assert np.isnan(float(_entropy_and_grad(jnp.asarray(p))[0]))


@jax.jit
def _softmax_family(x, mask):
    def loss(z):
        return jnp.sum(jn.softmax(z, where=mask) * jnp.arange(N, dtype=z.dtype)) + jnp.sum(
            jnp.where(mask, jn.log_softmax(z, where=mask), 0.0)
        )

    return {
        "lse": jn.logsumexp(x, where=mask),
        "softmax": jn.softmax(x, where=mask),
        "log_softmax": jn.log_softmax(x, where=mask),
        "grad": jax.grad(loss)(x),
    }


@FUZZ
@given(vectors, masks)
def test_masked_softmax_family_finite_and_matches_float64(x, mask):
    out = _softmax_family(jnp.asarray(x), jnp.asarray(mask))
    assert _all_finite(out)
    soft = np.asarray(out["softmax"])
    assert (soft[~mask] == 0).all()
    if mask.any():
        z = x.astype(np.float64)[mask]
        m = z.max()
        lse64 = m + np.log(np.exp(z - m).sum())
        assert float(out["lse"]) == pytest.approx(lse64, rel=1e-5, abs=1e-4)
        np.testing.assert_allclose(soft[mask], np.exp(z - lse64), rtol=1e-4, atol=1e-6)
    else:
        assert (soft == 0).all()


@FUZZ
@given(vectors, masks, nan_index)
def test_masked_softmax_family_nan_in_nan_out(x, mask, i):
    x, mask = x.copy(), mask.copy()
    x[i], mask[i] = np.nan, True
    out = _softmax_family(jnp.asarray(x), jnp.asarray(mask))
    assert np.isnan(float(out["lse"])) and np.isnan(np.asarray(out["softmax"])[mask]).all()


@jax.jit
def _cross_entropy(logits, labels, class_mask):
    loss = jn.cross_entropy(logits, labels, class_mask=class_mask)
    return loss, jax.grad(lambda z: jn.cross_entropy(z, labels, class_mask=class_mask))(logits)


@FUZZ
@given(
    hnp.arrays(np.float32, (4, N), elements=finite),
    hnp.arrays(np.int32, 4, elements=st.integers(0, N - 1)),
    masks,
)
def test_cross_entropy_finite_and_matches_float64(logits, labels, class_mask):
    loss, grad = _cross_entropy(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(class_mask))
    assert np.isfinite(float(loss)) and _all_finite(grad)
    if class_mask.all():
        z = logits.astype(np.float64)
        m = z.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[:, 0]
        expected = np.mean(lse - z[np.arange(4), labels])
        assert float(loss) == pytest.approx(expected, rel=1e-5, abs=1e-4)
