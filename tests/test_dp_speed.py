"""DP speed (issue 48): every clipping method on a reduced causal transformer LM, the clip bound
at any matmul precision, the cost model's choices per backend, memory and compile counts.

The model is `test_ghost_scale`'s (embedding + positions, two pre-LN blocks with causal
attention, a GELU MLP, a final LayerNorm and an untied head). References: ``vmap``
per-example clipping and NumPy float64 on the host. A TPU is stood in for on the CPU by
replacing `jaxwise.per_example._cost.backend_name`: the ghost norms then round their
operands to bfloat16 as a TPU's default precision would, and the clip-bound test recomputes
each example's released contribution from those rounded operands in float64.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_ghost_scale import T, batch_of, init, lm_loss

from jaxwise import optim
from jaxwise._shared._losses import Method, clip_factor
from jaxwise.compilation import CompileBudget
from jaxwise.per_example import (
    _cost,
    _ghost,
    _ghost_plan,
    _probes,
    _sparse,
    clip_and_sum,
    clip_plan,
    per_example_grads,
)
from jaxwise.per_example._api import released_bound
from jaxwise.per_example._graph import trace
from jaxwise.per_example._vmap import clip_factors, stored
from jaxwise.privacy import PoissonSampler, dp_gradient, dp_gradient_fn
from jaxwise.train import TrainState, make_epoch

METHODS: tuple[Method, ...] = ("auto", "ghost", "vmap", "chunked")


def _f64(x: Any) -> np.ndarray:
    return np.asarray(x, np.float64)


@pytest.fixture
def as_backend(monkeypatch, backend_default_precision):
    """``as_backend("tpu")``: the cost model and the ghost rounding act as on that backend, at
    the backend's default matmul precision (the lane runs accelerators at "highest")."""

    def use(name: str) -> None:
        monkeypatch.setattr(_cost, "backend_name", lambda: name)

    return use


# --------------------------------------------------------------------------
# Every method equals vmap per-example clipping and float64
# --------------------------------------------------------------------------


def _clipped(method: Method, clip: float):
    def fn(p, b):
        chunk = 4 if method == "chunked" else None
        return clip_and_sum(lm_loss, p, b, clip_norm=clip, method=method, chunk_size=chunk)

    return fn


