"""Tests for ghost clipping on any JAX program: ghost == vmap for six model families.

Each model is a ``loss_single(params, *example)``; ``method="ghost"`` must equal
``method="vmap"`` (float32, rtol 1e-4) for per-example norms, clipped sums and DP
gradients, and :func:`ghost_coverage` must classify every leaf exactly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import numerics
from jaxwise.compilation import CompileCounter
from jaxwise.models import from_equinox, from_linen, from_nnx
from jaxwise.per_example import clip_and_sum, ghost_coverage, per_example_grad_norms
from jaxwise.privacy import dp_gradient, dp_gradient_accumulated


def xent(logits, y):
    return -numerics.log_softmax(logits)[y]


def _normal(key, shape, scale=0.3):
    return scale * jax.random.normal(key, shape, jnp.float32)


# --------------------------------------------------------------------------
# Models: plain JAX
# --------------------------------------------------------------------------


def mlp():
    ks = jax.random.split(jax.random.key(0), 3)
    params = {
        "l1": {"w": _normal(ks[0], (6, 16)), "b": jnp.full((16,), 0.1)},
        "l2": {"w": _normal(ks[1], (16, 16)), "b": jnp.full((16,), -0.1)},
        "out": {"w": _normal(ks[2], (16, 4)), "b": jnp.zeros(4)},
    }

    def loss(p, x, y):
        h = jax.nn.relu(x @ p["l1"]["w"] + p["l1"]["b"])
        h = jnp.tanh(h @ p["l2"]["w"] + p["l2"]["b"])
        return xent(h @ p["out"]["w"] + p["out"]["b"], y)

    rng = np.random.default_rng(1)
    batch = (
        jnp.asarray(rng.normal(size=(13, 6)), jnp.float32),
        jnp.asarray(rng.integers(0, 4, 13), jnp.int32),
    )
    kinds = {
        "l1.b": "elementwise",
        "l1.w": "dense",
        "l2.b": "elementwise",
        "l2.w": "dense",
        "out.b": "elementwise",
        "out.w": "dense",
    }
    return loss, params, batch, kinds


def cnn():
    ks = jax.random.split(jax.random.key(1), 3)
    params = {
        "c1": {"k": _normal(ks[0], (3, 3, 2, 4)), "b": jnp.full((4,), 0.05)},
        "c2": {"k": _normal(ks[1], (3, 3, 4, 6)), "b": jnp.full((6,), -0.05)},
        "head": {"w": _normal(ks[2], (6 * 2 * 2, 3)), "b": jnp.zeros(3)},
    }
    dn = ("NHWC", "HWIO", "NHWC")

    def loss(p, x, y):
        h = jax.lax.conv_general_dilated(
            x[None], p["c1"]["k"], (1, 1), "SAME", dimension_numbers=dn
        )
        h = jax.nn.relu(h + p["c1"]["b"])
        h = jax.lax.conv_general_dilated(
            h, p["c2"]["k"], (2, 2), ((1, 1), (1, 1)), dimension_numbers=dn
        )
        h = jax.nn.relu(h + p["c2"]["b"])
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return xent(h.reshape(-1) @ p["head"]["w"] + p["head"]["b"], y)

    rng = np.random.default_rng(2)
    batch = (
        jnp.asarray(rng.normal(size=(9, 8, 8, 2)), jnp.float32),
        jnp.asarray(rng.integers(0, 3, 9), jnp.int32),
    )
    kinds = {
        "c1.b": "elementwise",
        "c1.k": "conv",
        "c2.b": "elementwise",
        "c2.k": "conv",
        "head.b": "elementwise",
        "head.w": "dense",
    }
    return loss, params, batch, kinds


def embedding_model():
    ks = jax.random.split(jax.random.key(2), 2)
    params = {"table": _normal(ks[0], (7, 5), 1.0), "w": _normal(ks[1], (5, 3))}

    def loss(p, tokens, y):
        e = p["table"][tokens]  # (T, 5): repeated tokens hit the same row
        return xent(jnp.tanh(e).sum(0) @ p["w"], y)

    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(0, 7, (11, 9)), jnp.int32)  # 9 tokens from 7 rows: repeats
    batch = (tokens, jnp.asarray(rng.integers(0, 3, 11), jnp.int32))
    return loss, params, batch, {"table": "embedding", "w": "dense"}


def transformer():
    d, heads, vocab, t = 8, 2, 11, 6
    ks = jax.random.split(jax.random.key(3), 9)
    params = {
        "embed": _normal(ks[0], (vocab, d), 1.0),
        "pos": _normal(ks[1], (t, d), 0.1),
        "ln1": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
        "attn": {
            "q": _normal(ks[2], (d, heads, d // heads)),
            "k": _normal(ks[3], (d, heads, d // heads)),
            "v": _normal(ks[4], (d, heads, d // heads)),
            "o": _normal(ks[5], (heads, d // heads, d)),
        },
        "ln2": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
        "mlp": {"w1": _normal(ks[6], (d, 16)), "b1": jnp.zeros(16), "w2": _normal(ks[7], (16, d))},
        "head": _normal(ks[8], (d, 3)),
    }

    def layer_norm(x, p):
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]

    def loss(p, tokens, y):
        x = p["embed"][tokens] + p["pos"]
        h = layer_norm(x, p["ln1"])
        q, k, v = (jnp.einsum("td,dhk->thk", h, p["attn"][n]) for n in "qkv")
        att = jax.nn.softmax(
            jnp.einsum("thk,shk->hts", q, k) / np.sqrt(d // heads).astype(np.float32), axis=-1
        )
        x = x + jnp.einsum("hts,shk,hkd->td", att, v, p["attn"]["o"])
        h = layer_norm(x, p["ln2"])
        x = x + jax.nn.gelu(h @ p["mlp"]["w1"] + p["mlp"]["b1"]) @ p["mlp"]["w2"]
        return xent(x.mean(0) @ p["head"], y)

    rng = np.random.default_rng(4)
    batch = (
        jnp.asarray(rng.integers(0, vocab, (10, t)), jnp.int32),
        jnp.asarray(rng.integers(0, 3, 10), jnp.int32),
    )
    kinds = {
        "attn.k": "dense",
        "attn.o": "dense",
        "attn.q": "dense",
        "attn.v": "dense",
        "embed": "embedding",
        "head": "dense",
        "ln1.bias": "elementwise",
        "ln1.scale": "elementwise",
        "ln2.bias": "elementwise",
        "ln2.scale": "elementwise",
        "mlp.b1": "elementwise",
        "mlp.w1": "dense",
        "mlp.w2": "dense",
        "pos": "elementwise",
    }
    return loss, params, batch, kinds


def nnx_model():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(2, 4, (3, 3), rngs=rngs)
            self.norm = nnx.LayerNorm(4, rngs=rngs)
            self.out = nnx.Linear(4 * 6 * 6, 3, rngs=rngs)

        def __call__(self, x):
            h = nnx.relu(self.norm(self.conv(x)))
            return self.out(h.reshape(h.shape[0], -1))

    model = from_nnx(Net(nnx.Rngs(0)))

    def loss(p, x, y):
        logits, _ = model.apply(p, model.model_state, x[None])
        return xent(logits[0], y)

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(7, 6, 6, 2)), jnp.float32)
    batch = (x, jnp.asarray(rng.integers(0, 3, 7), jnp.int32))
    kinds = {
        "conv.bias.value": "elementwise",
        "conv.kernel.value": "conv",
        "norm.bias.value": "elementwise",
        "norm.scale.value": "elementwise",
        "out.bias.value": "elementwise",
        "out.kernel.value": "dense",
    }
    return loss, model.params, batch, kinds


def linen_model():
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            h = nn.Embed(10, 6)(tokens)
            h = nn.LayerNorm()(nn.gelu(nn.Dense(8)(h)))
            return nn.Dense(3)(h.mean(0))

    rng = np.random.default_rng(10)
    tokens = jnp.asarray(rng.integers(0, 10, (9, 5)), jnp.int32)
    module = Net()
    model = from_linen(module, module.init(jax.random.key(0), tokens[0]))

    def loss(p, t, y):
        return xent(model.apply(p, model.model_state, t)[0], y)

    kinds = {
        "Dense_0.bias": "elementwise",
        "Dense_0.kernel": "dense",
        "Dense_1.bias": "elementwise",
        "Dense_1.kernel": "dense",
        "Embed_0.embedding": "embedding",
        "LayerNorm_0.bias": "elementwise",
        "LayerNorm_0.scale": "elementwise",
    }
    return loss, model.params, (tokens, jnp.asarray(rng.integers(0, 3, 9), jnp.int32)), kinds


def equinox_model():
    import equinox as eqx

    class Net(eqx.Module):
        embed: eqx.nn.Embedding
        head: eqx.nn.MLP

        def __call__(self, tokens):
            return self.head(jnp.tanh(jax.vmap(self.embed)(tokens)).mean(0))

    keys = jax.random.split(jax.random.key(6), 2)
    model = from_equinox(
        Net(eqx.nn.Embedding(9, 6, key=keys[0]), eqx.nn.MLP(6, 3, 12, 2, key=keys[1]))
    )

    def loss(p, tokens, y):
        return xent(model.apply(p, model.model_state, tokens)[0], y)

    rng = np.random.default_rng(6)
    tokens = jnp.asarray(rng.integers(0, 9, (8, 5)), jnp.int32)
    return loss, model.params, (tokens, jnp.asarray(rng.integers(0, 3, 8), jnp.int32)), None


MODELS = {
    "mlp": (mlp, 3.0),
    "cnn": (cnn, 10.0),
    "embedding": (embedding_model, 6.0),
    "transformer": (transformer, 2.5),
    "nnx": (nnx_model, 8.0),
    "linen": (linen_model, 2.5),
    "equinox": (equinox_model, 1.4),
}


def _close(a, b, rtol=1e-4, atol=1e-6):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(
            np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=rtol, atol=atol
        )


def packed(loss):
    """``loss(p, x, y)`` of the models above as ``loss(p, (x, y))``: the library's convention."""
    return lambda p, example: loss(p, *example)


