"""`train.fit` with a TensorBoardWriter (every step logged) vs without: ratio, same process.

An MLP regression (256 -> 512 -> 512 -> 1, batch 256) for 300 steps; warm-up run excluded;
median of ``REPEATS`` alternating runs, wall-clock and the process's CPU time (all threads:
less sensitive than wall-clock to other processes on a shared machine). Target: ratio <= 1.02.
"""

import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise import optim
from jaxwise.metrics import TensorBoardWriter
from jaxwise.models import init_mlp, mlp_apply
from jaxwise.train import MetricLogging, TrainState, fit, make_train_step

STEPS, BATCH = 300, 256
REPEATS = int(os.environ.get("REPEATS", "9"))
rng = np.random.default_rng(0)
data = [(rng.normal(size=(BATCH, 256)).astype(np.float32),) for _ in range(STEPS)]


def loss(params, batch):
    return jnp.mean(mlp_apply(params, batch[0]) ** 2)


tx = optim.adam(1e-3)
step = make_train_step(loss)


def run(with_tb: bool) -> tuple[float, float]:
    state = TrainState.create(init_mlp(jax.random.key(0), (256, 512, 512, 1)), tx, 0)
    writers = [TensorBoardWriter(tempfile.mkdtemp())] if with_tb else []
    t0, c0 = time.perf_counter(), time.process_time()
    state, _ = fit(step, state, data, callbacks=[MetricLogging(writers)])
    jax.block_until_ready(state)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    for w in writers:
        w.close()
    return dt, dc


run(False)  # warm-up
run(True)
times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
for _ in range(REPEATS):
    for flag in (False, True):
        times[flag].append(run(flag))
for i, what in enumerate(("wall-clock", "CPU time")):
    base = statistics.median(t[i] for t in times[False])
    tb = statistics.median(t[i] for t in times[True])
    print(f"| {STEPS} | {what} | {base:.3f} s | {tb:.3f} s | {tb / base:.3f} |")
