"""Tests for jaxwise.buckets: padding helpers, exact bucket planning, AOT serving."""

import itertools
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerance import rtol

from jaxwise.buckets import (
    BucketedFunction,
    Padded,
    bucket_for,
    pad_to_bucket,
    padding_waste,
    plan_buckets,
    power_of_two_buckets,
)
from jaxwise.compilation import CompileBudget, CompileCounter


@pytest.mark.parametrize("n, expected", [(0, 4), (1, 4), (4, 4), (5, 8), (16, 16)])
def test_bucket_for(n, expected):
    assert bucket_for(n, (4, 8, 16)) == expected


@pytest.mark.parametrize(
    "n, buckets, error, match",
    [
        (17, (4, 8, 16), ValueError, "exceeds the largest bucket 16"),
        (-1, (4,), ValueError, "`n` must be >= 0"),
        (2.0, (4,), TypeError, "`n` must be an int"),
        (1, (), ValueError, "must not be empty"),
        (1, (8, 4), ValueError, "strictly increasing"),
        (1, (4, 4), ValueError, "strictly increasing"),
        (1, (0, 4), ValueError, "positive"),
        (1, (2.5, 4), TypeError, "ints"),
        (1, 8, TypeError, "sequence"),
    ],
)
def test_bucket_for_errors(n, buckets, error, match):
    with pytest.raises(error, match=match):
        bucket_for(n, buckets)


def test_pad_to_bucket_any_axis_and_no_compile():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    on_device = jnp.ones((3, 4))
    with CompileCounter() as counter:
        p0, m0 = pad_to_bucket(x, (2, 5), axis=0, fill=-1)
        p1, m1 = pad_to_bucket(x, (6,), axis=-1)
        pj, _ = pad_to_bucket(on_device, (8,))
    assert counter.count == 0
    assert p0.shape == (5, 4) and p0.dtype == np.float32
    np.testing.assert_array_equal(p0[:3], x)
    assert (p0[3:] == -1).all() and m0.tolist() == [True] * 3 + [False] * 2
    assert p1.shape == (3, 6) and (p1[:, 4:] == 0).all() and m1.sum() == 4
    assert isinstance(pj, np.ndarray) and pj.shape == (8, 4)
    exact, mask = pad_to_bucket(x, (3,))
    assert exact is not x and mask.all()  # a copy, never the caller's buffer


def test_pad_to_bucket_errors():
    with pytest.raises(ValueError, match="scalar"):
        pad_to_bucket(np.float32(1.0), (4,))
    with pytest.raises(ValueError, match="axis"):
        pad_to_bucket(np.ones((2, 2)), (4,), axis=2)
    with pytest.raises(ValueError, match="exceeds"):
        pad_to_bucket(np.ones(9), (4, 8))


def _brute_force_padding(lengths, k):
    values = sorted(set(lengths))
    best = None
    for r in range(0, min(k, len(values))):
        for combo in itertools.combinations(values[:-1], r):
            buckets = tuple(sorted(combo)) + (values[-1],)
            waste, _ = padding_waste(lengths, buckets)
            best = waste if best is None else min(best, waste)
    return best


def _quadratic_plan(lengths, max_buckets):
    """The first-round O(K·m²) exact DP, kept as a reference for the O(K·m) one."""
    values, counts = np.unique(np.maximum(lengths, 1), return_counts=True)
    m = len(values)
    k = min(int(max_buckets), m)
    c_cum = np.concatenate([[0], np.cumsum(counts)]).astype(np.float64)
    cv_cum = np.concatenate([[0], np.cumsum(counts * values)]).astype(np.float64)
    i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    cost = values[j] * (c_cum[j + 1] - c_cum[i]) - (cv_cum[j + 1] - cv_cum[i])
    cost = np.where(j >= i, cost, np.inf)
    dp, parents = cost[0].copy(), []
    shifted = np.vstack([cost[1:], np.full((1, m), np.inf)])
    for _ in range(1, k):
        candidates = dp[:, None] + shifted
        parent = candidates.argmin(axis=0)
        dp = candidates[parent, np.arange(m)]
        parents.append(parent)
    result, last = [int(values[-1])], m - 1
    for parent in reversed(parents):
        last = int(parent[last])
        result.append(int(values[last]))
    return tuple(sorted(result))


@pytest.mark.parametrize("seed", range(12))
def test_plan_buckets_is_exact(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, size=rng.integers(5, 60))
    k = int(rng.integers(1, 5))
    plan = plan_buckets(lengths, k)
    assert len(plan) <= k and list(plan) == sorted(plan)
    assert plan[-1] == lengths.max() and set(plan) <= set(lengths.tolist())
    assert padding_waste(lengths, plan)[0] == _brute_force_padding(lengths.tolist(), k)


@pytest.mark.parametrize("seed", range(40))
def test_plan_buckets_matches_quadratic_reference(seed):
    rng = np.random.default_rng(100 + seed)
    lengths = rng.integers(0, rng.integers(2, 400), size=rng.integers(1, 300))
    k = int(rng.integers(1, 20))
    plan = plan_buckets(lengths, k)
    assert len(plan) == min(k, len(np.unique(np.maximum(lengths, 1))))
    assert padding_waste(lengths, plan)[0] == padding_waste(lengths, _quadratic_plan(lengths, k))[0]


