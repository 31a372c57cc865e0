"""Overhead of ``jaxwise watch`` on steady-state training loops (target ≤ 1.05× without --nans).

A watched jitted function is a thin wrapper: per call it counts, times, and (for a donating
function) checks that the donated buffers were consumed. Measured here on three loops, each
built twice in one process — once before the watch (plain) and once inside it (watched) — and
timed round-robin inside the watch, after warm-up (so no compiles), blocking at the end of
every sample:

- the spiral job's scanned epoch (``make_train_epoch``: one call per epoch);
- the spiral model stepped batch by batch (``make_train_step``: one donating call per batch,
  the worst case for per-call overhead);
- a Flax NNX loop (``nnx.jit`` train step with ``nnx.Optimizer``, one call per batch);
- a loop of small jitted calls (``x + 1.0``, ~4 µs each: the per-call cost laid bare), and as
  its floor the same calls through a bare Python wrapper (an object whose ``__call__`` only
  forwards): what any Python-level wrapper costs before doing anything;
- a kernel least-squares loop: gradient steps ``α ← α − η Kᵀ(Kα − y)`` on a 64-point RBF Gram
  matrix, three array arguments, ~8 µs per call (the 10,000-call script of issue 51).

Context rows: ``transfers=True`` (host batches inspected per call) and ``nans="report"``
(outputs checked, a device-to-host sync per call: not covered by the target).
"""

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from common import QUICK, block, fmt_time, main_guard, table, write_section

from jaxwise import numerics
from jaxwise.data import make_spiral
from jaxwise.models import init_mlp, mlp_apply
from jaxwise.train import TrainState, make_train_epoch, make_train_step
from jaxwise.watch import Watch

BATCH = 128
STEPS = 20 if QUICK else 60  # calls per timed sample
REPEAT = 7 if QUICK else 31


def _data():
    x, y = make_spiral(1280, 3, 0.15, seed=0)
    return jnp.asarray(x, jnp.float32), jnp.asarray(y)


def _loss(params, batch):
    return numerics.cross_entropy(mlp_apply(params, batch[0]), batch[1])


def spiral_epoch_loop():
    """``loop()`` running STEPS // 10 scanned epochs."""
    data = _data()
    tx = optax.adam(1e-2)
    epoch = make_train_epoch(_loss, BATCH)
    box = [TrainState.create(init_mlp(jax.random.key(0), (2, 64, 64, 3)), tx, 1)]

    def loop():
        for _ in range(max(1, STEPS // 10)):
            box[0], metrics = epoch(box[0], data)
        return box[0].params

    return loop


def spiral_step_loop(host_batches: bool = False):
    """``loop()`` running STEPS donating train steps, one mini-batch each."""
    x, y = _data()
    batches = [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(x), BATCH)]
    if host_batches:
        batches = [(np.asarray(a), np.asarray(b)) for a, b in batches]
    tx = optax.adam(1e-2)
    step = make_train_step(_loss)
    box = [TrainState.create(init_mlp(jax.random.key(0), (2, 64, 64, 3)), tx, 1)]

    def loop():
        for i in range(STEPS):
            box[0], metrics = step(box[0], batches[i % len(batches)])
        return box[0].params

    return loop


def nnx_loop():
    """``loop()`` running STEPS ``nnx.jit`` train steps of a Flax NNX MLP."""
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(2, 64, rngs=rngs)
            self.mid = nnx.Linear(64, 64, rngs=rngs)
            self.out = nnx.Linear(64, 3, rngs=rngs)

        def __call__(self, x):
            return self.out(jax.nn.relu(self.mid(jax.nn.relu(self.hidden(x)))))

    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    x, y = _data()
    batches = [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(x), BATCH)]

    def loop():
        for i in range(STEPS):
            loss = train_step(model, optimizer, *batches[i % len(batches)])
        return loss

    return loop


SMALL_CALLS = 1000  # calls per timed sample of the small-call loops
_SMALL = jax.jit(lambda x: x + 1.0)  # jitted before any watch: the floor wraps it bare


def small_call_loop(bare: bool = False):
    """``loop()`` making SMALL_CALLS calls of a small jitted function (``bare``: of `_SMALL`
    through a forwarding object, the floor of any Python-level wrapper)."""

    class Bare:
        def __init__(self, f):
            self.f = f

        def __call__(self, *args, **kwargs):
            return self.f(*args, **kwargs)

    f = Bare(_SMALL) if bare else jax.jit(lambda x: x + 1.0)
    x = jnp.ones(4)

    def loop():
        for _ in range(SMALL_CALLS):
            out = f(x)
        return out

    return loop


def kernel_step(alpha, gram, y):
    """One gradient step of kernel least squares, ``0.5 * |K alpha - y|^2``: (64,) -> (64,)."""
    return alpha - 0.05 * (gram.T @ (gram @ alpha - y))


