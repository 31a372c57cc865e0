"""Ghost clipping on a multi-layer causal transformer LM (issue 42), at reduced size.

Embedding + learned positions, two pre-LN blocks (causal multi-head attention with a
(d, 3, H, d/H) QKV projection and an (H, d/H, d) output projection; a GELU MLP without
biases), a final LayerNorm and an untied LM head; next-token loss averaged over each
example's tokens. At T = 8 the CPU's cost table keeps every layer's per-example gradients
(the Gram form with a budget too small to keep them), a TPU's takes the Gram form for the
MLP, so both branches run. References: ``method="vmap"`` (exact per-example gradients),
NumPy float64 norms of those, and jax-privacy's ``clipped_grad``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim
from jaxwise.compilation import CompileBudget
from jaxwise.per_example import clip_and_sum, ghost_coverage, per_example_grads
from jaxwise.privacy import PoissonSampler, dp_gradient, dp_gradient_fn
from jaxwise.train import TrainState, make_epoch

D, HEADS, T, VOCAB, LAYERS = 8, 2, 8, 16, 2


def init(key, d=D, heads=HEADS, t=T, vocab=VOCAB, layers=LAYERS):
    ks = iter(jax.random.split(key, 4 + 4 * layers))
    n = lambda shape, scale: scale * jax.random.normal(next(ks), shape, jnp.float32)  # noqa: E731
    blocks = [
        {
            "ln1": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
            "qkv": n((d, 3, heads, d // heads), d**-0.5),
            "out": n((heads, d // heads, d), d**-0.5),
            "ln2": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
            "fc1": n((d, 4 * d), d**-0.5),
            "fc2": n((4 * d, d), (4 * d) ** -0.5),
        }
        for _ in range(layers)
    ]
    return {
        "embed": n((vocab, d), 1.0),
        "pos": n((t, d), 0.3),
        "blocks": blocks,
        "ln_f": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
        "head": n((d, vocab), d**-0.5),
    }


def _norm(x, p):
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def lm_loss(p, example):
    """Next-token cross-entropy of ONE sequence, averaged over its tokens."""
    tokens, target = example
    t, d = p["pos"].shape
    heads = p["blocks"][0]["out"].shape[0]
    x = p["embed"][tokens] + p["pos"]
    causal = jnp.tril(jnp.ones((t, t), bool))
    for blk in p["blocks"]:
        h = _norm(x, blk["ln1"])
        q, k, v = jnp.einsum("td,dche->cthe", h, blk["qkv"])
        s = jnp.einsum("the,she->hts", q, k) * np.float32((d // heads) ** -0.5)
        a = jax.nn.softmax(jnp.where(causal, s, np.float32(-1e9)), axis=-1)
        x = x + jnp.einsum("hts,she,hed->td", a, v, blk["out"])
        h = _norm(x, blk["ln2"])
        x = x + jax.nn.gelu(h @ blk["fc1"]) @ blk["fc2"]
    logp = jax.nn.log_softmax(_norm(x, p["ln_f"]) @ p["head"], axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, target[:, None], axis=-1))


def batch_of(b, seed=0, t=T, vocab=VOCAB):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (b, t + 1))
    tokens[0, :4] = 3  # repeated tokens in one example (the embedding's rows combine)
    return jnp.asarray(tokens[:, :-1], jnp.int32), jnp.asarray(tokens[:, 1:], jnp.int32)


def _f64_norms(grads):
    leaves = [np.asarray(g, np.float64).reshape(g.shape[0], -1) for g in jax.tree.leaves(grads)]
    return np.sqrt(sum(np.sum(np.square(x), axis=1) for x in leaves))


def test_coverage_takes_both_forms_by_shape_and_backend(monkeypatch, backend_default_precision):
    # each backend injected, at its own default precision (a TPU's bfloat16 pass halves the
    # kept gradient's bytes; the lane's "highest" would not)
    from jaxwise.per_example import _cost

    params = init(jax.random.key(0))
    example = jax.tree.map(lambda a: a[0], batch_of(1))
    monkeypatch.setattr(_cost, "backend_name", lambda: "cpu")
    cpu = {r.path: r.norm for r in ghost_coverage(lm_loss, params, example)}
    assert {cpu[p] for p in ("blocks.0.qkv", "blocks.1.fc2", "blocks.0.out", "head")} == {
        "per-example"
    }
    monkeypatch.setattr(_cost, "backend_name", lambda: "tpu")  # bytes cost more: Gram at K·N 256
    rows = {r.path: r for r in ghost_coverage(lm_loss, params, example)}
    assert rows["blocks.0.fc1"].norm == rows["blocks.1.fc2"].norm == "gram"
    assert rows["blocks.0.out"].norm == rows["head"].norm == "per-example"
    assert rows["embed"].kind == "embedding" and rows["embed"].norm == "gram"
    assert rows["blocks.0.ln1.scale"].norm == "per-example"
    assert {r.kind for r in rows.values()} == {"dense", "embedding", "elementwise"}
    assert "gram" in str(rows["blocks.0.fc1"])


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
@pytest.mark.parametrize("budget", [2**28, 1])  # per-example gradients kept / formed and dropped
def test_ghost_equals_vmap_and_float64_on_a_causal_transformer(budget):
    params, batch = init(jax.random.key(1)), batch_of(12)
    with jax.default_matmul_precision("highest"):
        pe = jax.jit(lambda p, b: per_example_grads(lm_loss, p, b))(params, batch)
        ref = _f64_norms(pe)
        clip = float(np.median(ref))
        ref_sum, ref_norms = jax.jit(
            lambda p, b: clip_and_sum(lm_loss, p, b, clip_norm=clip, method="vmap")
        )(params, batch)
        summed, norms = jax.jit(
            lambda p, b: clip_and_sum(
                lm_loss, p, b, clip_norm=clip, method="ghost", memory_budget=budget
            )
        )(params, batch)
    assert 0 < int(np.sum(ref > clip)) < len(ref)
    np.testing.assert_allclose(np.asarray(norms, np.float64), ref, rtol=1e-5)
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-5)
    # the clipped sum against float64 on the host from the per-example gradients
    factor = np.minimum(1.0, clip / ref)
    for got, want, g in zip(
        jax.tree.leaves(summed), jax.tree.leaves(ref_sum), jax.tree.leaves(pe), strict=True
    ):
        host = np.tensordot(factor, np.asarray(g, np.float64), axes=1)
        np.testing.assert_allclose(got, host, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.filterwarnings("ignore:optax.global_norm is deprecated:DeprecationWarning")
def test_ghost_clipped_sum_equals_jax_privacy():
    jax_privacy = pytest.importorskip("jax_privacy")
    params, batch = init(jax.random.key(2)), batch_of(6, seed=3)
    with jax.default_matmul_precision("highest"):
        peer = jax_privacy.clipped_grad(
            lm_loss, l2_clip_norm=0.5, batch_argnums=1, keep_batch_dim=False
        )
        want = jax.jit(peer)(params, batch)
        got, _ = jax.jit(lambda p, b: clip_and_sum(lm_loss, p, b, clip_norm=0.5, method="ghost"))(
            params, batch
        )
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_dp_epoch_with_ghost_compiles_once():
    params = init(jax.random.key(3))
    tokens, target = batch_of(40, seed=5)
    grad_fn = dp_gradient_fn(lm_loss, clip_norm=1.0, noise_multiplier=0.7, method="ghost")
    epoch = make_epoch(grad_fn, PoissonSampler(8, 4))
    state = TrainState.create(params, optim.adamw(1e-3), jax.random.key(4))
    with CompileBudget(1, epoch, exact=True):
        new, metrics = epoch(state, (tokens, target))
    steps = int(new.step)
    assert steps == len(np.asarray(metrics["skipped"])) > 0
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(new.params))
    with CompileBudget(0, epoch, exact=True):  # the second epoch reuses the program
        epoch(new, (tokens, target))


def _memory(fn, *args):
    mem = jax.jit(fn).lower(*args).compile().memory_analysis()
    assert mem is not None
    return mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_ghost_peak_memory_within_a_quarter_of_the_non_private_step():
    """Compiled ``memory_analysis`` (temp + arguments + outputs) at a CPU-sized config."""
    t, d = 64, 64
    params = init(jax.random.key(5), d=d, heads=4, t=t, vocab=512)
    batch = batch_of(32, t=t, vocab=512)
    key = jax.random.key(6)

    def non_private(p, b):
        return jax.grad(lambda p: jnp.mean(jax.vmap(lm_loss, in_axes=(None, 0))(p, b)))(p)

    def ghost(p, b, k):
        return dp_gradient(lm_loss, p, b, k, clip_norm=1.0, noise_multiplier=1.0, method="ghost")

    ratio = _memory(ghost, params, batch, key) / _memory(non_private, params, batch)
    assert ratio <= 1.25, ratio