def _dp_step(method: Method, clip: float):
    def fn(p, b, k):
        return dp_gradient(lm_loss, p, b, k, clip_norm=clip, noise_multiplier=1.0, method=method)

    return fn


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_every_method_equals_vmap_and_float64_on_a_causal_transformer():
    params, batch = init(jax.random.key(11)), batch_of(10, seed=4)
    with jax.default_matmul_precision("highest"):
        pe = jax.jit(lambda p, b: per_example_grads(lm_loss, p, b))(params, batch)
        ref = np.sqrt(sum(np.sum(_f64(g).reshape(10, -1) ** 2, 1) for g in jax.tree.leaves(pe)))
        clip = float(np.median(ref))
        got = {m: jax.jit(_clipped(m, clip))(params, batch) for m in METHODS}
    assert 0 < int(np.sum(ref > clip)) < len(ref)
    factor = np.minimum(1.0, clip / ref)
    host = [np.tensordot(factor, _f64(g), axes=1) for g in jax.tree.leaves(pe)]
    for m, (summed, norms) in got.items():
        np.testing.assert_allclose(_f64(norms), ref, rtol=1e-5, err_msg=m)
        np.testing.assert_allclose(norms, got["vmap"][1], rtol=1e-5, err_msg=m)
        for s, want, v in zip(jax.tree.leaves(summed), host, jax.tree.leaves(got["vmap"][0])):
            np.testing.assert_allclose(s, want, rtol=1e-4, atol=1e-6, err_msg=m)
            np.testing.assert_allclose(s, v, rtol=1e-4, atol=1e-6, err_msg=m)


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_micro_batches_ignore_nan_padding_and_accumulate_every_chunk():
    params, (tokens, target) = init(jax.random.key(12)), batch_of(7, seed=6)
    w = jnp.asarray([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0])

    def loss(p, ex):  # NaN in the padding rows' loss and gradients
        tok, tgt, bad = ex
        return lm_loss(p, (tok, tgt)) * jnp.where(bad, jnp.nan, 1.0)

    bad = jnp.asarray(w == 0)
    with jax.default_matmul_precision("highest"):
        want, _ = clip_and_sum(lm_loss, params, (tokens, target), clip_norm=0.5, weights=w)
        for chunk in (None, 3):
            got, norms = clip_and_sum(
                loss,
                params,
                (tokens, target, bad),
                clip_norm=0.5,
                method="chunked" if chunk else "vmap",
                chunk_size=chunk,
                weights=w,
            )
            assert np.isnan(np.asarray(norms)[~np.asarray(bad)]).sum() == 0
            for g, h in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                np.testing.assert_allclose(g, h, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------
# The clip bound at any precision, in float64 from the program's own operands
# --------------------------------------------------------------------------


def _released_norms(loss, params, batch, clip, *, slack=True):
    """Each example's released contribution, recomputed in float64 on the host from the ghost
    program's own operands (rounded activations, rounded weighted output gradients, kept and
    materialised per-example gradients, clip factors); also its pre-clip norms."""
    program = trace(loss, params, batch)
    cost = _cost.backend_cost()
    bits = _cost.operand_bits(cost)
    n = int(np.shape(jax.tree.leaves(batch)[0])[0])
    forms = _ghost_plan.plan_forms(program, n, 2**28, cost)

    def run(leaves, example):
        _, acts, grads = _probes.output_grads(program, leaves, example)
        acts, grads = _ghost.round_pass(program, acts, grads, bits)
        sq, s, pe, kept = _ghost.sq_norms(program, leaves, acts, grads, forms, bits)
        norms = jnp.sqrt(sq)
        f = clip_factor(released_bound(norms, s if slack else 0 * s, bits), clip)
        cots = {}
        for j, use in enumerate(program.uses):
            if use.kind in ("dense", "embedding") and forms.get(j) != "kept":
                g = grads[j][0].astype(jnp.float32)  # f applied in float32
                weighted = g * f.reshape(-1, *[1] * (g.ndim - 1))
                cots[j] = (
                    weighted if use.kind == "embedding" else _ghost.round_operand(weighted, bits)
                )
        return norms, f, acts, cots, pe, kept

    norms, f, acts, cots, pe, kept = jax.jit(run)(jax.tree.leaves(params), jax.tree.leaves(batch))
    assert {u.kind for u in program.uses} <= {"dense", "embedding", "elementwise"}
    total = np.zeros(n)
    for j, use in enumerate(program.uses):
        node = program.nodes[use.node]
        if j in kept:
            total += _f64(f) ** 2 * np.sum(_f64(kept[j]).reshape(n, -1) ** 2, 1)
        elif use.kind == "dense":
            a2, c2 = _ghost._dense_flat(
                node, _ghost._param_side(program, node), acts[j][0], cots[j]
            )
            grad = np.einsum("btk,btn->bkn", _f64(a2), _f64(c2))
            total += np.sum(grad.reshape(n, -1) ** 2, 1)
        elif use.kind == "embedding":
            idx = np.asarray(acts[j][0]).reshape(n, -1)
            g = _f64(cots[j]).reshape(n, idx.shape[1], -1)
            for b in range(n):
                rows: dict[int, np.ndarray] = {}
                for t, i in enumerate(idx[b]):
                    rows[int(i)] = rows.get(int(i), 0.0) + g[b, t]
                total[b] += sum(float(np.sum(r**2)) for r in rows.values())
    for g in pe.values():
        total += _f64(f) ** 2 * np.sum(_f64(g).reshape(n, -1) ** 2, 1)
    return np.sqrt(total), _f64(norms)


@pytest.mark.parametrize("backend", ["native", "tpu"])
def test_every_released_contribution_is_within_the_clip_norm_in_float64(as_backend, backend):
    """``‖f_b · contribution_b‖ ≤ C(1 + 1e-6)`` for every example, recomputed in float64 from
    the operands the program used: on the backend running the test (float32 on a CPU), and
    with a TPU's bfloat16 operands emulated on a CPU, the rounding of ``f·g̃`` taken off the
    clip factor."""
    if backend == "tpu":
        if jax.default_backend() != "cpu":
            pytest.skip("the TPU stand-in emulates bfloat16 operands on a CPU")
        as_backend(backend)
    params, batch = init(jax.random.key(13)), batch_of(12, seed=7)
    _, norms = _released_norms(lm_loss, params, batch, 1e9)
    clip = float(np.median(norms))
    released, _ = _released_norms(lm_loss, params, batch, clip)
    assert np.all(released <= clip * (1 + 1e-6)), released / clip
    assert np.sum(released > 0.98 * clip) >= 6  # the clipped half sits at (nearly) C
    if backend == "tpu":  # the bound needs the slack: without it a clipped example exceeds C
        unguarded, _ = _released_norms(lm_loss, params, batch, clip, slack=False)
        assert np.max(unguarded) > clip * (1 + 1e-6)


def test_micro_batches_keep_bfloat16_gradients_on_the_tpu_and_clip_them_in_float64(as_backend):
    """On a TPU (stood in for) the kept per-example gradients are stored as bfloat16 (half the
    bytes) and the clip factors are taken from those stored values: in float64 on the host,
    every released ``f·g̃`` is within ``C(1 + 1e-6)`` and the clipped sum is ``Σ f·g̃``; the
    CPU keeps float32."""
    params, batch = init(jax.random.key(16)), batch_of(8, seed=9)
    w, n = jnp.ones(8), 8
    native = jax.jit(lambda p, b: clip_factors(lm_loss, p, b, w, 1.0, None))(params, batch)
    assert {g.dtype for g in jax.tree.leaves(native[0])} == {jnp.dtype(jnp.float32)}
    as_backend("tpu")
    bits = _cost.operand_bits(_cost.backend_cost())
    grads, norms, factor = jax.jit(lambda p, b: clip_factors(lm_loss, p, b, w, 1.0, bits))(
        params, batch
    )
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.bfloat16)}
    own = np.sqrt(sum(np.sum(_f64(g).reshape(n, -1) ** 2, 1) for g in jax.tree.leaves(grads)))
    clip = float(np.median(own))
    np.testing.assert_allclose(_f64(norms), own, rtol=1e-6)
    _, _, factor = jax.jit(lambda p, b: clip_factors(lm_loss, p, b, w, clip, bits))(params, batch)
    assert np.all(_f64(factor) * own <= clip * (1 + 1e-6)) and np.any(_f64(factor) < 1)