def first(batch):
    """The first example of a tuple batch (no batch axis): what ``ghost_coverage`` takes."""
    return tuple(a[0] for a in batch)


def _everything(loss, method, clip):
    """One jitted program: norms, clipped sum and DP gradient by ``method``."""
    loss = packed(loss)

    def run(params, batch, key):
        norms = per_example_grad_norms(loss, params, batch, method=method)
        summed, sum_norms = clip_and_sum(loss, params, batch, clip_norm=clip, method=method)
        noisy, _, _, _ = dp_gradient(
            loss, params, batch, key, clip_norm=clip, noise_multiplier=1.0, method=method
        )
        return norms, sum_norms, summed, noisy

    return jax.jit(run)


@pytest.mark.parametrize("name", list(MODELS))
def test_ghost_equals_vmap(name):
    make, clip = MODELS[name]
    loss, params, batch, _ = make()
    key = jax.random.key(7)
    ref_norms, _, ref_sum, ref_dp = _everything(loss, "vmap", clip)(params, batch, key)
    assert 0 < int(np.sum(np.asarray(ref_norms) > clip)) < len(ref_norms)  # some clipped, some not
    ghost = _everything(loss, "ghost", clip)
    with CompileCounter(ghost) as counter:
        norms, sum_norms, summed, noisy = ghost(params, batch, key)
        ghost(params, jax.tree.map(lambda a: a[::-1], batch), key)
    assert counter.count == 1
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-4)
    np.testing.assert_allclose(sum_norms, ref_norms, rtol=1e-4)
    _close(summed, ref_sum)
    _close(noisy, ref_dp)


