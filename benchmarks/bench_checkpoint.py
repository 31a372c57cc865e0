"""Streaming checkpoints: ``fit`` with a save every 100 steps vs none, and a save vs orbax's.

- ``jaxwise.train.fit`` over 600 steps of an Adam MLP (64→512→512→10, batch 256, 3.4 MiB of
  state) without checkpoints, with ``Checkpointer`` saves every 100 steps (asynchronous by
  default; ``async_save=False`` as context) and, as the peer, a plain Python loop over the
  same step saving with orbax's ``StandardCheckpointer`` every 100 steps (then waiting for
  it). Target: fit with saves ≤ 1.05× fit without.
- One save: how long it holds up the training loop (``save`` returning) and how long it
  takes to be complete on disk, ours vs a plain orbax save of the same arrays. Target ≤ 1.2×.

Every figure is a median over interleaved rounds (ours, peer, ours, peer, …) on a shared
2-core machine, so that load affects every side alike.
"""

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from common import QUICK, fmt_time, main_guard, table, write_section

from jaxwise import numerics, optim
from jaxwise.checkpoint import Checkpointer
from jaxwise.models import init_mlp, mlp_apply
from jaxwise.train import TrainState, fit, make_train_step

STEPS = 200 if QUICK else 600
EVERY = 100
ROUNDS = 3 if QUICK else 5
SIZES = (64, 512, 512, 10)
BATCH = 256


def loss(params, batch):
    return numerics.cross_entropy(mlp_apply(params, batch[0]), batch[1])


def batches(n):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], size=(n, BATCH)).astype(np.int32)
    return [(x[i], y[i]) for i in range(n)]


def fresh_state(tx):
    return TrainState.create(init_mlp(jax.random.key(0), SIZES), tx, 0)


def as_tree(state):
    """The state's arrays as a plain pytree for orbax (typed key as its raw data)."""
    return {
        "params": state.params,
        "opt_state": state.opt_state,
        "step": state.step,
        "key": jax.random.key_data(state.key),
    }


def fit_table(root: Path) -> str:
    tx = optim.adam(1e-3)
    step = make_train_step(loss)
    # the peer's loop cannot donate: orbax's asynchronous save keeps views of the arrays
    plain_step = make_train_step(loss, donate=False)
    data = batches(STEPS)
    fit(step, fresh_state(tx), data[:3], progress=False)  # compile outside the timings
    fit(plain_step, fresh_state(tx), data[:3], progress=False)

    def run_fit(checkpointer_kwargs):
        def go(i):
            if checkpointer_kwargs is None:
                fit(step, fresh_state(tx), data, progress=False)
                return
            directory = root / f"fit-{i}-{len(checkpointer_kwargs)}"
            with Checkpointer(directory, keep=3, **checkpointer_kwargs) as ck:
                fit(step, fresh_state(tx), data, checkpointer=ck, checkpoint_every=EVERY)

        return go

    def run_plain(save: bool):
        def go(i):
            saver = ocp.StandardCheckpointer() if save else None
            state = fresh_state(tx)
            for n, batch in enumerate(data, 1):
                state, _ = plain_step(state, batch)
                if saver is not None and (n % EVERY == 0 or n == len(data)):
                    saver.save(root / f"plain-{i}" / str(n), as_tree(state))
            if saver is not None:
                saver.wait_until_finished()
                saver.close()
            jax.block_until_ready(state)

        return go

    sides = {
        "`fit`, no checkpoints": run_fit(None),
        f"`fit`, `Checkpointer` save every {EVERY} steps (async, the default)": run_fit({}),
        f"`fit`, save every {EVERY} steps, `async_save=False`": run_fit({"async_save": False}),
        "plain loop, no checkpoints (peer)": run_plain(False),
        f"plain loop + orbax `StandardCheckpointer` every {EVERY} steps (peer)": run_plain(True),
    }
    samples: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for i in range(ROUNDS):
        for name in order[i % len(order) :] + order[: i % len(order)]:  # each side leads once
            t0, c0 = time.perf_counter(), time.process_time()
            sides[name](i)
            samples[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)  # every thread of this process
        for path in root.iterdir():
            shutil.rmtree(path, ignore_errors=True)
    med = {name: statistics.median(s) for name, s in samples.items()}
    med_cpu = {name: statistics.median(s) for name, s in cpu.items()}
    names = list(sides)
    rows = []
    for name in names:
        own = names[0] if name.startswith("`fit`") else names[3]
        target = "≤ 1.05" if name == names[1] else ""
        rows.append(
            [
                name,
                fmt_time(med[name]),
                f"**{med[name] / med[own]:.3f}**",
                fmt_time(med_cpu[name]),
                f"{med_cpu[name] / med_cpu[own]:.3f}",
                target,
            ]
        )
    header = [
        f"{STEPS} steps, Adam MLP {'→'.join(map(str, SIZES))}, batch {BATCH} "
        "(ratios from one interleaved run)",
        "wall",
        "vs the same loop without saves",
        "CPU (all threads)",
        "ratio",
        "target",
    ]
    load = os.getloadavg()[0]
    return (
        table(header, rows)
        + f"\n\nMedian of {ROUNDS} interleaved rounds (each side leads one round); load "
        f"average {load:.1f} on 2 cores at the end. A save costs CPU time (orbax's writing, "
        "our checksums, the retention's deletions) whichever thread does it: the "
        "asynchronous save hides it in wall time only where a core is idle, so on a "
        "saturated machine the wall ratio tends to the CPU ratio. The peer's loop does not "
        "donate its state: orbax's asynchronous save keeps views of the arrays (on CPU), so "
        "a donating loop would lose its donation (jaxwise's donation audit says so)."
    )