def kernel_loop():
    """``loop()`` making SMALL_CALLS kernel least-squares steps (weights and data as arguments)."""
    x = jnp.linspace(-3.0, 3.0, 64)[:, None]
    y = jnp.sin(3.0 * x[:, 0])
    gram = jnp.exp(-0.5 * (x - x.T) ** 2 / 0.09) + 1e-3 * jnp.eye(64)
    step = jax.jit(kernel_step)
    box = [jnp.zeros(64)]

    def loop():
        for _ in range(SMALL_CALLS):
            box[0] = step(box[0], gram, y)
        return box[0]

    return loop


def small_floor_loop():
    """Plain: `_SMALL` called directly; "watched": through a bare wrapper (no watch involved:
    `_SMALL` was jitted before the watch)."""
    return small_call_loop(bare=_BUILDING_WATCHED[0])


_BUILDING_WATCHED = [False]


def _samples(loops) -> tuple[list[list[float]], list[list[float]]]:
    """Round-robin samples of each loop, after two warm-up runs each: (wall seconds, seconds
    of CPU time of the calling thread, where the watch's per-call work runs)."""
    for loop in loops:
        block(loop())
        block(loop())
    wall: list[list[float]] = [[] for _ in loops]
    cpu: list[list[float]] = [[] for _ in loops]
    for _ in range(REPEAT):
        for i, loop in enumerate(loops):
            w0, c0 = time.perf_counter(), time.thread_time()
            block(loop())
            cpu[i].append(time.thread_time() - c0)
            wall[i].append(time.perf_counter() - w0)
    return wall, cpu


def _measure(make, **watch_options) -> dict:
    """A plain and a watched loop (and a second plain one, the noise floor), measured."""
    plain, twin = make(), make()
    with Watch(**watch_options) as watch:
        _BUILDING_WATCHED[0] = True
        try:
            watched = make()
        finally:
            _BUILDING_WATCHED[0] = False
        (w_plain, w_twin, w_watched), (c_plain, c_twin, c_watched) = _samples(
            [plain, twin, watched]
        )
    calls = sum(f.calls or 0 for f in watch.report().functions)
    return {
        "plain": min(w_plain),  # the least disturbed sample: the lowest denominator
        "watched": min(w_watched),
        "added": statistics.median(w - p for p, w in zip(c_plain, c_watched)),
        "noise": statistics.median(t - p for p, t in zip(c_plain, c_twin)),
        "calls": calls,
    }


def run() -> None:
    with jax.numpy_dtype_promotion("standard"):  # Optax's own code
        cases = [
            ("spiral, scanned epochs (`make_train_epoch`)", spiral_epoch_loop, {}, "≤ 1.05"),
            ("spiral, step per batch (`make_train_step`)", spiral_step_loop, {}, "≤ 1.05"),
            ("Flax NNX, `nnx.jit` step per batch", nnx_loop, {}, "≤ 1.05"),
            (
                "spiral steps, NumPy batches, `transfers=True`",
                lambda: spiral_step_loop(host_batches=True),
                {"transfers": True},
                "context",
            ),
            ("spiral steps, `nans='report'`", spiral_step_loop, {"nans": "report"}, "context"),
            ("small jitted calls (`x + 1.0`)", small_call_loop, {}, "≤ 1.05"),
            ("small calls through a bare Python wrapper (floor)", small_floor_loop, {}, "floor"),
            ("kernel least-squares steps (3 arguments)", kernel_loop, {}, "≤ 1.05"),
        ]
        rows = []
        for title, make, options, target in cases:
            m = _measure(make, **options)
            per_call = max(1, STEPS // 10) if "epoch" in title else STEPS
            small = make in (small_call_loop, small_floor_loop, kernel_loop)
            per_call = SMALL_CALLS if small else per_call
            rows.append(
                [
                    title,
                    fmt_time(m["plain"] / per_call),
                    fmt_time(m["watched"] / per_call),
                    fmt_time(m["added"] / per_call),
                    fmt_time(m["noise"] / per_call),
                    f"{1 + m['added'] / m['plain']:.3f}",
                    target,
                    m["calls"],
                ]
            )
    write_section(
        "watch",
        "`jaxwise watch` overhead on steady-state training loops",
        table(
            [
                "loop",
                "plain / call",
                "watched / call",
                "added CPU / call",
                "noise (plain vs plain)",
                "overhead ratio",
                "target",
                "watched calls",
            ],
            rows,
        )
        + f"\n\n{REPEAT} round-robin samples per loop of {STEPS} calls (epochs: "
        f"{max(1, STEPS // 10)}), after warm-up, in one process. The watch's per-call work "
        "runs in the calling thread: *added CPU* is the median paired difference of that "
        "thread's CPU time, watched minus plain (a second plain loop gives the noise floor). "
        "*Overhead ratio* = 1 + added / plain, with *plain* the fastest wall-time sample (the "
        "least disturbed by other processes: the smallest denominator, so the ratio errs high). "
        "Wall times of whole samples are too noisy to compare directly on a shared machine. "
        "With `nans`, every watched call waits for its result (a device-to-host sync) and "
        "watched functions do not donate: a debugging mode, not covered by the target. "
        f"The small-call and kernel loops make {SMALL_CALLS} calls per sample; the floor's "
        "*watched* column is the bare wrapper (no watch involved).",
    )


if __name__ == "__main__":
    main_guard(run)