def _sparse_released(params, batch, clip, bits):
    """The micro-batched path's own operands (`_sparse.clip_parts`): each example's released
    contribution per leaf, recomputed in float64 on the host (the embedding table's from its
    looked-up rows' rounded output gradients, repeated rows combined), and the clip factors."""
    program = trace(lm_loss, params, batch)
    uses = _sparse.sparse_uses(program)
    leaves, example = jax.tree.leaves(params), jax.tree.leaves(batch)
    n = int(np.shape(example[0])[0])
    parts = jax.jit(
        lambda lv, ex: _sparse.clip_parts(program, uses, lv, ex, jnp.ones(n), clip, bits, stored)
    )(leaves, example)
    dense, acts, g, _, factor = parts
    per_leaf = {i: _f64(x) for i, x in dense.items()}
    for j in uses:
        (table,) = program.uses[j].leaves
        idx = np.asarray(acts[j][0]).reshape(n, -1)
        rows = _f64(g[j][0]).reshape(n, idx.shape[1], -1)
        full = np.zeros((n, *np.shape(leaves[table])))
        for b in range(n):
            np.add.at(full[b], idx[b], rows[b])
        per_leaf[table] = full
    return per_leaf, _f64(factor)


def test_micro_batches_keep_embedding_tables_sparse_and_clip_them_in_float64(as_backend):
    """On a TPU (stood in for) the micro-batched path never forms the embedding table's
    per-example gradient: its norm and clipped sum come from the looked-up rows' output
    gradients, rounded once to bfloat16 (the dense leaves' kept gradients are bfloat16 too).
    In float64 on the host every released contribution is within ``C(1 + 1e-6)`` and the
    clipped sum is ``Σ f·g̃`` (the table's a scatter of ``f·g̃``)."""
    params, batch = init(jax.random.key(16)), batch_of(8, seed=9)
    as_backend("tpu")
    bits = _cost.operand_bits(_cost.backend_cost())
    plan = clip_plan(lm_loss, params, batch, method="chunked", chunk_size=4)
    assert plan.sparse == ("embed",), str(plan)
    assert "embedding tables kept sparse: embed" in str(plan)
    per_leaf, _ = _sparse_released(params, batch, 1e9, bits)
    own = np.sqrt(sum(np.sum(x.reshape(8, -1) ** 2, 1) for x in per_leaf.values()))
    clip = float(np.median(own))
    per_leaf, factor = _sparse_released(params, batch, clip, bits)
    released = factor * np.sqrt(sum(np.sum(x.reshape(8, -1) ** 2, 1) for x in per_leaf.values()))
    assert np.all(released <= clip * (1 + 1e-6)) and np.sum(released > 0.98 * clip) >= 3
    summed, _ = jax.jit(
        lambda p, b: clip_and_sum(lm_loss, p, b, clip_norm=clip, method="chunked", chunk_size=4)
    )(params, batch)
    # the chunked program forms its per-example gradients anew (in chunks of 4): an entry near a
    # bfloat16 rounding boundary may round the other way there, by at most one unit (2^-8)
    for i, got in enumerate(jax.tree.leaves(summed)):
        want = np.tensordot(factor, per_leaf[i], axes=1)
        ulp = 2.0**-8 * np.tensordot(factor, np.abs(per_leaf[i]), axes=1)
        assert got.dtype == jnp.float32
        assert np.all(np.abs(_f64(got) - want) <= ulp + 1e-6 * np.abs(want).max())