def test_plan_buckets_zero_lengths_and_numpy_ints():
    assert plan_buckets([0, 0, 3], np.int64(2)) == (1, 3)
    assert plan_buckets([0], 1) == (1,)
    assert padding_waste([0, 0, 3], (1, 3))[0] == 2


def test_plan_buckets_100k_distinct_lengths_in_bounded_memory():
    # The quadratic DP needed m² floats: 80 GB here. The divide-and-conquer DP keeps O(K·m).
    rng = np.random.default_rng(7)
    lengths = np.concatenate(
        [rng.permutation(np.arange(1, 100_001)), rng.integers(1, 100_001, 20_000)]
    )
    tracemalloc.start()
    try:
        plan = plan_buckets(lengths, 4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    assert len(plan) == 4 and plan[-1] == 100_000
    waste = padding_waste(lengths, plan)[0]
    # Exact on the full problem: no single boundary move lowers the padding.
    values = np.unique(lengths)
    for i in range(3):
        for step in (-1, 1):
            j = int(np.searchsorted(values, plan[i])) + step
            moved = tuple(sorted(set(plan[:i] + (int(values[j]),) + plan[i + 1 :])))
            if len(moved) == 4:
                assert padding_waste(lengths, moved)[0] >= waste


def test_plan_buckets_beats_power_of_two_and_handles_many_buckets():
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(3.5, 0.6, size=5000).astype(int), 1, 300)
    pow2 = power_of_two_buckets(int(lengths.max()), 8)
    plan = plan_buckets(lengths, len(pow2))
    assert padding_waste(lengths, plan)[0] < padding_waste(lengths, pow2)[0]
    distinct = np.unique(lengths)
    assert plan_buckets(lengths, 10_000) == tuple(distinct.tolist())
    assert padding_waste(lengths, plan_buckets(lengths, 10_000))[0] == 0


@pytest.mark.parametrize(
    "lengths, k, error, match",
    [
        ([], 2, ValueError, "non-empty"),
        ([1.5, 2], 2, TypeError, "ints"),
        ([-1, 2], 2, ValueError, ">= 0"),
        ([1, 2], 0, ValueError, "max_buckets"),
        ([1, 2], 1.0, TypeError, "max_buckets"),
        ([1, 2], True, TypeError, "max_buckets"),
        ("12", 2, TypeError, "ints"),
    ],
)
def test_plan_buckets_errors(lengths, k, error, match):
    with pytest.raises(error, match=match):
        plan_buckets(lengths, k)


def test_power_of_two_buckets_and_waste():
    assert power_of_two_buckets(1) == (1,)
    assert power_of_two_buckets(17, 4) == (4, 8, 16, 32)
    assert padding_waste([1, 8], (8,)) == (7, 7 / 16)
    with pytest.raises(ValueError, match="exceeds"):
        padding_waste([9], (8,))


# ---------------------------------------------------------------------------
# BucketedFunction
# ---------------------------------------------------------------------------

D = 8


def masked_score(x, w, temperature, *, mask):
    """Per-token logits and a masked mean pooled score (numerator AND denominator masked)."""
    logits = jnp.tanh(x @ w) / temperature
    m = mask[:, None].astype(logits.dtype)
    pooled = jnp.sum(logits * m, axis=0) / jnp.maximum(jnp.sum(m), 1.0)
    return logits, pooled


def _reference(x, w, temperature):
    logits = np.tanh(x.astype(np.float64) @ w.astype(np.float64)) / temperature
    return logits, logits.mean(axis=0)


@pytest.fixture
def served():
    specs = [
        Padded((None, D), np.float32),
        jax.ShapeDtypeStruct((D, 3), np.float32),
        jax.ShapeDtypeStruct((), np.float32),
    ]

    # A fresh function object per test: JAX caches traces and executables per function, so
    # each test's compile counts are exact whatever ran before it.
    def masked_score_(x, w, temperature, *, mask):
        return masked_score(x, w, temperature, mask=mask)

    masked_score_.__name__ = "masked_score"
    return BucketedFunction(masked_score_, (4, 16, 64), specs, pass_mask=True, out_axes=(0, None))


def test_serving_after_warmup_never_compiles_and_matches_float64(served, rng):
    with jax.default_matmul_precision("highest"):  # float32 products against float64
        _serve_and_compare(served, rng)


