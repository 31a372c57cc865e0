"""The spiral training (150 epochs) vs the same training written with Flax + Optax.

Ours: ``jaxwise.train.make_train_epoch`` — each epoch one compiled
``lax.scan`` program with the state donated. Peer: the idiomatic Flax
(``nn.Dense``) + Optax loop — a Python loop over jitted steps, NumPy
shuffling. Same data, model, optimizer and schedule. Wall time includes
compilation (what a user waits for); target ≤ 1.0×. PyTorch is not
measured: PyPI's torch for this platform is a several-GB CUDA build and the
CPU wheel on this machine is for Python 3.11 only (our venv is 3.12).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from common import QUICK, fmt_time, main_guard, table, write_section
from jaxwise import data
from jaxwise.compilation import CompileCounter
from jaxwise import numerics
from jaxwise.jobs import make_optimizer
from jaxwise.models import init_mlp, mlp_apply
from jaxwise.train import TrainState, make_train_epoch

EPOCHS = 30 if QUICK else 150
BATCH = 128


def spiral():
    x, y = data.make_spiral(600, 3, 0.15, seed=0)
    return data.train_test_split(x, y, test_fraction=0.2, seed=0)


def _cross_entropy_loss(params, batch):
    return numerics.cross_entropy(mlp_apply(params, batch[0]), batch[1])


def run_ours(xtr, ytr, xte, yte):
    steps = EPOCHS * (len(xtr) // BATCH)
    tx, _ = make_optimizer(steps, 1e-2, 1e-4, 100, 1e-4)
    t0 = time.perf_counter()
    with CompileCounter() as counter:
        state = TrainState.create(init_mlp(jax.random.key(0), (2, 64, 64, 3)), tx, jax.random.key(1))
        epoch = make_train_epoch(_cross_entropy_loss, tx, BATCH)
        data_dev = (jnp.asarray(xtr), jnp.asarray(ytr))
        state, metrics = epoch(state, data_dev)
        jax.block_until_ready(state)
        t1 = time.perf_counter()
        for _ in range(EPOCHS - 1):
            state, metrics = epoch(state, data_dev)
        jax.block_until_ready(state)
    seconds = time.perf_counter() - t0
    steady = (time.perf_counter() - t1) / (EPOCHS - 1)
    params = state.params
    logits = jnp.maximum(jnp.maximum(jnp.asarray(xte) @ params["dense_0"]["w"] + params["dense_0"]["b"], 0)
                         @ params["dense_1"]["w"] + params["dense_1"]["b"], 0) @ params["dense_2"]["w"] \
        + params["dense_2"]["b"]
    return seconds, steady, counter.count, counter.seconds, float((np.asarray(logits).argmax(1) == yte).mean())


def run_flax(xtr, ytr, xte, yte):
    import flax.linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Dense(64, kernel_init=nn.initializers.he_normal())(x))
            x = nn.relu(nn.Dense(64, kernel_init=nn.initializers.he_normal())(x))
            return nn.Dense(3, kernel_init=nn.initializers.he_normal())(x)

    steps = EPOCHS * (len(xtr) // BATCH)
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 100, steps, 1e-4)
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.scale_by_adam(),
        optax.add_decayed_weights(1e-4, mask=lambda p: jax.tree_util.tree_map_with_path(
            lambda path, _: path[-1].key == "kernel", p)),
        optax.scale_by_learning_rate(schedule),
    )
    model = MLP()
    t0 = time.perf_counter()
    with CompileCounter() as counter:
        params = model.init(jax.random.key(0), jnp.ones((1, 2)))
        opt_state = tx.init(params)

        @jax.jit
        def step(params, opt_state, x, y):
            def loss_fn(p):
                logits = model.apply(p, x)
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        rng = np.random.default_rng(0)
        for epoch in range(EPOCHS):
            if epoch == 1:
                jax.block_until_ready(params)
                t1 = time.perf_counter()
            order = rng.permutation(len(xtr))
            for i in range(len(xtr) // BATCH):
                idx = order[i * BATCH:(i + 1) * BATCH]
                params, opt_state, loss = step(params, opt_state, xtr[idx], ytr[idx])
        jax.block_until_ready(params)
    seconds = time.perf_counter() - t0
    steady = (time.perf_counter() - t1) / (EPOCHS - 1)
    accuracy = float((np.asarray(model.apply(params, jnp.asarray(xte))).argmax(1) == yte).mean())
    return seconds, steady, counter.count, counter.seconds, accuracy


def run() -> None:
    xtr, xte, ytr, yte = spiral()
    results = {}
    for name, fn in (("jaxwise (scanned epochs, donated state)", run_ours), ("Flax + Optax (Python loop)", run_flax)):
        with jax.numpy_dtype_promotion("standard"):
            runs = [fn(xtr, ytr, xte, yte) for _ in range(3)]
        results[name] = [float(np.median([r[i] for r in runs])) for i in range(5)]
    base_total, base_epoch = results["Flax + Optax (Python loop)"][:2]
    rows = [[name, fmt_time(total), f"**{total / base_total:.2f}**", fmt_time(epoch), f"**{epoch / base_epoch:.2f}**",
             int(compiles), fmt_time(compile_s), f"{acc:.3f}"]
            for name, (total, epoch, compiles, compile_s, acc) in results.items()]
    body = (table([f"spiral, {EPOCHS} epochs × {len(xtr) // BATCH} steps", "wall time (incl. compile)", "ratio",
                   "per epoch after compile", "ratio", "compilations", "compile time", "test accuracy"], rows)
            + "\n\nMedian of 3 runs in one process, each from scratch (first-run compile times included "
              "for both; later runs hit JAX's in-memory caches equally). Compilations count every XLA "
              "program the run built, including small eager ones (parameter initialisation, data transfer "
              "helpers). PyTorch: not measured — no CPU-only build installs for Python 3.12 here without "
              "downloading the multi-GB CUDA wheel.")
    write_section("spiral", "The main job vs Flax + Optax", body)


if __name__ == "__main__":
    main_guard(run)
