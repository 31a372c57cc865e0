"""Mixed precision on a Flax NNX CNN with BatchNorm: bf16 vs f32 steps, ours and plain Flax.

Ours: ``make_step(mixed_precision(value_and_grad(loss, model_state=True), compute_dtype=...))``
``jaxwise.models.from_nnx`` (parameters and inputs cast; BatchNorm statistics kept float32,
checked after the run). Peer: the same CNN in plain Flax NNX + Optax, mixed precision the Flax
way (``dtype=jnp.bfloat16, param_dtype=jnp.float32`` on every layer), one ``jax.jit`` step.
A ratio bf16 / f32 above 1 on both sides is the CPU's, not ours: the table ends with the
convolution alone, bf16 vs f32, in plain ``jax.lax``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from common import QUICK, fmt_time, interleaved_times, main_guard, table, write_section
from flax import nnx

import jaxwise.train
from jaxwise import numerics, optim
from jaxwise.models import from_nnx
from jaxwise.train import TrainState

BATCH = 32 if QUICK else 64


class CNN(nnx.Module):
    def __init__(self, rngs, dtype=None):
        kw = {"dtype": dtype, "param_dtype": jnp.float32}
        self.conv1 = nnx.Conv(1, 16, (3, 3), rngs=rngs, **kw)
        self.bn1 = nnx.BatchNorm(16, rngs=rngs, **kw)
        self.conv2 = nnx.Conv(16, 32, (3, 3), strides=(2, 2), rngs=rngs, **kw)
        self.bn2 = nnx.BatchNorm(32, rngs=rngs, **kw)
        self.out = nnx.Linear(14 * 14 * 32, 10, rngs=rngs, **kw)

    def __call__(self, x):
        x = nnx.relu(self.bn1(self.conv1(x)))
        x = nnx.relu(self.bn2(self.conv2(x)))
        return self.out(x.reshape(x.shape[0], -1))


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, 28, 28, 1)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(rng.integers(0, 10, BATCH), jnp.int32)


def ours(compute_dtype):
    model = from_nnx(CNN(nnx.Rngs(0)))

    def loss(params, model_state, batch):
        logits, new_state = model.apply(params, model_state, batch[0])
        return numerics.cross_entropy(logits.astype(jnp.float32), batch[1]), new_state

    tx = optim.adam(1e-3)
    gradient = jaxwise.train.value_and_grad(loss, model_state=True)
    if compute_dtype is not None:
        gradient = jaxwise.train.mixed_precision(gradient, compute_dtype=compute_dtype)
    step = jaxwise.train.make_step(gradient)
    box = [TrainState.create(model.params, tx, 0, model_state=model.model_state)]

    def run(batch):
        box[0], metrics = step(box[0], batch)
        return metrics["loss"]

    return run, lambda: box[0].model_state


def flax_peer(dtype):
    graphdef, params, rest = nnx.split(CNN(nnx.Rngs(0), dtype=dtype), nnx.Param, ...)
    tx = optax.adam(1e-3)

    @jax.jit
    def step(params, rest, opt_state, batch):
        def loss(p):
            model = nnx.merge(graphdef, p, rest, copy=True)
            logits = model(batch[0])
            value = optax.softmax_cross_entropy_with_integer_labels(
                logits.astype(jnp.float32), batch[1]
            ).mean()
            return value, nnx.split(model, nnx.Param, ...)[2]

        (value, new_rest), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_rest, opt_state, value

    box = [params, rest, tx.init(params)]

    def run(batch):
        box[0], box[1], box[2], value = step(*box, batch)
        return value

    return run, lambda: box[1]


def stat_dtypes(state):
    return {str(leaf.dtype) for leaf in jax.tree.leaves(state)}


def run() -> None:
    batch = data()
    with jax.numpy_dtype_promotion("standard"):
        sides = {
            ("jaxwise", "float32"): ours(None),
            ("jaxwise", "bfloat16"): ours(jnp.bfloat16),
            ("Flax NNX + Optax", "float32"): flax_peer(None),
            ("Flax NNX + Optax", "bfloat16"): flax_peer(jnp.bfloat16),
        }
        names = list(sides)
        times = interleaved_times(
            [lambda run=sides[n][0]: run(batch) for n in names], repeat=15, number=3
        )
    t = dict(zip(names, times, strict=True))
    rows = []
    for who in ("jaxwise", "Flax NNX + Optax"):
        for dtype in ("float32", "bfloat16"):
            name = (who, dtype)
            rows.append(
                [
                    f"{who}, {dtype} compute",
                    fmt_time(t[name]),
                    f"**{t[name] / t[(who, 'float32')]:.2f}**",
                    f"{t[name] / t[('Flax NNX + Optax', dtype)]:.2f}",
                    ", ".join(sorted(stat_dtypes(sides[name][1]()))),
                ]
            )
    header = [
        f"Adam step, NNX CNN with BatchNorm, batch {BATCH} (ratios from one interleaved run)",
        "time",
        "vs float32 (same side)",
        "vs Flax (same dtype)",
        "BatchNorm statistics",
    ]
    conv_rows = conv_table()
    notes = (
        "Ours casts the parameters and the inputs to bfloat16 inside the differentiated "
        "function and keeps the BatchNorm statistics in float32 (they accumulate there, as "
        "with Flax's `param_dtype`); the peer builds every layer with `dtype=jnp.bfloat16`. "
        "XLA's CPU backend computes a bfloat16 convolution or matrix product in float32: the "
        "compiled program rounds the operands to bfloat16, converts them back to float32, "
        "computes in float32 and rounds the result, so on this CPU bfloat16 only adds work "
        "(last table: the convolution alone). Our bf16 / f32 ratio is about the "
        "convolution's; Flax's is higher because its layers after each BatchNorm run in "
        "bfloat16 too (more conversions) where ours promote to the float32 statistics. "
        "The 'vs Flax' column is our overhead at equal settings."
    )
    body = table(header, rows) + "\n\n" + conv_rows + "\n\n" + notes
    write_section("precision", "Mixed precision: bf16 vs f32 on an NNX CNN with BatchNorm", body)


def conv_table() -> str:
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(BATCH, 28, 28, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, 3, 16, 32)), jnp.float32)

    def conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    f32 = jax.jit(conv)
    bf16 = jax.jit(lambda x, w: conv(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)))
    t32, t16 = interleaved_times([lambda: f32(x, w), lambda: bf16(x, w)], repeat=15, number=5)
    return table(
        [f"one 3×3 convolution, {BATCH}×28×28×16 → 32 channels (plain `jax.lax`)", "time", "ratio"],
        [["float32", fmt_time(t32), "1.00"], ["bfloat16", fmt_time(t16), f"**{t16 / t32:.2f}**"]],
    )


if __name__ == "__main__":
    main_guard(run)
