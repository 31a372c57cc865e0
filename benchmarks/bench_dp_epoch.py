"""DP-SGD epochs: Poisson sampling at the cost of its expected batch, vs shuffle and non-private.

For each model of ``bench_privacy.py`` (MLP B = 256 and 1,024, CNN B = 64, transformer
block B = 32 T = 64, NNX CNN with GroupNorm B = 64), one jitted epoch of 8 steps over
``8 B`` examples, in one run:

- the non-private epoch (``make_train_epoch``, shuffled batches, the batch-mean loss);
- the DP epoch with shuffled fixed-size batches (``make_dp_train_epoch(sampler="shuffle")``);
- the DP epoch with Poisson sampling (the default): each step runs at the smallest of 5
  padded widths that holds its examples (``PoissonSampler.widths``), target ≤ 1.15× the
  shuffle DP epoch and ≤ 1.25× the non-private epoch;
- the same with one width (``buckets=1``: every step padded to the largest width,
  B + 12√B + 1 rows), for context;
- the non-private gradient steps as 8 separately jitted calls (a Python loop): XLA:CPU
  canonicalizes convolutions for Eigen only outside loops, so a convolution's kernel
  gradient inside the epoch's ``lax.scan`` ran ~40× slower than in a jitted step until the
  epoch rewrote its convolutions in canonical form (``jaxwise.train._convolution``, issue
  #29); the faster of the two non-private baselines is the reference of the target.

Every epoch uses SGD and ghost clipping (``method="auto"``). Timings are medians of rounds
that interleave the four epochs (the machine is shared); each call feeds the state back.
``JAXWISE_BENCH_MODEL=NNX`` runs only the models whose title contains ``NNX`` and prints
their rows without rewriting the results table (a quick check of one model).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from bench_privacy import CLIP, MODELS, SIGMA
from common import QUICK, fmt_time, interleaved_times, main_guard, table, write_section

from jaxwise import optim
from jaxwise.compilation import CompileCounter
from jaxwise.privacy import PoissonSampler, dp_gradient_fn, make_dp_train_epoch
from jaxwise.train import ShuffleSampler, TrainState, make_epoch, make_train_epoch

STEPS = 8
LOOP = "non-private, 8 jitted steps (Python loop)"


def epochs(loss, batch_size):
    def example_loss(p, example):
        return loss(p, *example)

    def mean_loss(p, batch):
        return jnp.mean(jax.vmap(loss, in_axes=(None, 0, 0))(p, *batch))

    tx = optim.sgd(1e-3)
    dp = dict(clip_norm=CLIP, noise_multiplier=SIGMA)
    return tx, {
        "non-private epoch": make_train_epoch(mean_loss, batch_size),
        "DP epoch, shuffle": make_epoch(
            dp_gradient_fn(example_loss, **dp), ShuffleSampler(batch_size)
        ),
        "DP epoch, Poisson": make_dp_train_epoch(example_loss, batch_size, **dp),
        "DP epoch, Poisson, one width": make_epoch(
            dp_gradient_fn(example_loss, **dp), PoissonSampler(batch_size, buckets=1)
        ),
    }


def model_rows(title, loss, params, batch):
    b = int(batch[0].shape[0])
    rng = np.random.default_rng(5)
    data = tuple(  # 8 B examples: the model's batch, tiled, in a random order
        jnp.asarray(np.asarray(a)[rng.integers(0, b, STEPS * b)]) for a in batch
    )
    tx, fns = epochs(loss, b)
    states = {name: TrainState.create(params, tx, jax.random.key(1)) for name in fns}
    compiles = {}
    step = jax.jit(
        lambda p, x, y: jax.grad(lambda q: jnp.mean(jax.vmap(loss, in_axes=(None, 0, 0))(q, x, y)))(
            p
        )
    )
    slices = [tuple(a[i * b : (i + 1) * b] for a in data) for i in range(STEPS)]

    def call(name):
        if name == LOOP:
            for x, y in slices:
                out = step(params, x, y)
            return out, {}
        states[name], metrics = fns[name](states[name], data)
        return states[name].params, metrics

    fns[LOOP] = step

    with jax.numpy_dtype_promotion("standard"):
        for name in fns:  # compile, then count the compiles of a second call (none)
            call(name)
            with CompileCounter() as counter:
                jax.block_until_ready(call(name))
            compiles[name] = counter.count if name != LOOP else "–"
        names = list(fns)
        times = dict(
            zip(
                names,
                interleaved_times([lambda n=n: call(n) for n in names], repeat=3 if QUICK else 7),
            )
        )
        widths = fns["DP epoch, Poisson"].sampler.widths(len(data[1]))
        _, metrics = call("DP epoch, Poisson")
    base, shuffle, poisson, single, loop = (times[n] for n in names)
    best = min(base, loop)
    rows = [
        [title, name, fmt_time(t), f"{t / base:.2f}×", str(compiles[name])]
        for name, t in times.items()
    ]
    used = np.asarray(metrics["width"])
    summary = [
        title,
        f"**{poisson / shuffle:.2f}×**",
        f"**{poisson / best:.2f}×**",
        f"{poisson / base:.2f}×",
        f"{single / shuffle:.2f}×",
        f"{widths} (mean {used.mean():.1f} rows for B = {b})",
    ]
    return rows, summary


def run() -> None:
    detail, summary = [], []
    only = os.environ.get("JAXWISE_BENCH_MODEL")
    for title, make in MODELS.items():
        if only and only not in title:
            continue
        loss, params, batch = make()
        rows, s = model_rows(title, loss, params, batch)
        detail += rows
        summary.append(s)
        print(s, flush=True)
    if only:  # one model: print its rows, keep the table of the full run
        print(table(["model", "epoch", "time", "vs non-private", "compiles"], detail))
        return
    body = (
        "Medians of interleaved rounds (the four epochs in turn) on a shared machine; one "
        f"epoch = {STEPS} steps over {STEPS} B examples, SGD, ghost clipping, σ = {SIGMA}.\n\n"
    )
    body += table(
        [
            "model",
            "Poisson DP epoch / shuffle DP epoch (≤ 1.15)",
            "Poisson DP epoch / faster non-private baseline (≤ 1.25)",
            "Poisson DP epoch / non-private epoch (scan)",
            "one padded width (before) / shuffle DP epoch",
            "padded widths",
        ],
        summary,
    )
    columns = ["model", "epoch", "time", "vs non-private", "compiles after warm-up"]
    body += "\n\n" + table(columns, detail)
    body += (
        "\n\nA Poisson step samples X ~ Binomial(N, q) examples. Padded to one width "
        "(B + 12√B + 1, so that truncation has probability below 1e-20) every step costs "
        "1.4–4.1 expected batches; with the ladder of 5 widths (`plan_buckets` on the "
        "binomial distribution of X, one `lax.switch` branch each, inside the one epoch "
        "program) a step costs the gap to the next width: about 1.02–1.09 expected batches. "
        "The DP epochs also draw the noise (one normal per parameter per step): see the "
        "noise column of the step table."
    )
    write_section(
        "dp_epoch", "DP-SGD epochs: Poisson sampling vs shuffle and non-private epochs", body
    )


if __name__ == "__main__":
    main_guard(run)