def _table_loss(p, example):
    """A bag-of-tokens classifier: the table is only looked up (kept sparse)."""
    tokens, target = example
    x = jnp.tanh(p["embed"][tokens] + p["pos"])
    return -jax.nn.log_softmax(x.mean(0) @ p["head"])[target[0] % 10]


def _tied_loss(p, example):
    """An LM whose head is the embedding table: read twice (a lookup and a dense product), its
    per-example gradient is not a sum of looked-up rows."""
    tokens, target = example
    logits = jnp.tanh(p["embed"][tokens] + p["pos"]) @ p["embed"].T
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), target[:, None], axis=-1))


@pytest.mark.parametrize("method", ["vmap", "chunked"])
def test_the_micro_batched_program_never_holds_a_per_example_table(method):
    """The per-example gradient of a looked-up table (m × V × d floats, odd sizes so that no
    other array has the shape) appears nowhere in the program of the sparse path; a tied
    table (read by the head too) is formed per example. Both are clipped exactly."""
    vocab, d = 1031, 24
    keys = jax.random.split(jax.random.key(21), 3)
    table = {
        "embed": jax.random.normal(keys[0], (vocab, d)),
        "pos": 0.1 * jax.random.normal(keys[1], (T, d)),
    }
    params = {**table, "head": 0.3 * jax.random.normal(keys[2], (d, 10))}
    batch = batch_of(8, seed=3, vocab=vocab)
    chunk = 4 if method == "chunked" else None
    shape = f"<{chunk or 8}x{vocab}x{d}x"  # a StableHLO tensor type

    def clipped(loss, clip=1.0):
        def fn(p, b):
            return clip_and_sum(loss, p, b, clip_norm=clip, method=method, chunk_size=chunk)

        return fn

    for loss, p, sparse in ((_table_loss, params, ("embed",)), (_tied_loss, table, ())):
        assert clip_plan(loss, p, batch, method=method, chunk_size=chunk).sparse == sparse
        held = shape in jax.jit(clipped(loss)).lower(p, batch).as_text()
        assert held == (not sparse)
        with jax.default_matmul_precision("highest"):
            pe = jax.jit(lambda p, b, loss=loss: per_example_grads(loss, p, b))(p, batch)
            ref = np.sqrt(sum(np.sum(_f64(g).reshape(8, -1) ** 2, 1) for g in jax.tree.leaves(pe)))
            clip = float(np.median(ref))
            summed, norms = jax.jit(clipped(loss, clip))(p, batch)
        np.testing.assert_allclose(_f64(norms), ref, rtol=1e-5)
        factor = np.minimum(1.0, clip / ref)
        assert np.any(factor < 1)
        for got, g in zip(jax.tree.leaves(summed), jax.tree.leaves(pe)):
            want = np.tensordot(factor, _f64(g), axes=1)
            np.testing.assert_allclose(_f64(got), want, rtol=1e-4, atol=1e-6)


