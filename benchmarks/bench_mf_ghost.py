"""Ghost clipping on the transformer block (B = 32, T = 64) vs a non-private gradient, by part.

The model of ``bench_privacy.py`` (embedding + positions, pre-LN attention with 4 heads,
pre-LN GELU MLP, mean-pooled head; d = 128) and three ablations of it: without the layer
norms (identity), without the attention sub-block, and without both. For each, the jitted
non-private mean gradient vs ``dp_gradient(..., method="ghost", noise_multiplier=0)`` (the
clipped sum alone), vs ghost clipping with no use kept for book-keeping
(``clip_and_sum(..., memory_budget=1)``: Gram norms and a weighted contraction, nothing
``(B, K, N)`` formed) and vs ``method="vmap"``, interleaved medians; and XLA's cost
analysis of the non-private and the ghost programs (FLOPs and bytes accessed,
machine-independent), so the part that costs the ratio shows on a loaded machine too.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from common import QUICK, fmt_time, interleaved_times, main_guard, table, write_section

from jaxwise import numerics
from jaxwise.per_example import clip_and_sum
from jaxwise.privacy import dp_gradient

B, T, D, HEADS, VOCAB = 32, 64, 128, 4, 1000


def transformer(*, layer_norm: bool, attention: bool):
    ks = jax.random.split(jax.random.key(2), 9)
    n = lambda k, s, sc=0.05: sc * jax.random.normal(k, s)  # noqa: E731
    params = {
        "embed": n(ks[0], (VOCAB, D), 1.0),
        "pos": n(ks[1], (T, D), 0.1),
        "mlp": {"w1": n(ks[6], (D, 4 * D)), "b1": jnp.zeros(4 * D), "w2": n(ks[7], (4 * D, D))},
        "head": n(ks[8], (D, 10)),
    }
    if layer_norm:
        params["ln1"] = {"scale": jnp.ones(D), "bias": jnp.zeros(D)}
        params["ln2"] = {"scale": jnp.ones(D), "bias": jnp.zeros(D)}
    if attention:
        params["attn"] = {c: n(k, (D, HEADS, D // HEADS)) for c, k in zip("qkv", ks[2:5])}
        params["attn"]["o"] = n(ks[5], (HEADS, D // HEADS, D))

    def norm(x, p):
        if not layer_norm:
            return x
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]

    def loss(p, example):
        tokens, y = example
        x = p["embed"][tokens] + p["pos"]
        if attention:
            h = norm(x, p.get("ln1"))
            q, k, v = (jnp.einsum("td,dhk->thk", h, p["attn"][c]) for c in "qkv")
            scale = np.float32(1 / np.sqrt(D // HEADS))
            att = jax.nn.softmax(jnp.einsum("thk,shk->hts", q, k) * scale, axis=-1)
            x = x + jnp.einsum("hts,shk,hkd->td", att, v, p["attn"]["o"])
        h = norm(x, p.get("ln2"))
        x = x + jax.nn.gelu(h @ p["mlp"]["w1"] + p["mlp"]["b1"]) @ p["mlp"]["w2"]
        return -numerics.log_softmax(x.mean(0) @ p["head"])[y]

    rng = np.random.default_rng(2)
    batch = (
        jnp.asarray(rng.integers(0, VOCAB, (B, T)), jnp.int32),
        jnp.asarray(rng.integers(0, 10, B), jnp.int32),
    )
    return loss, params, batch


def programs(loss):
    def mean_loss(p, batch):
        return jnp.mean(jax.vmap(loss, in_axes=(None, 0))(p, batch))

    key = jax.random.key(0)
    return {
        "non-private": jax.jit(jax.grad(mean_loss)),
        "ghost": jax.jit(
            lambda p, b: dp_gradient(
                loss, p, b, key, clip_norm=1.0, noise_multiplier=0.0, method="ghost"
            )[0]
        ),
        "ghost, no book-keeping": jax.jit(
            lambda p, b: clip_and_sum(loss, p, b, clip_norm=1.0, method="ghost", memory_budget=1)[0]
        ),
        "vmap": jax.jit(
            lambda p, b: dp_gradient(
                loss, p, b, key, clip_norm=1.0, noise_multiplier=0.0, method="vmap"
            )[0]
        ),
    }


def cost(jitted, *args) -> tuple[float, float]:
    analysis = jitted.lower(*args).compile().cost_analysis()
    if isinstance(analysis, list):
        analysis = analysis[0]
    return float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0))


VARIANTS = {
    "full block": dict(layer_norm=True, attention=True),
    "no layer norm": dict(layer_norm=False, attention=True),
    "no attention": dict(layer_norm=True, attention=False),
    "MLP only (neither)": dict(layer_norm=False, attention=False),
}


def run() -> None:
    load = os.getloadavg()[0]
    rows = []
    for label, flags in VARIANTS.items():
        loss, params, batch = transformer(**flags)
        fns = programs(loss)
        names = list(fns)
        times = interleaved_times(
            [lambda f=fns[n], p=params, b=batch: f(p, b) for n in names], repeat=5 if QUICK else 15
        )
        t = dict(zip(names, times))
        flops = {n: cost(fns[n], params, batch) for n in names}
        base_f, base_b = flops["non-private"]
        rows.append(
            [
                label,
                fmt_time(t["non-private"]),
                fmt_time(t["ghost"]),
                f"**{t['ghost'] / t['non-private']:.2f}×**",
                f"{t['ghost, no book-keeping'] / t['non-private']:.2f}×",
                f"{t['vmap'] / t['non-private']:.2f}×",
                f"{flops['ghost'][0] / base_f:.2f}×",
                f"{flops['ghost'][1] / base_b:.2f}×",
            ]
        )
        print(rows[-1], flush=True)
    body = (
        f"B = {B}, T = {T}, d = {D}, {HEADS} heads; medians of interleaved rounds, load average "
        f"{load:.1f} on 2 cores at the start (wall-clock ratios move with the load; the FLOP "
        "and byte ratios are XLA's cost analysis of the compiled programs and do not).\n\n"
    )
    body += table(
        [
            "model",
            "non-private gradient",
            "ghost clipping (σ = 0)",
            "ghost / non-private (≤ 1.1)",
            "ghost without book-keeping / non-private",
            "vmap per-example / non-private",
            "FLOPs ghost / non-private",
            "bytes ghost / non-private",
        ],
        rows,
    )
    write_section("mf_ghost", "Ghost clipping on the transformer block, by part", body)


if __name__ == "__main__":
    main_guard(run)
