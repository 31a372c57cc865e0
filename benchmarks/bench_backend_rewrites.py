"""The CPU-only rewrites and the donation audit, measured on the current backend.

`jaxwise._shared._backends.REWRITES` says on which backends each rewrite is on; this benchmark is
what it is decided from. Run it on every backend (``benchmarks/results/<backend>/``):

- The scanned CNN epoch (2 conv + dense, batch 64, 8 steps, SGD) as `make_train_epoch` with
  the convolution rewrite forced on (`assume_backend("cpu")` at trace time) and forced off
  (`assume_backend("tpu")`), vs a bare ``jax.jit(lax.scan)`` of the same SGD step and a
  Python loop of jitted steps. On XLA:CPU the rewrite is what makes the scan fast; elsewhere
  it only adds transposes.
- A random draw of 67,331 normals at its own length vs padded to a multiple of 8 (36 draws
  per program, as a DP step's noise): XLA:CPU generates odd lengths slowly.
- Where the epoch's time over the bare scan goes: a ladder of hand-written scans from the bare
  one up to everything `make_train_epoch` adds (the in-program shuffle and gather, the
  NaN guard's norm and selects, the step counter, the update check, the key, the optimizer
  as a gradient transformation), then `make_epoch` with and without the
  audit; each rung's ratio to the bare scan (issue #47: find the gap before changing anything).
- The donation audit: a train step and a spiral epoch with ``audit=True`` (the default) vs
  ``audit=False``, and the audit's own per-call cost on a 21- and a 201-leaf state
  (``Audit.before`` + ``after``, the call excluded), and that cost taken apart (the state's
  leaves, a device query, ``is_deleted`` of every leaf right after the dispatch and once the
  outputs are ready, the outputs' buffer pointers).
"""

from __future__ import annotations

import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import QUICK, fmt_time, interleaved_times, main_guard, table, write_section

import jaxwise.train
from jaxwise import data, models, numerics, optim
from jaxwise._shared._backends import REWRITES, assume_backend
from jaxwise._shared._shuffle import shuffle_hash
from jaxwise.train import TrainState, make_train_epoch, make_train_step
from jaxwise.train._program._donation import Audit

DN = ("NHWC", "HWIO", "NHWC")
REPEAT = 3 if QUICK else 15


def cnn_loss(params, batch):
    x, y = batch
    h = jax.lax.conv_general_dilated(x, params["c1"], (1, 1), "SAME", dimension_numbers=DN)
    h = jax.nn.relu(h + params["b1"])
    h = jax.lax.conv_general_dilated(h, params["c2"], (2, 2), "SAME", dimension_numbers=DN)
    h = jax.nn.relu(h + params["b2"])
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return numerics.cross_entropy(h.reshape(x.shape[0], -1) @ params["w"], y)