def test_kept_bfloat16_gradients_are_rounded_by_an_op_xla_keeps():
    """The TPU lane: XLA (excess precision) computed the norms of ``g.astype(bf16)`` from the
    unrounded float32 ``g``, 2e-4 off the stored values the clipped sum reads. Every float32
    leaf is rounded by ``reduce_precision`` (never removed) before its bfloat16 cast."""
    grads = {"w": jnp.ones((4, 3)), "i": jnp.ones(4, jnp.int32)}
    jaxpr = jax.make_jaxpr(lambda g: stored(g, 8))(grads).jaxpr
    casts = [e for e in jaxpr.eqns if e.primitive.name == "convert_element_type"]
    rounded = {e.outvars[0] for e in jaxpr.eqns if e.primitive.name == "reduce_precision"}
    assert len(casts) == 1 and casts[0].invars[0] in rounded
    assert casts[0].params["new_dtype"] == jnp.bfloat16
    x = jnp.asarray([1.0 + 2**-9, 1.0 + 3 * 2**-9, -3.14159])
    np.testing.assert_array_equal(stored(x, 8), x.astype(jnp.bfloat16))


def test_the_tpu_stand_in_rounds_operands_to_bfloat16_and_highest_rounds_nothing(as_backend):
    as_backend("tpu")
    assert _cost.operand_bits(_cost.backend_cost()) == 8
    with jax.default_matmul_precision("highest"):
        assert _cost.operand_bits(_cost.backend_cost()) is None
    with jax.default_matmul_precision("bfloat16"):
        assert _cost.operand_bits(_cost.backend_cost("gpu")) == 8
    assert _cost.operand_bits(_cost.backend_cost("gpu")) == 11
    assert _cost.operand_bits(_cost.backend_cost("cpu")) is None
    x = jnp.asarray([1.0 + 2**-9, 1.0 + 3 * 2**-9, -3.14159])
    np.testing.assert_array_equal(
        _ghost.round_operand(x, 8), np.asarray(x.astype(jnp.bfloat16), np.float32)
    )


def test_dp_sgd_step_at_the_default_precision_keeps_the_clip_bound_and_agrees_with_vmap():
    """Issue 47: a DP-SGD step with ghost and with vmap at the backend's default matmul
    precision (on any backend): every example's released contribution ≤ C(1 + 1e-6),
    recomputed in float64 on the host, and the two noisy gradients agree within a bound
    derived from that precision (``16·u·C`` per example, ``u`` its operand unit roundoff)."""
    params, batch = init(jax.random.key(14)), batch_of(8, seed=8)
    key, n = jax.random.key(15), 8
    pe = jax.jit(lambda p, b: per_example_grads(lm_loss, p, b))(params, batch)
    host_norms = np.sqrt(sum(np.sum(_f64(g).reshape(n, -1) ** 2, 1) for g in jax.tree.leaves(pe)))
    clip = float(np.median(host_norms))
    step = {m: jax.jit(_dp_step(m, clip))(params, batch, key) for m in METHODS[1:3]}
    # ghost: from its own operands; vmap: its per-example gradients times its clip factors
    released, _ = _released_norms(lm_loss, params, batch, clip)
    assert np.all(released <= clip * (1 + 1e-6)), released / clip
    w = jnp.ones(n)
    grads, _, factor = jax.jit(lambda p, b: clip_factors(lm_loss, p, b, w, clip))(params, batch)
    own = np.sqrt(sum(np.sum(_f64(g).reshape(n, -1) ** 2, 1) for g in jax.tree.leaves(grads)))
    assert np.all(_f64(factor) * own <= clip * (1 + 1e-6)), _f64(factor) * own / clip
    bits = _cost.operand_bits(_cost.backend_cost())
    u = 2.0 ** -(bits or 24)
    diff = np.sqrt(
        sum(
            np.sum((_f64(a) - _f64(b)) ** 2)
            for a, b in zip(
                jax.tree.leaves(step["ghost"].grads), jax.tree.leaves(step["vmap"].grads)
            )
        )
    )
    assert diff * n <= max(16 * u, 1e-5) * n * clip, (diff * n, u)