def _serve_and_compare(served, rng):
    w = rng.normal(size=(D, 3)).astype(np.float32)
    with CompileCounter(served) as warm:
        served.warmup()
    assert warm.count == 3 and served.compiled_buckets == (4, 16, 64)
    assert {name for name, _ in warm.events} == {"jit(masked_score)"}
    lengths = rng.integers(1, 65, size=200)
    # tanh(x @ w) / temperature: the device's float32 tanh (table), doubled by the division
    tol = rtol("tanh", floor=1e-5, scale=2.0)
    with CompileCounter(include_eager=False) as serving:
        for i, n in enumerate(lengths):
            x = rng.normal(size=(n, D)).astype(np.float32)
            temperature = 0.5 if i % 2 else np.float32(0.5)  # Python float and NumPy scalar
            logits, pooled = served(x, w, temperature)
            ref_logits, ref_pooled = _reference(x, w, 0.5)
            assert logits.shape == (n, 3) and pooled.shape == (3,)
            np.testing.assert_allclose(logits, ref_logits, rtol=tol, atol=tol)
            np.testing.assert_allclose(pooled, ref_pooled, rtol=tol, atol=tol)
    assert serving.count == 0, serving.report()
    stats = served.stats
    assert sum(s.requests for s in stats.values()) == 200
    assert sum(s.real_items for s in stats.values()) == lengths.sum()
    assert 0 < stats[64].waste < 1
    assert "waste" in served.summary()


def test_lazy_compile_without_warmup(served, rng):
    w = np.zeros((D, 3), np.float32)
    with CompileBudget(1, served, exact=True) as budget:
        served(np.ones((3, D), np.float32), w, 1.0)
        served(np.ones((2, D), np.float32), w, 1.0)
    assert budget.count == 1 and served.compiled_buckets == (4,)
    assert budget.records[0].fun_name == "jit(masked_score)"


def test_budget_on_served_function_counts_its_program_only(served):
    w = np.zeros((D, 3), np.float32)
    served.warmup()
    other = jax.jit(lambda v: v + 1.0)
    with pytest.warns(RuntimeWarning, match="counted 0 compilations.*jit\\(<lambda>\\)"):
        with CompileBudget(0, served, exact=True) as budget:
            served(np.ones((5, D), np.float32), w, 1.0)
            other(jnp.ones(3))
    assert budget.count == 0
    assert served.jitted.__name__ == "masked_score"


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((np.ones((3, D + 1), np.float32),), ValueError, "axis 1 must be 8"),
        ((np.ones((3,), np.float32),), ValueError, "2 dims"),
        ((np.ones((3, D), np.float64),), TypeError, "dtype float64, expected float32"),
        ((np.ones((65, D), np.float32),), ValueError, "exceeds the largest bucket 64"),
        (("text",), TypeError, "array or Python scalar"),
    ],
)
def test_bad_requests_are_rejected_before_compiling_and_do_not_poison(served, args, error, match):
    w = np.zeros((D, 3), np.float32)
    with CompileCounter() as counter, pytest.raises(error, match=match):
        served(*args, w, 1.0)
    assert counter.count == 0, counter.report()
    assert all(s.requests == 0 for s in served.stats.values())
    logits, _ = served(np.ones((2, D), np.float32), w, 1.0)
    assert logits.shape == (2, 3)


def test_scalar_and_argument_count_errors(served):
    w = np.zeros((D, 3), np.float32)
    x = np.ones((2, D), np.float32)
    with pytest.raises(TypeError, match="expected 3 positional"):
        served(x, w)
    with pytest.raises(ValueError, match="0 dims"):
        served(x, w, [1.0, 2.0])


def test_padded_arguments_must_share_length():
    fn = BucketedFunction(lambda a, b: a + b, (8,), [Padded((None,), "float32")] * 2)
    with pytest.raises(ValueError, match="share one length"):
        fn(np.ones(3, np.float32), np.ones(4, np.float32))
    np.testing.assert_array_equal(
        fn(np.ones(3, np.float32), np.ones(3, np.float32)), 2 * np.ones(3)
    )


def test_int_spec_rejects_float_scalar():
    fn = BucketedFunction(
        lambda a, k: a * k, (8,), [Padded((None,), "int32"), jax.ShapeDtypeStruct((), np.int32)]
    )
    assert fn(np.arange(3, dtype=np.int32), 2).tolist() == [0, 2, 4]
    with pytest.raises(TypeError, match="float values"):
        fn(np.arange(3, dtype=np.int32), 2.5)


def test_constructor_errors():
    with pytest.raises(TypeError, match="`fn` must be callable"):
        BucketedFunction(3, (4,), [Padded((None,), "float32")])  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(ValueError, match="at least one Padded"):
        BucketedFunction(lambda w: w, (4,), [jax.ShapeDtypeStruct((2,), np.float32)])
    with pytest.raises(TypeError, match="arg_specs\\[0\\]"):
        BucketedFunction(lambda w: w, (4,), [(None, 2)])  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(ValueError, match="exactly one None"):
        Padded((None, None), "float32")
    with pytest.raises(ValueError, match="strictly increasing"):
        BucketedFunction(lambda w: w, (8, 4), [Padded((None,), "float32")])


def test_padded_spec_accepts_numpy_ints_and_rejects_bools():
    assert Padded((None, np.int64(4)), "float32").at(8).shape == (8, 4)
    with pytest.raises(ValueError, match="ints >= 0 or None"):
        Padded((None, True), "float32")
