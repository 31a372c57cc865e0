"""Training machinery: donation memory, epoch-as-one-scan vs a Python loop, data parallelism.

- Peak memory (``memory_analysis().peak_memory_in_bytes``) of an AdamW step
  with vs without donation: the saving should equal one copy of the state.
- One epoch of the spiral MLP as one ``lax.scan`` program vs the idiomatic
  Python loop of jitted steps (NumPy shuffling, one dispatch per batch).
- One epoch of a CNN (2 conv + dense, batch 64, 8 steps, SGD) as one ``lax.scan``
  program vs a Python loop of jitted steps over the same batches, and vs a bare
  ``lax.scan`` of the same step: XLA:CPU runs a convolution through Eigen only in canonical
  (NHWC/HWIO) form and canonicalizes only outside loops, so the gradient convolutions of a
  bare scan run as naive loop nests; the epoch rewrites them (issue #29, target ≤ 1.25×
  the loop).
- The per-call donation audit (every call checks that no state leaf was
  already deleted, that the batch is not part of the state, and afterwards
  that every donated leaf really was deleted): spiral epoch with the audit
  vs without (target: ≤ 1.05×).
- Mixed precision: a bf16-compute step vs float32 (on CPU context only: CPUs
  have no bf16 arithmetic units); the table names the backend and device kind.
- Data parallel on 4 devices vs 1: the accelerator's when it has 4, else 4 fake CPU
  devices (context only: fake devices share the same cores).
"""

import jax

jax.config.update("jax_num_cpu_devices", 4)

import functools  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from common import QUICK, fmt_time, interleaved_times, main_guard, table, write_section  # noqa: E402

import jaxwise.train  # noqa: E402
from jaxwise import data, models, numerics, optim  # noqa: E402
from jaxwise.sharding import data_mesh  # noqa: E402
from jaxwise.train import TrainState, make_train_epoch, make_train_step  # noqa: E402
from jaxwise.tree import param_table  # noqa: E402


def loss_fn(params, batch):
    return numerics.cross_entropy(models.mlp_apply(params, batch[0]), batch[1])


def bf16_loss_fn(params, batch):
    logits = models.mlp_apply(params, batch[0]).astype(jnp.float32)
    return numerics.cross_entropy(logits, batch[1])


def donation_memory():
    sizes = (256, 512, 512, 10) if QUICK else (512, 1024, 1024, 10)
    tx = optim.adamw(1e-3)
    state = TrainState.create(models.init_mlp(0, sizes), tx, 0)
    batch = (jnp.ones((128, sizes[0])), jnp.zeros(128, jnp.int32))
    peaks = {}
    for donate in (True, False):
        compiled = make_train_step(loss_fn, donate=donate).jitted.lower(state, batch).compile()
        peaks[donate] = compiled.memory_analysis().peak_memory_in_bytes
    state_bytes = param_table(state).total_bytes
    saving = peaks[False] - peaks[True]
    rows = [
        ["without donation", f"{peaks[False] / 2**20:.2f} MiB"],
        ["with donation", f"{peaks[True] / 2**20:.2f} MiB"],
        ["saving", f"{saving / 2**20:.2f} MiB"],
        [
            "one copy of the state (params + Adam moments + step + key)",
            f"{state_bytes / 2**20:.2f} MiB",
        ],
        ["saving / state size", f"**{saving / state_bytes:.3f}**"],
    ]
    return table(["AdamW step, MLP " + "→".join(map(str, sizes)), "peak memory"], rows)


def spiral_setup():
    x, y = data.make_spiral(600, 3, 0.15, seed=0)
    xtr, _, ytr, _ = data.train_test_split(x, y, test_fraction=0.2, seed=0)
    tx = optim.chain(optim.clip_by_global_norm(1.0), optim.adam(1e-2))
    return tx, (jnp.asarray(xtr), jnp.asarray(ytr)), (xtr, ytr)


