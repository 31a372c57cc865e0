"""Scale-out: data-parallel steps on 1/2/4 devices, FSDP memory per device, prefetch overlap.

- A data-parallel ``make_train_step(mesh=...)`` vs the same update written as a plain
  ``jax.jit`` with explicit in/out shardings (the peer), on 1, 2 and 4 fake CPU devices.
  Context only for absolute scaling: fake devices share the machine's cores.
- Memory per device (``memory_analysis()``) of an Adam step with parameters and moments
  sharded FSDP-style over a ``"model"`` axis vs replicated.
- A slow host generator feeding a training loop: a plain Python loop (the peer) vs
  ``fit(prefetch=2)``, which prepares the next batch while the step runs.
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)

import time  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from common import QUICK, interleaved_times, main_guard, table, write_section  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxwise import optim  # noqa: E402
from jaxwise.sharding import data_mesh, fsdp_mesh  # noqa: E402
from jaxwise.train import TrainState, fit, make_train_step  # noqa: E402

HIDDEN = 256 if QUICK else 512
# the meshes need 8 devices: the accelerator's when it has them, else the 8 fake CPU devices
# (an accelerator machine with fewer chips measures the CPU's partitioning, as on a laptop)
DEVICES = jax.devices() if jax.device_count() >= 8 else jax.devices("cpu")


def loss_fn(params, batch):
    x, y = batch
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def init_params(d_in=128, hidden=HIDDEN, d_out=16):
    rng = np.random.default_rng(0)
    return {
        "w1": jnp.asarray(rng.normal(size=(d_in, hidden)) / np.sqrt(d_in), jnp.float32),
        "b1": jnp.zeros(hidden),
        "w2": jnp.asarray(rng.normal(size=(hidden, d_out)) / np.sqrt(hidden), jnp.float32),
        "b2": jnp.zeros(d_out),
    }


def make_batch(n=256, d_in=128, d_out=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d_in)).astype(np.float32), rng.normal(size=(n, d_out)).astype(
        np.float32
    )


def plain_step(tx, mesh):
    """The peer: the same Adam update as a hand-written jit with explicit shardings."""
    rep, shard = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def update(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return (
        jax.jit(
            update,
            in_shardings=(rep, rep, shard),
            out_shardings=(rep, rep, rep),
            donate_argnums=(0, 1),
        ),
        rep,
        shard,
    )


def data_parallel():
    rows = []
    batch = make_batch()
    base = None
    for n in (1, 2, 4):
        mesh = data_mesh(DEVICES[:n])
        tx = optim.adam(1e-3)
        step = make_train_step(loss_fn, mesh=mesh)
        box = {"state": TrainState.create(init_params(), tx, 0)}
        peer, rep, shard = plain_step(tx, mesh)
        params = jax.device_put(init_params(), rep)
        peer_box = {"p": params, "o": jax.device_put(tx.init(params), rep)}
        device_batch = jax.device_put(batch, shard)

        def ours(step=step, box=box, batch=device_batch):
            box["state"], metrics = step(box["state"], batch)
            return metrics["loss"]

        def theirs(peer=peer, box=peer_box, batch=device_batch):
            box["p"], box["o"], loss = peer(box["p"], box["o"], batch)
            return loss

        t_ours, t_peer = interleaved_times([ours, theirs], repeat=7 if QUICK else 15, number=5)
        base = base or t_ours
        rows.append(
            [
                n,
                f"{t_peer * 1e3:.2f} ms",
                f"{t_ours * 1e3:.2f} ms",
                f"**{t_ours / t_peer:.2f}**",
                f"{t_ours / base:.2f}",
            ]
        )
    header = [
        "devices",
        "plain jit (peer)",
        "jaxwise step",
        "ours / peer",
        "ours / ours on 1 device",
    ]
    return table(header, rows)


def memory_per_device():
    rows = []
    tx = optim.adam(1e-3)
    batch = make_batch()
    state = TrainState.create(init_params(), tx, 0)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves((state.params, state.opt_state)))
    replicated = None
    for label, mesh in [
        ("replicated (data 8)", data_mesh(DEVICES[:8])),
        ("FSDP data 4 × model 2", fsdp_mesh(2, DEVICES[:8])),
        ("FSDP data 2 × model 4", fsdp_mesh(4, DEVICES[:8])),
    ]:
        step = make_train_step(loss_fn, mesh=mesh)
        placed, _ = step(TrainState.create(init_params(), tx, 0), batch)
        stats = step.jitted.lower(placed, batch).compile().memory_analysis()
        assert stats is not None
        args = stats.argument_size_in_bytes
        replicated = replicated or args
        rows.append(
            [
                label,
                f"{args / 2**20:.3f} MiB",
                f"{stats.temp_size_in_bytes / 2**20:.3f} MiB",
                f"**{args / replicated:.3f}**",
            ]
        )
    header = [
        f"Adam step, params+moments {state_bytes / 2**20:.2f} MiB",
        "arguments / device",
        "temporaries / device",
        "arguments vs replicated",
    ]
    return table(header, rows)


def prefetch_overlap():
    tx = optim.adam(1e-3)
    step = make_train_step(loss_fn)
    n, delay = (10, 0.01) if QUICK else (30, 0.01)
    batch = make_batch()

    def slow_batches():
        for _ in range(n):
            time.sleep(delay)  # host-side preparation (decoding, augmentation...)
            yield batch

    def plain_loop(read_loss):
        state = TrainState.create(init_params(), tx, 0)
        losses = []
        for b in slow_batches():
            state, metrics = step(state, b)
            if read_loss:  # e.g. to print or log it
                losses.append(float(metrics["loss"]))
        return metrics["loss"]

    def fitted(prefetch):
        state = TrainState.create(init_params(), tx, 0)
        _, report = fit(step, state, slow_batches(), prefetch=prefetch, progress=False)
        return report.losses[-1]

    t_plain, t_read, t_fit0, t_fit2 = interleaved_times(
        [lambda: plain_loop(False), lambda: plain_loop(True), lambda: fitted(0), lambda: fitted(2)],
        repeat=3,
    )
    rows = [
        ["plain Python loop, never reads the loss (peer)", f"{t_plain * 1e3:.0f} ms", "1.00"],
        [
            "plain Python loop reading each loss",
            f"{t_read * 1e3:.0f} ms",
            f"{t_read / t_plain:.2f}",
        ],
        ["fit(prefetch=0)", f"{t_fit0 * 1e3:.0f} ms", f"{t_fit0 / t_plain:.2f}"],
        ["fit(prefetch=2)", f"{t_fit2 * 1e3:.0f} ms", f"**{t_fit2 / t_plain:.2f}**"],
    ]
    note = (
        f"{n} batches, host preparation {delay * 1e3:.0f} ms each. The plain loop already "
        "overlaps through JAX's asynchronous dispatch as long as it never reads a metric; fit "
        "reads every loss (progress, NaN-guard counts) and stays ahead by prefetching."
    )
    return table(["loop over a slow generator", "time", "vs peer"], rows) + "\n\n" + note


def run():
    body = "\n\n".join(
        [
            "### Data-parallel step (Adam MLP, global batch 256)\n\n" + data_parallel(),
            "### FSDP memory per device (8 fake devices)\n\n" + memory_per_device(),
            "### Streaming: prefetch overlap\n\n" + prefetch_overlap(),
        ]
    )
    write_section("scale", "Scale-out: data parallelism, FSDP memory, prefetch", body)


if __name__ == "__main__":
    main_guard(run)