def save_table(root: Path) -> str:
    tx = optim.adam(1e-3)
    state = fresh_state(tx)
    tree = as_tree(state)
    nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
    plain = ocp.StandardCheckpointer()
    manager = ocp.CheckpointManager(
        root / "manager",
        options=ocp.CheckpointManagerOptions(max_to_keep=3, enable_async_checkpointing=False),
    )
    ours_async = Checkpointer(root / "ours-async", keep=3)
    ours_sync = Checkpointer(root / "ours-sync", keep=3, async_save=False)
    counter = iter(range(1, 10**6))
    busy = jnp.ones((512, 512))

    def train_a_little():  # what the loop does between two saves (here: 20 matrix products)
        out = busy
        for _ in range(20):
            out = jnp.tanh(out @ busy)
        out.block_until_ready()

    def ours(writer, blocking):
        def go():
            s = state.replace(step=jnp.asarray(next(counter), jnp.int32))
            t0 = time.perf_counter()
            writer.save(s)
            held = time.perf_counter() - t0
            if not blocking:
                train_a_little()
                writer.wait()
            return held

        return go

    def orbax(blocking):
        def go():
            path = root / "plain" / str(next(counter))
            t0 = time.perf_counter()
            plain.save(path, tree)
            if blocking:
                plain.wait_until_finished()
            held = time.perf_counter() - t0
            if not blocking:
                train_a_little()
                plain.wait_until_finished()
            return held

        return go

    def orbax_kept():
        t0 = time.perf_counter()
        manager.save(next(counter), args=ocp.args.StandardSave(tree))
        manager.wait_until_finished()
        return time.perf_counter() - t0

    def complete(fn):
        def go():
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0

        return go

    sides = {
        "held": (ours(ours_async, False), orbax(False)),
        "kept": (complete(ours(ours_sync, True)), orbax_kept),
        "complete": (complete(ours(ours_sync, True)), complete(orbax(True))),
    }
    samples = {name: ([], []) for name in sides}
    for _ in range(3):  # warm-up: compile the checksum program, orbax's first-call costs
        for mine, peer in sides.values():
            mine(), peer()
    for _ in range(9):
        for name, (mine, peer) in sides.items():
            samples[name][0].append(mine())
            samples[name][1].append(peer())
    ours_async.close()
    ours_sync.close()
    plain.close()
    manager.close()
    rows = []
    labels = {
        "held": (
            "the training loop is held up: `save` returns (asynchronous saves)",
            "`StandardCheckpointer` (async)",
            "≤ 1.2",
        ),
        "kept": (
            "complete on disk, newest 3 steps kept (synchronous saves)",
            "`CheckpointManager(max_to_keep=3)`",
            "≤ 1.2",
        ),
        "complete": (
            "complete on disk (synchronous saves; the peer keeps every step)",
            "`StandardCheckpointer`",
            "context",
        ),
    }
    for name, (mine, peer) in samples.items():
        label, peer_name, target = labels[name]
        m, p = statistics.median(mine), statistics.median(peer)
        rows.append(
            [label, fmt_time(m), f"{fmt_time(p)} ({peer_name})", f"**{m / p:.2f}**", target]
        )
    header = [
        f"one save, {nbytes / 2**20:.1f} MiB of state (ratios from one interleaved run)",
        "jaxwise `Checkpointer`",
        "plain orbax",
        "ratio",
        "target",
    ]
    return table(header, rows)


NOTES = (
    "An asynchronous `Checkpointer.save` copies the state's arrays on their devices (an "
    "asynchronous copy: the state is donated to the next step at once) and hands the copy "
    "to a background thread, which checksums and writes it with orbax and then deletes the "
    "steps beyond `keep`. At most one save is in flight: the next `save` waits for it, and a "
    "failed save is raised by the next `save`, `wait` or `close`. orbax's own asynchronous "
    "save copies the arrays to the host and starts its threads before returning, so it holds "
    "the loop up longer. A complete synchronous save does more than a plain orbax one: the "
    "checksum of every leaf (one compiled program) and a sealed metadata item; with the "
    "same retention (orbax's `CheckpointManager(max_to_keep=3)`) the difference is that "
    "work. `StandardCheckpointer` alone keeps every step (no deletion), hence the context "
    "row."
)


def run() -> None:
    root = Path(tempfile.mkdtemp(prefix="jaxwise-bench-ckpt-"))
    try:
        body = "\n\n".join([fit_table(root), save_table(root), NOTES])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    write_section("checkpoint", "Streaming checkpoints: asynchronous saves in `fit`", body)


if __name__ == "__main__":
    main_guard(run)