@pytest.mark.parametrize("name", [n for n in MODELS if n != "equinox"])
def test_coverage_rows_exact(name):
    loss, params, batch, kinds = MODELS[name][0]()
    rows = ghost_coverage(packed(loss), params, first(batch))
    assert {row.path: row.kind for row in rows} == kinds
    assert all(row.path in str(row) and row.kind in str(row) for row in rows)


def test_equinox_coverage():
    loss, params, batch, _ = equinox_model()
    kinds = [row.kind for row in ghost_coverage(packed(loss), params, first(batch))]
    assert kinds == [
        "embedding",
        *["dense", "elementwise"] * 3,
    ]  # the table, then 3 × (weight, bias)


def tied_rnn():
    """Fallbacks: a table used twice (lookup and tied output layer), a weight inside a scan."""
    ks = jax.random.split(jax.random.key(8), 2)
    params = {
        "table": _normal(ks[0], (6, 4), 1.0),
        "rec": _normal(ks[1], (4, 4)),
        "unused": jnp.ones(3),
    }

    def loss(p, tokens, y):
        e = p["table"][tokens]
        h, _ = jax.lax.scan(lambda h, x: (jnp.tanh(h @ p["rec"] + x), None), jnp.zeros(4), e)
        return xent(h @ p["table"].T, y)

    rng = np.random.default_rng(9)
    batch = (
        jnp.asarray(rng.integers(0, 6, (5, 4)), jnp.int32),
        jnp.asarray(rng.integers(0, 6, 5), jnp.int32),
    )
    return loss, params, batch


def test_fallback_leaves_are_exact():
    loss, params, batch = tied_rnn()
    rows = {row.path: row.kind for row in ghost_coverage(packed(loss), params, first(batch))}
    assert rows == {"table": "fallback", "rec": "fallback", "unused": "unused"}
    ref_norms, _, ref_sum, ref_dp = _everything(loss, "vmap", 1.0)(params, batch, jax.random.key(0))
    norms, _, summed, noisy = _everything(loss, "auto", 1.0)(params, batch, jax.random.key(0))
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-4)
    _close(summed, ref_sum)
    _close(noisy, ref_dp)