# --------------------------------------------------------------------------
# The cost model's choices, on both sides of each threshold, per backend
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "k", "t_gram", "t_kept"),
    [("cpu", 128, 24, 40), ("tpu", 768, 256, 384)],
)
def test_each_layer_takes_the_gram_form_below_its_threshold_and_is_kept_above(
    backend, k, t_gram, t_kept, backend_default_precision
):
    """A (K, K) weight at T positions: Gram costs 2T²·2K FLOPs (+ its T² floats and a
    re-read of a and g), a kept per-example gradient 4K² FLOPs and 2K² floats of traffic;
    the crossing T moves with the backend's FLOPs per byte (CPU 4: T ≈ 29 at K = 128;
    TPU 85: T ≈ 267 at K = 768)."""
    cost = _cost.backend_cost(backend)
    assert _ghost_plan.norm_form(t_gram, k, k, cost) == "gram"
    assert _ghost_plan.norm_form(t_kept, k, k, cost) == "per-example"
    assert _ghost_plan.norm_form(1, k, k, cost) == "rank-one"


def _dense(t: int, k: int):
    w = jnp.full((k, k), 1.0 / k)
    x = jax.ShapeDtypeStruct((8, t, k) if t > 1 else (8, k), jnp.float32)  # shapes suffice
    return (lambda w, x: jnp.sum(jnp.tanh(x @ w))), w, x


@pytest.mark.parametrize(
    ("backend", "t", "k", "budget", "method"),
    [
        # nothing may be kept (budget 1 byte): at T = 32 both backends materialise the
        # whole gradient (its kept bytes cost less than the Gram norms), at T = 16 both take
        # ghost norms
        ("cpu", 32, 64, 1, "chunked"),
        ("tpu", 32, 64, 1, "chunked"),
        ("cpu", 16, 64, 1, "ghost"),
        ("tpu", 16, 64, 1, "ghost"),
        # a wide layer on the TPU: Gram norms up to T ~ 200 (bench_dp_scale.py's classifiers,
        # T = 256 at d = 512 and 768, run faster micro-batched)
        ("tpu", 128, 768, 1, "ghost"),
        ("tpu", 256, 768, 1, "chunked"),
        # kept within the budget: ghost book-keeping is the per-example gradient, no more
        ("cpu", 64, 64, 2**28, "ghost"),
        # no positions: the rank-one norm costs nothing
        ("tpu", 1, 512, 1, "ghost"),
        ("cpu", 1, 512, 1, "ghost"),
    ],
)
def test_auto_chooses_ghost_or_micro_batches_by_the_backends_costs(
    as_backend, backend, t, k, budget, method
):
    as_backend(backend)
    loss, w, x = _dense(t, k)
    plan = clip_plan(loss, w, x, memory_budget=budget)
    assert plan.method == method, str(plan)
    assert plan.backend == backend and plan.rows[0].path == "<root>"
    assert (plan.ghost_cost is not None) and plan.micro_cost > 0
    if method == "ghost":
        assert "ghost costs" in plan.reason and plan.chunk_size is None
    else:
        assert "per-example gradients cost less" in plan.reason
        assert plan.chunk_size == 1
    assert method in str(plan)


@pytest.mark.parametrize(("k", "chunk"), [(1024, 16), (6144, 8)])
def test_the_tpu_takes_micro_batches_of_at_most_16_within_a_gibibyte(as_backend, k, chunk):
    """On a TPU (stood in) with the chip's memory budget, 64 examples of a (K, K) weight at
    T = 2048: K = 1024 keeps 2 MiB of bfloat16 gradients an example, 32 at once would fit,
    the cap takes 16 (the 16.9M classifier's fastest); K = 6144 keeps 72 MiB, 16 would be
    1.2 GiB, the 1 GiB bound takes 8 (the 49M classifier's)."""
    as_backend("tpu")
    w = jax.ShapeDtypeStruct((k, k), jnp.float32)
    x = jax.ShapeDtypeStruct((64, 2048, k), jnp.float32)  # shapes suffice: nothing runs
    plan = clip_plan(lambda w, x: jnp.sum(jnp.tanh(x @ w)), w, x, memory_budget=5 * 2**30)
    assert (plan.method, plan.chunk_size) == ("chunked", chunk), str(plan)
    assert _cost.backend_cost("tpu").max_micro == 16