def epoch_vs_loop():
    tx, device_data, (xtr, ytr) = spiral_setup()
    epoch = make_train_epoch(loss_fn, 128)
    step = make_train_step(loss_fn)
    box_scan = {"s": TrainState.create(models.init_mlp(0), tx, 1)}
    box_loop = {"s": TrainState.create(models.init_mlp(0), tx, 1)}
    rng = np.random.default_rng(0)
    n_batches = len(xtr) // 128

    def scanned():
        box_scan["s"], metrics = epoch(box_scan["s"], device_data)
        return metrics["loss"]

    def python_loop():
        order = rng.permutation(len(xtr))
        for i in range(n_batches):
            idx = order[i * 128 : (i + 1) * 128]
            box_loop["s"], metrics = step(box_loop["s"], (xtr[idx], ytr[idx]))
        return metrics["loss"]

    t_scan, t_loop = interleaved_times(
        [scanned, python_loop], repeat=15 if not QUICK else 5, number=5
    )
    rows = [
        [
            "one `lax.scan` program per epoch (`make_train_epoch`)",
            fmt_time(t_scan),
            f"**{t_scan / t_loop:.2f}**",
        ],
        [f"Python loop of {n_batches} jitted steps (NumPy shuffle)", fmt_time(t_loop), "1.00"],
    ]
    return table(["spiral epoch (1440 examples, batch 128)", "time per epoch", "ratio"], rows)


CNN_DN = ("NHWC", "HWIO", "NHWC")


def cnn_loss(params, batch):
    x, y = batch
    h = jax.lax.conv_general_dilated(x, params["c1"], (1, 1), "SAME", dimension_numbers=CNN_DN)
    h = jax.nn.relu(h + params["b1"])
    h = jax.lax.conv_general_dilated(h, params["c2"], (2, 2), "SAME", dimension_numbers=CNN_DN)
    h = jax.nn.relu(h + params["b2"])
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return numerics.cross_entropy(h.reshape(x.shape[0], -1) @ params["w"], y)


def cnn_epoch_vs_loop():
    batch, steps = 64, 8
    ks = jax.random.split(jax.random.key(1), 3)
    params = {
        "c1": 0.3 * jax.random.normal(ks[0], (3, 3, 1, 32)),
        "b1": jnp.zeros(32),
        "c2": 0.05 * jax.random.normal(ks[1], (3, 3, 32, 64)),
        "b2": jnp.zeros(64),
        "w": 0.01 * jax.random.normal(ks[2], (7 * 7 * 64, 10)),
    }
    rng = np.random.default_rng(1)
    n = batch * steps
    x = jnp.asarray(rng.normal(size=(n, 28, 28, 1)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, n), jnp.int32)
    tx = optim.sgd(0.01)
    epoch = make_train_epoch(cnn_loss, batch)
    step = make_train_step(cnn_loss)
    boxes = [{"s": TrainState.create(params, tx, 0)} for _ in range(2)]
    batches = [
        (x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]) for i in range(steps)
    ]

    def sgd_step(p, b):
        loss, grads = jax.value_and_grad(cnn_loss)(p, b)
        return jax.tree.map(lambda a, g: a - 0.01 * g, p, grads), loss

    bare = jax.jit(lambda p, xs: jax.lax.scan(sgd_step, p, xs))
    stacked = (x.reshape(steps, batch, 28, 28, 1), y.reshape(steps, batch))
    box_bare = {"p": params}

    def scanned():
        boxes[0]["s"], metrics = epoch(boxes[0]["s"], (x, y))
        return metrics["loss"]

    def python_loop():
        for b in batches:
            boxes[1]["s"], metrics = step(boxes[1]["s"], b)
        return metrics["loss"]

    def bare_scan():
        box_bare["p"], losses = bare(box_bare["p"], stacked)
        return losses

    t_scan, t_loop, t_bare = interleaved_times(
        [scanned, python_loop, bare_scan], repeat=7 if not QUICK else 3, number=1
    )
    rows = [
        [
            "one `lax.scan` program per epoch (`make_train_epoch`)",
            fmt_time(t_scan),
            f"**{t_scan / t_loop:.2f}**",
        ],
        [f"Python loop of {steps} jitted steps", fmt_time(t_loop), "1.00"],
        [
            "bare `jax.jit(lax.scan)` of the same SGD step (no rewrite)",
            fmt_time(t_bare),
            f"{t_bare / t_loop:.2f}",
        ],
    ]
    return table(
        [f"CNN epoch (2 conv + dense, {n} examples, batch {batch})", "time per epoch", "ratio"],
        rows,
    )