def test_bfloat16_compute_matches_vmap():
    loss, params, batch, _ = mlp()
    params16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    batch16 = (batch[0].astype(jnp.bfloat16), batch[1])
    f = jax.jit(
        lambda p, b, m: clip_and_sum(packed(loss), p, b, clip_norm=3.0, method=m),
        static_argnums=2,
    )
    ref_sum32, ref32 = f(params, batch, "vmap")
    ref_sum, ref = f(params16, batch16, "vmap")
    summed, norms = f(params16, batch16, "ghost")
    np.testing.assert_allclose(norms, ref32, rtol=3e-2)  # bf16 rounding vs the float32 program
    np.testing.assert_allclose(
        np.asarray(norms, np.float64), np.asarray(ref, np.float64), rtol=2e-2
    )
    assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree.leaves(summed))
    _close(summed, ref_sum, rtol=3e-2, atol=1e-2)  # ghost and vmap agree in bf16
    _close(summed, ref_sum32, rtol=0.3, atol=0.35)  # both differ from float32 where ReLUs flip


def test_ghost_inside_accumulation():
    loss, params, batch, _ = transformer()
    micro = jax.tree.map(lambda a: a.reshape(2, 5, *a.shape[1:]), batch)
    mask = jnp.ones((2, 5), bool).at[1, 4].set(False)
    run = jax.jit(
        lambda p, m, k, method: dp_gradient_accumulated(
            packed(loss),
            p,
            m,
            k,
            clip_norm=2.5,
            noise_multiplier=0.5,
            expected_batch_size=10.0,
            mask=mask,
            method=method,
        ),
        static_argnums=3,
    )
    ref, ref_norms, _, _ = run(params, micro, jax.random.key(1), "vmap")
    out, norms, _, _ = run(params, micro, jax.random.key(1), "ghost")
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-4)
    _close(out, ref)


