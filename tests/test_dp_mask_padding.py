"""Masked-out (padding) rows change nothing: NaN or inf in them never reaches the gradient."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise.compilation import CompileBudget
from jaxwise.per_example import clip_and_sum
from jaxwise.privacy import dp_gradient, dp_gradient_accumulated

METHODS = [("auto", None), ("vmap", None), ("ghost", None), ("chunked", 3)]


def _loss(params, example):
    x, y = example
    hidden = jnp.tanh(x @ params["w"] + params["b"])
    return jnp.sum((hidden @ params["v"] - y) ** 2)


def _problem():
    rng = np.random.default_rng(0)
    params = {
        "w": jnp.asarray(rng.normal(size=(4, 5)), jnp.float32),
        "b": jnp.zeros(5, jnp.float32),
        "v": jnp.asarray(rng.normal(size=(5, 2)), jnp.float32),
    }
    x = rng.normal(size=(8, 4)).astype(np.float32)
    y = rng.normal(size=(8, 2)).astype(np.float32)
    mask = np.array([True, False, True, True, False, True, False, True])
    x[1], x[4], y[6] = np.nan, np.inf, -np.inf  # padding rows: anything at all
    return params, (jnp.asarray(x), jnp.asarray(y)), mask


def _first(result):
    return result[0]


@pytest.mark.parametrize(("method", "chunk"), METHODS)
def test_dp_gradient_ignores_non_finite_masked_rows(method, chunk):
    params, (x, y), mask = _problem()
    args: dict[str, Any] = {
        "clip_norm": 0.5,
        "noise_multiplier": 0.0,
        "method": method,
        "chunk_size": chunk,
    }
    got = _first(
        dp_gradient(
            _loss,
            params,
            (x, y),
            jax.random.key(0),
            mask=jnp.asarray(mask),
            expected_batch_size=5.0,
            **args,
        )
    )
    real = (x[mask], y[mask])
    want = _first(
        dp_gradient(_loss, params, real, jax.random.key(0), expected_batch_size=5.0, **args)
    )
    for k in params:
        assert np.all(np.isfinite(np.asarray(got[k]))), k
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize(("method", "chunk"), METHODS)
def test_clip_and_sum_zero_weight_rows_match_a_float64_reference(method, chunk):
    params, (x, y), mask = _problem()
    summed, norms = clip_and_sum(
        _loss,
        params,
        (x, y),
        clip_norm=0.5,
        method=method,
        chunk_size=chunk,
        weights=jnp.asarray(mask, jnp.float32),
    )
    grads = jax.vmap(jax.grad(_loss), in_axes=(None, 0))(params, (x[mask], y[mask]))
    flat = np.concatenate([np.asarray(grads[k], np.float64).reshape(5, -1) for k in params], 1)
    factor = np.minimum(1.0, 0.5 / np.linalg.norm(flat, axis=1))
    want = (flat * factor[:, None]).sum(0)
    got = np.concatenate([np.asarray(summed[k], np.float64).ravel() for k in params])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(norms)[mask], np.linalg.norm(flat, axis=1), rtol=1e-5
    )  # the real rows' norms; a padding row's own norm is its own business


def test_all_rows_masked_out_is_a_zero_sum():
    params, (x, y), _ = _problem()
    x = x.at[0].set(jnp.nan)  # the row a masked-out row would be replaced by
    for method, chunk in METHODS:
        summed, _ = clip_and_sum(
            _loss,
            params,
            (x, y),
            clip_norm=0.5,
            method=method,
            chunk_size=chunk,
            weights=jnp.zeros(8),
        )
        for k in params:
            np.testing.assert_array_equal(np.asarray(summed[k]), 0.0)


def test_accumulated_ignores_non_finite_masked_rows_and_compiles_once():
    params, (x, y), mask = _problem()
    micro = (x.reshape(2, 4, 4), y.reshape(2, 4, 2))

    @jax.jit
    def step(params, micro, mask):
        return dp_gradient_accumulated(
            _loss,
            params,
            micro,
            jax.random.key(0),
            clip_norm=0.5,
            noise_multiplier=0.0,
            expected_batch_size=5.0,
            mask=mask,
        )[0]

    with CompileBudget(1, step) as budget:
        got = step(params, micro, jnp.asarray(mask.reshape(2, 4)))
        step(params, micro, jnp.asarray(mask.reshape(2, 4)))
    assert budget.count == 1  # exactly one: the budget alone would pass at 0
    want = dp_gradient(
        _loss,
        params,
        (x[mask], y[mask]),
        jax.random.key(0),
        clip_norm=0.5,
        noise_multiplier=0.0,
        expected_batch_size=5.0,
    )[0]
    for k in params:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=2e-6, atol=1e-7)


def test_audit_canaries_refuses_a_memory_blow_up_by_name():
    from jaxwise.privacy import audit_canaries

    data = (np.zeros((4, 2), np.float32), np.array([0, 1, 0, 1]))
    with pytest.raises(ValueError, match=r"`m`=1,000,000,000 canaries of 1,000,000,002 features"):
        audit_canaries(data, 10**9)
    with pytest.raises(ValueError, match=r"`m`=1,000,000,000 canaries of 2 features"):
        audit_canaries(data, 10**9, kind="far")
    assert audit_canaries(data, 6, seed=0).m == 6


def _select_elements(hlo: str | None) -> int:
    """Elements written by every ``select`` of a compiled HLO module (fused or not)."""
    total = 0
    for match in re.finditer(r"= \w+\[([\d,]*)\][^ ]* select\(", hlo or ""):
        total += int(np.prod([int(d) for d in match.group(1).split(",") if d]))
    return total


def test_masked_dp_step_selects_rows_once_at_the_input_not_per_activation():
    # issue #43: selecting weight-0 rows out of every activation and output gradient of the
    # ghost pass cost one extra read and write of each (Poisson/shuffle 1.19-1.38 on the NNX
    # CNN); the DP path replaces the padding rows once, at the input
    rng = np.random.default_rng(1)
    b, k, h = 16, 4, 128
    params = {
        "w": jnp.asarray(rng.normal(size=(k, h)), jnp.float32),
        "b": jnp.zeros(h, jnp.float32),
        "v": jnp.asarray(rng.normal(size=(h, 2)), jnp.float32),
    }
    x = jnp.asarray(rng.normal(size=(b, k)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(b, 2)), jnp.float32)
    mask = jnp.arange(b) < 11
    options: dict[str, Any] = {
        "clip_norm": 0.5,
        "noise_multiplier": 1.0,
        "expected_batch_size": 11.0,
        "method": "ghost",
    }

    def masked(p, batch, m, key):
        return dp_gradient(_loss, p, batch, key, mask=m, **options)[0]

    def plain(p, batch, key):
        return dp_gradient(_loss, p, batch, key, **options)[0]

    key = jax.random.key(0)
    with_mask = jax.jit(masked).lower(params, (x, y), mask, key).compile().as_text()
    without = jax.jit(plain).lower(params, (x, y), key).compile().as_text()
    inputs = x.size + y.size  # selects of the input rows (XLA may duplicate one into fusions),
    outputs = sum(v.size for v in params.values())  # one of the sum (no live row at all),
    extra = _select_elements(with_mask) - _select_elements(without)
    assert extra <= 3 * inputs + outputs + 8 * b  # a few (B,) ones: 1,312
    # (selecting every activation and output gradient, as before: + 6,500 elements, 3·B·h)