def _cnn_setup():
    batch, steps, size, c1, c2 = (16, 4, 16, 8, 16) if QUICK else (64, 8, 28, 32, 64)
    ks = jax.random.split(jax.random.key(1), 3)
    params = {
        "c1": 0.3 * jax.random.normal(ks[0], (3, 3, 1, c1)),
        "b1": jnp.zeros(c1),
        "c2": 0.05 * jax.random.normal(ks[1], (3, 3, c1, c2)),
        "b2": jnp.zeros(c2),
        "w": 0.01 * jax.random.normal(ks[2], ((size // 4) ** 2 * c2, 10)),
    }
    rng = np.random.default_rng(1)
    n = batch * steps
    x = jnp.asarray(rng.normal(size=(n, size, size, 1)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, n), jnp.int32)
    return (batch, steps, size, c1, c2), params, (x, y)


def cnn_epoch() -> str:
    # quick (CPU smoke run): a smaller CNN; the rewrite-off scan runs naive loop nests on CPU
    (batch, steps, size, c1, c2), params, (x, y) = _cnn_setup()
    n = batch * steps
    tx = optim.sgd(0.01)
    runners = []
    for assumed in ("cpu", "tpu"):  # rewrite on, rewrite off: decided when traced
        epoch = make_train_epoch(cnn_loss, batch)
        box = {"s": TrainState.create(params, tx, 0)}
        with assume_backend(assumed):
            box["s"], _ = epoch(box["s"], (x, y))  # traced and compiled here

        def scanned(epoch=epoch, box=box):
            box["s"], metrics = epoch(box["s"], (x, y))
            return metrics["loss"]

        runners.append(scanned)

    def sgd_step(p, b):
        loss, grads = jax.value_and_grad(cnn_loss)(p, b)
        return jax.tree.map(lambda a, g: a - 0.01 * g, p, grads), loss

    bare = jax.jit(lambda p, xs: jax.lax.scan(sgd_step, p, xs), donate_argnums=0)
    stacked = (x.reshape(steps, batch, size, size, 1), y.reshape(steps, batch))
    box_bare = {"p": jax.tree.map(jnp.copy, params)}

    def bare_scan():
        box_bare["p"], losses = bare(box_bare["p"], stacked)
        return losses

    step = make_train_step(cnn_loss)
    box_loop = {"s": TrainState.create(params, tx, 0)}
    batches = [(x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]) for i in range(8)]
    batches = batches[:steps]

    def python_loop():
        for b in batches:
            box_loop["s"], _ = step(box_loop["s"], b)
        return box_loop["s"].params

    on, off, t_bare, t_loop = interleaved_times(
        [*runners, bare_scan, python_loop], repeat=REPEAT, number=1
    )
    now = "on" if jax.default_backend() in REWRITES["canonical_convolutions"] else "off"
    rows = [
        ["`make_train_epoch`, rewrite **on**", fmt_time(on), f"**{on / t_bare:.2f}**"],
        ["`make_train_epoch`, rewrite **off**", fmt_time(off), f"**{off / t_bare:.2f}**"],
        ["bare `jax.jit(lax.scan)` of the same SGD step", fmt_time(t_bare), "1.00"],
        [f"Python loop of {steps} jitted steps", fmt_time(t_loop), f"{t_loop / t_bare:.2f}"],
    ]
    return (
        table(
            [
                f"CNN epoch (2 conv {c1}/{c2} ch + dense, {n} examples {size}x{size}, "
                f"batch {batch})",
                "time per epoch",
                "vs bare scan",
            ],
            rows,
        )
        + "\n\nOn this backend the table (`jaxwise._shared._backends.REWRITES`) has the rewrite "
        f"**{now}**; rewrite on / off = **{on / off:.2f}**."
    )


def _ladder_rung(level: int, params, data, batch: int, steps: int):
    """A hand-written epoch, one rung of `epoch_ladder`: 0 the bare scan of pre-cut batches;
    1 + the shuffle and an in-bounds gather in the program; 2 the gather as jaxwise's
    (``mode="fill"``); 3 + the gradient's global norm and the NaN guard's ``jnp.where``
    selects; 4 + the step counter; 5 + the check that the update is finite (a sum of every
    update leaf, as `make_update`); 6 + the key in the carry, selected like the state; 7 the
    update from an Optax-style optimizer (``optim.sgd``: ``tx.update``, ``apply_updates``)."""
    x, y = data
    n = x.shape[0]
    stacked = (x.reshape(steps, batch, *x.shape[1:]), y.reshape(steps, batch))
    tx = optim.sgd(0.01)

    def take(a, idx):
        if level >= 2:
            return jnp.take(a, idx, axis=0, mode="fill", fill_value=0)
        return a.at[idx].get(mode="promise_in_bounds")

    def select(ok, new, old):
        return jax.tree.map(lambda a, o: jnp.where(ok, a, o), new, old)

    def body(carry, xs):
        p, opt_state, step, key = carry
        b = xs if level == 0 else jax.tree.map(lambda a: take(a, xs), data)
        loss, g = jax.value_and_grad(cnn_loss)(p, b)
        if level >= 7:
            updates, new_opt = tx.update(g, opt_state, p)
        else:
            updates, new_opt = jax.tree.map(lambda gi: -0.01 * gi, g), opt_state
        new = optim.apply_updates(p, updates)
        metrics = {"loss": loss}
        if level >= 3:
            norm = optim.global_norm(g)
            ok = jnp.isfinite(norm) & jnp.isfinite(loss)
            if level >= 5:
                total = sum(jnp.sum(u) for u in jax.tree.leaves(updates))
                ok = ok & jnp.isfinite(total)
            new, new_opt = select(ok, (new, new_opt), (p, opt_state))
            metrics.update(grad_norm=norm, skipped=(~ok).astype(jnp.int32))
            if level >= 4:
                step = jnp.where(ok, step + 1, step)
            if level >= 6:
                next_key = jax.random.wrap_key_data(jax.random.key_data(key) + 1)
                key = select(ok, next_key, key)
        return (new, new_opt, step, key), metrics

    def epoch(carry, data):
        p, opt_state, step, key = carry
        order = jnp.argsort(shuffle_hash(key, step, n))[: steps * batch].reshape(steps, batch)
        return jax.lax.scan(body, carry, stacked if level == 0 else order)

    program = jax.jit(epoch, donate_argnums=0)
    copy = jax.tree.map(jnp.copy, params)
    box = {"c": (copy, tx.init(copy), jnp.zeros((), jnp.int32), jax.random.key(0))}

    def run():
        box["c"], metrics = program(box["c"], data)
        return metrics["loss"]

    return run


def epoch_ladder() -> str:
    (batch, steps, size, c1, c2), params, data = _cnn_setup()
    rungs = [
        "bare `jax.jit(lax.scan)` of pre-cut batches",
        "+ the shuffle in the program, an in-bounds gather",
        '+ the gather as jaxwise\'s (`mode="fill"`)',
        "+ the gradient's global norm, the guard's selects",
        "+ the step counter",
        "+ the check that the update is finite",
        "+ the key in the carry, selected",
        "+ the update from `optim.sgd` (`tx.update`, `apply_updates`)",
    ]
    runners = [_ladder_rung(i, params, data, batch, steps) for i in range(len(rungs))]
    epochs = [
        jaxwise.train.make_epoch(
            jaxwise.train.value_and_grad(cnn_loss), jaxwise.train.ShuffleSampler(batch), audit=a
        )
        for a in (False, True)
    ]
    # the audit=False epoch's program without the Python around the call
    calls = [*epochs, epochs[0].jitted]
    for call in calls:
        box = {"s": TrainState.create(params, optim.sgd(0.01), 0)}
        box["s"], _ = call(box["s"], data)  # compiled; the state is a previous result

        def shipped(call=call, box=box):
            box["s"], metrics = call(box["s"], data)
            return metrics["loss"]

        runners.append(shipped)
    rungs += [
        "`make_epoch(..., audit=False)`",
        "`make_train_epoch` (audit on)",
        "`make_epoch(..., audit=False)`'s `.jitted` called directly (no wrapper)",
    ]
    times = interleaved_times(runners, repeat=max(REPEAT, 5) + 10, number=1)
    rows = [[name, fmt_time(t), f"**{t / times[0]:.3f}**"] for name, t in zip(rungs, times)]
    note = (
        "\n\nOn XLA:CPU the last three rows have the convolution rewrite and the branching guard "
        "(`REWRITES`), the hand-written rungs neither: compare the rungs with each other there."
        if jax.default_backend() == "cpu"
        else ""
    )
    return (
        table(
            [
                f"CNN epoch ({c1}/{c2} ch, {batch * steps} examples {size}x{size}, batch {batch}, "
                "SGD): what each part adds",
                "time per epoch",
                "vs bare scan",
            ],
            rows,
        )
        + note
    )


def padded_draws() -> str:
    n, draws = 67_331, 36
    keys = jax.random.split(jax.random.key(0), draws)

    def program(length):
        @jax.jit
        def f(keys):
            return sum(jnp.sum(jax.random.normal(k, (length,))[:n]) for k in keys)

        return lambda: f(keys)

    odd, padded = interleaved_times([program(n), program(-(-n // 8) * 8)], repeat=REPEAT)
    now = "on" if jax.default_backend() in REWRITES["padded_draws"] else "off"
    m = -(-n // 8) * 8
    rows = [
        [f"{n:,} (its own length)", fmt_time(odd), "1.00"],
        [f"{m:,} (a multiple of 8), sliced", fmt_time(padded), f"**{padded / odd:.2f}**"],
    ]
    return (
        table([f"{draws} draws of {n:,} normals, one program", "time", "ratio"], rows)
        + f"\n\nOn this backend the table has padded draws **{now}**."
    )


def loss_fn(params, batch):
    return numerics.cross_entropy(models.mlp_apply(params, batch[0]), batch[1])


def audit_ratios() -> str:
    x, yy = data.make_spiral(600, 3, 0.15, seed=0)
    xtr, _, ytr, _ = data.train_test_split(x, yy, test_fraction=0.2, seed=0)
    device_data = (jnp.asarray(xtr), jnp.asarray(ytr))
    tx = optim.chain(optim.clip_by_global_norm(1.0), optim.adam(1e-2))
    batch = (device_data[0][:128], device_data[1][:128])
    gradient, sampler = jaxwise.train.value_and_grad(loss_fn), jaxwise.train.ShuffleSampler(128)
    programs = {
        "train step (batch 128)": (
            [jaxwise.train.make_step(gradient, audit=a) for a in (True, False)],
            batch,
        ),
        "spiral epoch (1440 examples, batch 128)": (
            [jaxwise.train.make_epoch(gradient, sampler, audit=a) for a in (True, False)],
            device_data,
        ),
    }
    rows = []
    for label, (pair, inputs) in programs.items():
        boxes = [{"s": TrainState.create(models.init_mlp(0), tx, 1)} for _ in pair]

        def run(program, box, inputs=inputs):
            box["s"], metrics = program(box["s"], inputs)
            return metrics["loss"]

        t_on, t_off = interleaved_times(
            [functools.partial(run, p, b) for p, b in zip(pair, boxes)],
            repeat=3 * REPEAT,
            number=5,
        )
        rows.append([label, fmt_time(t_on), fmt_time(t_off), f"**{t_on / t_off:.3f}**"])
    return table(["donation audit", "audit=True", "audit=False", "ratio"], rows)


def audit_alone() -> str:
    """``Audit.before`` + ``after`` per call (the jitted call excluded), the state being the
    previous call's result (the training loop's case)."""
    f = jax.jit(lambda s, d: (jax.tree.map(lambda a: a, s), {"l": d.sum()}), donate_argnums=0)
    batch = jnp.ones((4, 3))
    rows = []
    for k in (6, 66):  # Adam: 3 leaves per parameter leaf, plus step, count and key
        params = {f"w{i}": jnp.full((8,), float(i)) for i in range(k)}
        state = TrainState.create(params, optim.adam(1e-3), 0)
        audit = Audit(donate=True, data_name="batch", function="f")
        leaves = audit.before(state, batch)
        result = audit.first_call(f, state, batch)
        audit.after(state, leaves, result)
        state = result[0]
        samples = []
        for _ in range(300 if QUICK else 2000):
            t0 = time.perf_counter()
            leaves = audit.before(state, batch)
            t1 = time.perf_counter()
            result = audit.call(f, state, batch)
            t2 = time.perf_counter()
            audit.after(state, leaves, result)
            samples.append(t1 - t0 + time.perf_counter() - t2)
            state = result[0]
        rows.append([str(len(jax.tree.leaves(state))), fmt_time(statistics.median(samples))])
    return table(["state leaves", "audit per call (median)"], rows)


def audit_parts() -> str:
    """The host-side pieces of one audited call, each timed alone on a 21-leaf Adam state:
    where `audit_alone`'s time goes on this backend (issue #47: on the TPU it is ~5.7x the same
    code path on CPU). ``is_deleted`` is read right after the dispatch (the audit's case: the
    program may still be running) and again once the outputs are ready."""
    f = jax.jit(lambda s, d: (jax.tree.map(lambda a: a, s), {"l": d.sum()}), donate_argnums=0)
    batch = jnp.ones((4, 3))
    params = {f"w{i}": jnp.full((8,), float(i)) for i in range(6)}
    state = TrainState.create(params, optim.adam(1e-3), 0)
    state, _ = f(state, batch)
    n = 300 if QUICK else 2000
    parts: dict[str, list[float]] = {
        "`jax.tree.leaves(state)`": [],
        "`leaf.devices()` (one leaf)": [],
        "the call's dispatch (`f(state, batch)`, not waited for)": [],
        "`is_deleted()` of every donated leaf, right after the dispatch": [],
        "`is_deleted()` of every donated leaf, outputs ready": [],
        "`unsafe_buffer_pointer()` of every output leaf": [],
    }
    names = list(parts)
    for _ in range(n):
        t0 = time.perf_counter()
        leaves = jax.tree.leaves(state)
        t1 = time.perf_counter()
        leaves[0].devices()
        t2 = time.perf_counter()
        result = f(state, batch)
        t3 = time.perf_counter()
        all(leaf.is_deleted() for leaf in leaves)
        t4 = time.perf_counter()
        out = jax.tree.leaves(result[0])
        jax.block_until_ready(out)
        t5 = time.perf_counter()
        all(leaf.is_deleted() for leaf in leaves)
        t6 = time.perf_counter()
        for leaf in out:
            leaf.unsafe_buffer_pointer()
        t7 = time.perf_counter()
        for name, dt in zip(names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t6 - t5, t7 - t6)):
            parts[name].append(dt)
        state = result[0]
    rows = [[name, fmt_time(statistics.median(s))] for name, s in parts.items()]
    leaves_n = len(jax.tree.leaves(state))
    return table([f"audited call, parts ({leaves_n} state leaves)", "median per call"], rows)


def run() -> None:
    d = jax.devices()[0]
    backend = jax.default_backend()
    parts = []
    for part in (cnn_epoch, epoch_ladder, padded_draws, audit_ratios, audit_alone, audit_parts):
        parts.append(part())
        print(parts[-1], flush=True)
    body = "\n\n".join(parts)
    write_section(
        f"{backend}/backend_rewrites",
        f"Backend rewrites and the donation audit ({backend}, {d.device_kind})",
        body,
    )


if __name__ == "__main__":
    main_guard(run)