def test_auto_falls_back_to_vmap_when_ghost_cannot_apply():
    def loss(w, x):  # independent of the example: nothing to analyse
        del x
        return jnp.sum(w**2)

    w, x = jnp.asarray([3.0, 4.0]), jnp.ones((3, 2))
    np.testing.assert_allclose(per_example_grad_norms(loss, w, x), [10.0, 10.0, 10.0])
    with pytest.raises(ValueError, match="ghost"):
        per_example_grad_norms(loss, w, x, method="ghost")


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: per_example_grad_norms(
                lambda w, x: jnp.sum(w * x),
                jnp.ones(2),
                jnp.ones((3, 2)),
                method="fast",  # pyright: ignore[reportArgumentType]  # bad input on purpose
            ),
            ValueError,
            "method",
        ),
        (
            lambda: per_example_grad_norms(
                lambda w, x: jnp.sum(x), jnp.ones(2, jnp.int32), jnp.ones((3, 2))
            ),
            TypeError,
            "params",
        ),
        (
            lambda: per_example_grad_norms(
                lambda w, x: w * x, jnp.ones(2), jnp.ones((3, 2)), method="ghost"
            ),
            TypeError,
            "scalar",
        ),
        (
            lambda: ghost_coverage(lambda w, x: jnp.sum(w * x), jnp.ones(2), ()),
            ValueError,
            "`example` has no arrays",
        ),
        (
            lambda: ghost_coverage(lambda w, x: jnp.sum(w * x), jnp.ones(2), {"x": "a"}),
            TypeError,
            r"example\['x'\]",
        ),
        (lambda: ghost_coverage("loss", jnp.ones(2), jnp.ones(2)), TypeError, "`loss`"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_jit_and_remat_inside_the_loss_are_seen_through():
    params = {"w": _normal(jax.random.key(11), (3, 4)), "b": jnp.full((4,), 0.1)}
    layer = jax.jit(jax.checkpoint(lambda p, x: jnp.tanh(x @ p["w"] + p["b"])))

    def loss(p, x):
        return jnp.sum(jnp.square(layer(p, x)))

    rows = ghost_coverage(loss, params, jnp.ones(3))
    assert [(r.path, r.kind) for r in rows] == [("b", "elementwise"), ("w", "dense")]
    x = jnp.asarray(np.random.default_rng(12).normal(size=(6, 3)), jnp.float32)
    np.testing.assert_allclose(
        per_example_grad_norms(loss, params, x, method="ghost"),
        per_example_grad_norms(loss, params, x, method="vmap"),
        rtol=1e-4,
    )


@pytest.mark.parametrize(
    "x_shape, k_shape, dn, strides, padding, lhs_dil, rhs_dil",
    [
        ((1, 9, 9, 3), (3, 3, 3, 5), ("NHWC", "HWIO", "NHWC"), (1, 1), "SAME", (1, 1), (1, 1)),
        (
            (2, 3, 9, 8),
            (4, 3, 3, 2),
            ("NCHW", "OIHW", "NCHW"),
            (2, 1),
            ((1, 0), (2, 2)),
            (1, 1),
            (2, 1),
        ),
        ((1, 10, 4), (3, 4, 6), ("NWC", "WIO", "NWC"), (3,), ((1, -1),), (2,), (1,)),
        ((1, 5, 5, 40), (2, 2, 40, 3), ("NHWC", "HWIO", "NHWC"), (1, 1), "VALID", (1, 1), (1, 1)),
    ],
    ids=["same", "nchw-strided-dilated", "1d-lhs-dilated", "gram"],
)
def test_conv_layouts(x_shape, k_shape, dn, strides, padding, lhs_dil, rhs_dil):
    rng = np.random.default_rng(13)
    kernel = jnp.asarray(rng.normal(size=k_shape), jnp.float32)
    x = jnp.asarray(rng.normal(size=(4, *x_shape)), jnp.float32)

    def loss(k, x):
        out = jax.lax.conv_general_dilated(
            x, k, strides, padding, lhs_dilation=lhs_dil, rhs_dilation=rhs_dil, dimension_numbers=dn
        )
        return jnp.sum(jnp.sin(out))

    assert [r.kind for r in ghost_coverage(loss, kernel, x[0])] == ["conv"]
    ref = per_example_grad_norms(loss, kernel, x, method="vmap")
    np.testing.assert_allclose(
        per_example_grad_norms(loss, kernel, x, method="ghost"), ref, rtol=1e-4
    )
    clip = float(np.median(np.asarray(ref)))  # half of the examples clipped
    ref_sum, _ = clip_and_sum(loss, kernel, x, clip_norm=clip, method="vmap")
    for budget in (2**28, 1):  # per-example kernel gradients kept (book-keeping), or not
        summed, norms = clip_and_sum(
            loss, kernel, x, clip_norm=clip, method="ghost", memory_budget=budget
        )
        np.testing.assert_allclose(norms, ref, rtol=1e-4)
        _close(summed, ref_sum, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_book_keeping_plan_keeps_positional_layers_within_the_memory_budget(monkeypatch):
    """Layers with positions keep their per-example gradients (norm and sum from one
    contraction) when the backend's costs say so and they fit the budget; otherwise the Gram
    form; both give the same clipped sum."""
    from jaxwise.per_example import _cost, _ghost_plan
    from jaxwise.per_example._graph import trace

    loss, params, batch, _ = transformer()
    program = trace(packed(loss), params, batch)
    dense = [j for j, u in enumerate(program.uses) if u.kind == "dense"]
    positional = [j for j in dense if _ghost_plan._sizes(program, program.uses[j])[0] > 1]
    assert len(positional) == 6 and len(dense) == 7  # q, k, v, o, w1, w2 have positions; head not
    # arithmetic only (no byte cost): at T = 6 every positional layer's 4·K·N < 2T²(K + N)
    flops_only = _cost.BackendCost("cpu", None, 0.0)

    def kept(budget):
        forms = _ghost_plan.plan_forms(program, 10, budget, flops_only)
        return {j for j, f in forms.items() if f == "kept"}

    assert kept(2**28) == set(positional)
    one_layer = 4 * 10 * 8 * 8  # B·K·N float32 of a q/k/v projection
    assert len(kept(one_layer)) == 1
    assert kept(1) == set()
    # the CPU's table keeps them too (T(K + N) > K·N: a Gram norm re-reads more than it saves)
    cpu = _ghost_plan.plan_forms(program, 10, 2**28, _cost.backend_cost("cpu"))
    assert {cpu[j] for j in positional} == {"kept"}
    ref_sum, ref = clip_and_sum(packed(loss), params, batch, clip_norm=2.5, method="vmap")
    monkeypatch.setitem(_cost.BACKENDS, "cpu", flops_only)
    for budget in (2**28, one_layer, 1):
        summed, norms = jax.jit(
            lambda p, b, budget=budget: clip_and_sum(
                packed(loss), p, b, clip_norm=2.5, method="ghost", memory_budget=budget
            )
        )(params, batch)
        np.testing.assert_allclose(norms, ref, rtol=1e-4)
        _close(summed, ref_sum)
