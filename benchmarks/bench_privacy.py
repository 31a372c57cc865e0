"""DP-SGD step cost vs a non-private step: ghost clipping on five models, and jax-privacy.

For each model (MLP 784-512-512-10 at B = 256 and 1,024; a CNN at B = 64; a transformer
block at B = 32, T = 64; a Flax NNX CNN with GroupNorm at B = 64), in one run:

- the non-private mean gradient (``jax.grad`` of the batch-mean loss);
- ghost clipping alone (``dp_gradient`` with σ = 0: norms + clipped sum), target ≤ 1.1×;
- the noise alone (``add_dp_noise`` on a gradient), and the full ghost DP step, target
  ≤ 1.05 × (clipping + noise);
- jax-privacy 2.0.0's ``clipped_grad`` (micro-batches of 32): the peer of ghost clipping,
  target ≥ 2× slower than ours; and with the same noise, the peer of the DP step.

The machine is shared, so every timing is a median of rounds that interleave the programs
(ours, peer, ours, peer, …): our four programs round-robin (21 rounds), the slow peer in a
second round-robin with ghost clipping (7 rounds) and scaled by it. Temporary memory is
XLA's ``memory_analysis().temp_size_in_bytes`` of each compiled step.
"""

import jax
import jax.numpy as jnp
import numpy as np
from common import QUICK, fmt_time, interleaved_times, main_guard, table, write_section

from jaxwise import numerics
from jaxwise.models import from_nnx, init_mlp, mlp_apply
from jaxwise.per_example import ghost_coverage
from jaxwise.privacy import add_dp_noise, dp_gradient

SIGMA, CLIP = 1.1, 1.0
OURS = ("non-private gradient", "ghost clipping (σ = 0)", "noise only", "ghost DP step")


def xent(logits, y):
    return -numerics.log_softmax(logits)[y]


def mlp_model(b):
    params = init_mlp(jax.random.key(0), (784, 512, 512, 10))
    rng = np.random.default_rng(0)
    batch = (
        jnp.asarray(rng.normal(size=(b, 784)), jnp.float32),
        jnp.asarray(rng.integers(0, 10, b), jnp.int32),
    )

    def loss(p, x, y):
        return xent(mlp_apply(p, x), y)

    return loss, params, batch


def cnn_model(b):
    ks = jax.random.split(jax.random.key(1), 3)
    params = {
        "c1": {"k": 0.3 * jax.random.normal(ks[0], (3, 3, 1, 32)), "b": jnp.zeros(32)},
        "c2": {"k": 0.05 * jax.random.normal(ks[1], (3, 3, 32, 64)), "b": jnp.zeros(64)},
        "head": {"w": 0.01 * jax.random.normal(ks[2], (7 * 7 * 64, 10)), "b": jnp.zeros(10)},
    }
    dn = ("NHWC", "HWIO", "NHWC")

    def loss(p, x, y):
        h = jax.lax.conv_general_dilated(
            x[None], p["c1"]["k"], (1, 1), "SAME", dimension_numbers=dn
        )
        h = jax.nn.relu(h + p["c1"]["b"])
        h = jax.lax.conv_general_dilated(h, p["c2"]["k"], (2, 2), "SAME", dimension_numbers=dn)
        h = jax.nn.relu(h + p["c2"]["b"])
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return xent(h.reshape(-1) @ p["head"]["w"] + p["head"]["b"], y)

    rng = np.random.default_rng(1)
    batch = (
        jnp.asarray(rng.normal(size=(b, 28, 28, 1)), jnp.float32),
        jnp.asarray(rng.integers(0, 10, b), jnp.int32),
    )
    return loss, params, batch