def audit_overhead():
    tx, device_data, _ = spiral_setup()
    audited = make_train_epoch(loss_fn, 128)
    unaudited = jaxwise.train.make_epoch(
        jaxwise.train.value_and_grad(loss_fn), jaxwise.train.ShuffleSampler(128), audit=False
    )
    boxes = [{"s": TrainState.create(models.init_mlp(0), tx, 1)} for _ in range(2)]

    def run(epoch, box):
        box["s"], metrics = epoch(box["s"], device_data)
        return metrics["loss"]

    t_on, t_off = interleaved_times(
        [functools.partial(run, audited, boxes[0]), functools.partial(run, unaudited, boxes[1])],
        repeat=21 if not QUICK else 5,
        number=5,
    )
    rows = [
        ["audited on every call (default)", fmt_time(t_on), f"**{t_on / t_off:.3f}**"],
        ["`audit=False`", fmt_time(t_off), "1.000"],
    ]
    return table(["spiral epoch, donation audit", "time per epoch", "ratio"], rows)


def mixed_precision():
    tx = optim.adam(1e-3)
    sizes = (64, 512, 512, 10)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(256, 64)), jnp.float32)
    y = jnp.asarray(np.random.default_rng(1).integers(0, 10, 256), jnp.int32)
    steps = {
        "float32": make_train_step(loss_fn),
        "bfloat16 compute, float32 master weights": jaxwise.train.make_step(
            jaxwise.train.mixed_precision(
                jaxwise.train.value_and_grad(bf16_loss_fn), compute_dtype=jnp.bfloat16
            )
        ),
    }
    boxes = {name: {"s": TrainState.create(models.init_mlp(0, sizes), tx, 0)} for name in steps}

    def run(name):
        boxes[name]["s"], m = steps[name](boxes[name]["s"], (x, y))
        return m["loss"]

    times = interleaved_times([functools.partial(run, n) for n in steps], repeat=9, number=3)
    rows = [[n, fmt_time(t), f"{t / times[0]:.2f}"] for n, t in zip(steps, times)]
    where = f"{jax.default_backend()}, {jax.devices()[0].device_kind}"
    return table([f"Adam step, batch 256, MLP 64→512→512→10 ({where})", "time", "ratio"], rows)


def data_parallel():
    tx = optim.adam(1e-3)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1024, 64)), jnp.float32)
    y = jnp.asarray(np.random.default_rng(1).integers(0, 10, 1024), jnp.int32)
    sizes = (64, 512, 512, 10)
    # 4 accelerator devices when there are, else the 4 fake CPU devices (context only)
    devices = jax.devices() if jax.device_count() >= 4 else jax.devices("cpu")
    single = make_train_step(loss_fn, mesh=data_mesh(devices[:1]))
    parallel = make_train_step(loss_fn, mesh=data_mesh(devices[:4]))
    boxes = [{"s": TrainState.create(models.init_mlp(0, sizes), tx, 0)} for _ in range(2)]
    sharded = jax.device_put((x, y), parallel.batch_sharding)
    x, y = jax.device_put((x, y), single.batch_sharding)

    def run(step, box, batch):
        box["s"], m = step(box["s"], batch)
        return m["loss"]

    t1, t4 = interleaved_times(
        [
            functools.partial(run, single, boxes[0], (x, y)),
            functools.partial(run, parallel, boxes[1], sharded),
        ],
        repeat=9,
        number=3,
    )
    rows = [
        ["1 device", fmt_time(t1), "1.00"],
        [
            "4 fake CPU devices (same cores)"
            if devices[0].platform == "cpu"
            else f"4 {devices[0].device_kind} devices",
            fmt_time(t4),
            f"{t4 / t1:.2f}",
        ],
    ]
    return table(["data-parallel Adam step, batch 1024, MLP 64→512→512→10", "time", "ratio"], rows)


def run() -> None:
    body = "\n\n".join(
        [
            donation_memory(),
            epoch_vs_loop(),
            cnn_epoch_vs_loop(),
            audit_overhead(),
            mixed_precision(),
            data_parallel(),
        ]
    )
    body += (
        "\n\nThe CNN epoch's gradient convolutions (kernel and input gradients of an NHWC "
        "convolution) are not in the canonical form XLA:CPU hands to Eigen; XLA rewrites them "
        "only outside loops, so `make_train_epoch` rewrites them in the traced program "
        "(`jaxwise.train._convolution`) and the bare scan shows the cost without it."
        "\n\nFake CPU devices share the machine's cores, so the data-parallel line is context "
        "only (it measures the partitioning overhead, not a speed-up)."
    )
    write_section(
        "train",
        "Training: donation, scanned epochs, audit, mixed precision, data parallelism",
        body,
    )


if __name__ == "__main__":
    main_guard(run)