def test_clip_plan_reports_explicit_methods_and_refuses_bad_options():
    def scanned(w, x):  # a weight inside lax.scan
        return jnp.sum(jax.lax.scan(lambda c, xi: (jnp.tanh(c @ w + xi), None), x[0], x)[0])

    w, x = jnp.eye(3), jnp.ones((4, 5, 3))
    assert clip_plan(scanned, w, x, method="vmap").method == "vmap"
    chunked = clip_plan(scanned, w, x, method="chunked", chunk_size=2)
    assert (chunked.method, chunked.chunk_size) == ("chunked", 2)
    with pytest.raises(ValueError, match="memory_budget"):
        clip_plan(scanned, w, x, memory_budget=0)
    with pytest.raises(ValueError, match="method"):
        clip_plan(scanned, w, x, method="micro")  # pyright: ignore[reportArgumentType]  # bad on purpose


# --------------------------------------------------------------------------
# Memory and compile counts
# --------------------------------------------------------------------------


def _memory(fn, *args) -> int:
    mem = jax.jit(fn).lower(*args).compile().memory_analysis()
    assert mem is not None
    return mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_dp_auto_peak_memory_is_at_most_the_non_private_gradients():
    """Compiled ``memory_analysis`` (temp + arguments + outputs) at a CPU-sized config
    (T = 64, d = 64, B = 32): the default DP gradient (auto: ghost here, measured 0.92×) and
    micro-batches of 8 (0.29×) peak below the non-private gradient at the same batch."""
    t, d = 64, 64
    params = init(jax.random.key(5), d=d, heads=4, t=t, vocab=512)
    batch = batch_of(32, t=t, vocab=512)
    key = jax.random.key(6)

    def non_private(p, b):
        return jax.grad(lambda p: jnp.mean(jax.vmap(lm_loss, in_axes=(None, 0))(p, b)))(p)

    def dp(method, chunk):
        def fn(p, b, k):
            return dp_gradient(
                lm_loss,
                p,
                b,
                k,
                clip_norm=1.0,
                noise_multiplier=1.0,
                method=method,
                chunk_size=chunk,
            )

        return fn

    base = _memory(non_private, params, batch)
    assert _memory(dp("auto", None), params, batch, key) <= base
    assert _memory(dp("chunked", 8), params, batch, key) <= 0.5 * base


@pytest.mark.parametrize("method", ["auto", "chunked"])
def test_the_dp_epoch_compiles_once(method):
    params = init(jax.random.key(3))
    tokens, target = batch_of(40, seed=5)
    grad_fn = dp_gradient_fn(
        lm_loss,
        clip_norm=1.0,
        noise_multiplier=0.7,
        method=method,
        chunk_size=4 if method == "chunked" else None,
    )
    epoch = make_epoch(grad_fn, PoissonSampler(8, 4))
    state = TrainState.create(params, optim.adamw(1e-3), jax.random.key(4))
    with CompileBudget(1, epoch, exact=True):
        new, _ = epoch(state, (tokens, target))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(new.params))
    with CompileBudget(0, epoch, exact=True):
        epoch(new, (tokens, target))


@pytest.mark.parametrize("n", [1, 7, 29, 34, 64, 101, 1037])
@pytest.mark.parametrize("m", [1, 4, 8, 16])
def test_even_micro_batches_keep_the_count_and_the_cap_and_pad_least(n, m):
    even = _cost.even_chunks(n, m)
    count = -(-n // m)
    assert even <= m and -(-n // even) == count  # as many micro-batches, none larger
    assert all(-(-n // k) > count for k in range(1, even))  # no smaller size keeps the count