def transformer_model(b, t=64, d=128, heads=4, vocab=1000):
    ks = jax.random.split(jax.random.key(2), 9)
    n = lambda k, s, sc=0.05: sc * jax.random.normal(k, s)  # noqa: E731
    params = {
        "embed": n(ks[0], (vocab, d), 1.0),
        "pos": n(ks[1], (t, d), 0.1),
        "ln1": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
        "attn": {c: n(k, (d, heads, d // heads)) for c, k in zip("qkv", ks[2:5])}
        | {"o": n(ks[5], (heads, d // heads, d))},
        "ln2": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
        "mlp": {"w1": n(ks[6], (d, 4 * d)), "b1": jnp.zeros(4 * d), "w2": n(ks[7], (4 * d, d))},
        "head": n(ks[8], (d, 10)),
    }

    def layer_norm(x, p):
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]

    def loss(p, tokens, y):
        x = p["embed"][tokens] + p["pos"]
        h = layer_norm(x, p["ln1"])
        q, k, v = (jnp.einsum("td,dhk->thk", h, p["attn"][c]) for c in "qkv")
        scale = np.float32(1 / np.sqrt(d // heads))
        att = jax.nn.softmax(jnp.einsum("thk,shk->hts", q, k) * scale, axis=-1)
        x = x + jnp.einsum("hts,shk,hkd->td", att, v, p["attn"]["o"])
        h = layer_norm(x, p["ln2"])
        x = x + jax.nn.gelu(h @ p["mlp"]["w1"] + p["mlp"]["b1"]) @ p["mlp"]["w2"]
        return xent(x.mean(0) @ p["head"], y)

    rng = np.random.default_rng(2)
    batch = (
        jnp.asarray(rng.integers(0, vocab, (b, t)), jnp.int32),
        jnp.asarray(rng.integers(0, 10, b), jnp.int32),
    )
    return loss, params, batch


def nnx_cnn_model(b):
    """A Flax NNX CNN with GroupNorm (the BatchNorm replacement under DP) through `from_nnx`."""
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.c1 = nnx.Conv(1, 32, (3, 3), rngs=rngs)
            self.n1 = nnx.GroupNorm(32, num_groups=8, rngs=rngs)
            self.c2 = nnx.Conv(32, 64, (3, 3), strides=(2, 2), rngs=rngs)
            self.n2 = nnx.GroupNorm(64, num_groups=8, rngs=rngs)
            self.head = nnx.Linear(7 * 7 * 64, 10, rngs=rngs)

        def __call__(self, x):
            h = nnx.relu(self.n1(self.c1(x)))
            h = nnx.relu(self.n2(self.c2(h)))
            h = nnx.max_pool(h, (2, 2), strides=(2, 2))
            return self.head(h.reshape(h.shape[0], -1))

    with jax.numpy_dtype_promotion("standard"):
        model = from_nnx(Net(nnx.Rngs(0)))

    def loss(p, x, y):
        logits, _ = model.apply(p, None, x[None])
        return xent(logits[0], y)

    rng = np.random.default_rng(4)
    batch = (
        jnp.asarray(rng.normal(size=(b, 28, 28, 1)), jnp.float32),
        jnp.asarray(rng.integers(0, 10, b), jnp.int32),
    )
    return loss, model.params, batch


MODELS = {
    "MLP 784-512-512-10, B = 256": lambda: mlp_model(256),
    "MLP 784-512-512-10, B = 1024": lambda: mlp_model(1024),
    "CNN 2 conv + dense, B = 64": lambda: cnn_model(64),
    "transformer block, B = 32, T = 64": lambda: transformer_model(32),
    "NNX CNN + GroupNorm, B = 64": lambda: nnx_cnn_model(64),
}


def temp_mib(jitted, *args):
    return jitted.lower(*args).compile().memory_analysis().temp_size_in_bytes / 2**20


def packed(loss):
    """The models' ``loss(p, x, y)`` (jax-privacy's form) as jaxwise's ``loss(p, (x, y))``."""
    return lambda p, example: loss(p, *example)


def steps(loss):
    from jax_privacy.clipping import clipped_grad

    ours = packed(loss)

    def mean_loss(p, *batch):
        return jnp.mean(jax.vmap(loss, in_axes=(None, 0, 0))(p, *batch))

    peer_clip = clipped_grad(
        loss, l2_clip_norm=CLIP, batch_argnums=(1, 2), keep_batch_dim=False, microbatch_size=32
    )
    fns = {
        "non-private gradient": lambda p, b, k: jax.grad(mean_loss)(p, *b),
        "ghost clipping (σ = 0)": lambda p, b, k: dp_gradient(
            ours, p, b, k, clip_norm=CLIP, noise_multiplier=0.0, method="ghost"
        )[0],
        "noise only": lambda p, b, k: add_dp_noise(p, k, CLIP, SIGMA, b[0].shape[0]),
        "ghost DP step": lambda p, b, k: dp_gradient(
            ours, p, b, k, clip_norm=CLIP, noise_multiplier=SIGMA, method="ghost"
        )[0],
        "jax-privacy clipped_grad (micro 32)": lambda p, b, k: peer_clip(p, *b),
    }
    with jax.numpy_dtype_promotion("standard"):  # Flax layers promote implicitly
        return {name: jax.jit(f) for name, f in fns.items()}


def model_rows(title, loss, params, batch):
    key = jax.random.key(3)
    fns = steps(loss)
    args = (params, batch, key)
    with jax.numpy_dtype_promotion("standard"):
        ours = [n for n in fns if n in OURS]  # fast: many interleaved rounds
        times = dict(
            zip(
                ours,
                interleaved_times(
                    [lambda n=n: fns[n](*args) for n in ours], repeat=9 if QUICK else 21
                ),
            )
        )
        peer = "jax-privacy clipped_grad (micro 32)"
        slow = interleaved_times(  # ours, peer, ours, peer, ...
            [lambda: fns["ghost clipping (σ = 0)"](*args), lambda: fns[peer](*args)],
            repeat=3 if QUICK else 7,
        )
        times[peer] = slow[1] * times["ghost clipping (σ = 0)"] / slow[0]
        times[peer + " + noise"] = times[peer] + times["noise only"]
        mem = {name: temp_mib(f, *args) for name, f in fns.items()}
    mem[peer + " + noise"] = mem[peer]
    base, clip, noise, dp = (
        times[n]
        for n in ("non-private gradient", "ghost clipping (σ = 0)", "noise only", "ghost DP step")
    )
    rows = [
        [title, name, fmt_time(t), f"{t / base:.2f}×", f"{mem[name]:.1f}"]
        for name, t in times.items()
    ]
    base_mem = max(mem["non-private gradient"], 1e-9)
    summary = [
        title,
        f"**{clip / base:.2f}×**",
        f"**{times[peer] / clip:.1f}×**",
        f"{dp / (clip + noise):.2f}×",
        f"{noise / base:.2f}×",
        f"{mem['ghost clipping (σ = 0)'] / base_mem:.2f}×",
    ]
    return rows, summary


def run() -> None:
    detail, summary = [], []
    for title, make in MODELS.items():
        loss, params, batch = make()
        rows, s = model_rows(title, loss, params, batch)
        detail += rows
        summary.append(s)
        print(s, flush=True)
    loss, params, batch = transformer_model(1)
    first = tuple(a[0] for a in batch)
    coverage = "\n".join(str(r) for r in ghost_coverage(packed(loss), params, first))
    body = "Medians of interleaved rounds (ours, peer, ours, peer, …) on a shared machine.\n\n"
    body += table(
        [
            "model",
            "ghost clipping / non-private gradient (≤ 1.1)",
            "jax-privacy clipped_grad / ghost clipping (≥ 2)",
            "DP step / (clipping + noise) (≤ 1.05)",
            "noise / non-private gradient",
            "temp memory: clipping / non-private",
        ],
        summary,
    )
    body += "\n\n" + table(["model", "step", "time", "vs non-private", "temp MiB"], detail)
    body += (
        "\n\nGhost clipping traces the per-example loss once, finds how each parameter is used "
        "(`ghost_coverage`), and computes every example's gradient norm from the activations and "
        "output gradients of one forward and one backward pass. Layers with positions (a "
        "sequence, a convolution's output) form their per-example weight gradients once, as one "
        "batched contraction, and take both the norm and the clipped sum from them "
        "(book-keeping): no Gram norm and no second weight-gradient contraction. Transformer "
        "block coverage:\n\n```text\n" + coverage + "\n```\n\n"
        "The noise is one `jax.random.normal` over all parameters (JAX's threefry generator: "
        "its random bits are most of the time). For the MLP, whose 670k parameters need as many "
        "normal draws per step as a 256-example gradient needs multiply-adds per parameter, "
        "the noise is a large share of the DP step at B = 256."
    )
    write_section("privacy", "DP-SGD: ghost clipping vs non-private and jax-privacy", body)


if __name__ == "__main__":
    main_guard(run)
