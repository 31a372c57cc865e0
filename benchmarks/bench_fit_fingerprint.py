"""`train.fit`'s hash of every batch trained (the resume fingerprint) vs none: ratio, same process.

A realistic small run: an MNIST-shaped MLP classifier (784 -> 256 -> 256 -> 10, batch 128,
float32, Adam) over an epoch of ``STEPS`` host batches (NumPy), checkpointed once at the end
(`Checkpointing`: that is when `fit` hashes). The hashed run is compared with the same run
whose batch digest is replaced by a constant (everything else identical); warm-up excluded;
median of ``REPEATS`` alternating runs, wall-clock and the process's CPU time (all threads).
Also printed: the digest time of the epoch's batches alone, over the epoch's time (the cost
if none of it overlapped with training). Target: ratio <= 1.02.
"""

import os
import platform
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise import optim
from jaxwise.checkpoint import Checkpointer
from jaxwise.models import init_mlp, mlp_apply
from jaxwise.train import Checkpointing, TrainState, fit, make_train_step
from jaxwise.train._loop import _data_state

STEPS, BATCH = int(os.environ.get("STEPS", "300")), 128
REPEATS = int(os.environ.get("REPEATS", "7"))
rng = np.random.default_rng(0)
data = [
    (rng.normal(size=(BATCH, 784)).astype(np.float32), rng.integers(0, 10, BATCH).astype(np.int32))
    for _ in range(STEPS)
]


def loss(params, batch):
    x, y = batch
    logits = mlp_apply(params, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


tx = optim.adam(1e-3)
step = make_train_step(loss)
digest = _data_state.batch_digest


def run(hashed: bool) -> tuple[float, float]:
    _data_state.batch_digest = digest if hashed else (lambda batch: b"")
    state = TrainState.create(init_mlp(jax.random.key(0), (784, 256, 256, 10)), tx, 0)
    with Checkpointer(tempfile.mkdtemp(), async_save=False) as ck:
        t0, c0 = time.perf_counter(), time.process_time()
        state, _ = fit(step, state, data, callbacks=[Checkpointing(ck, every=10**9)])
        jax.block_until_ready(state)
        return time.perf_counter() - t0, time.process_time() - c0


run(False)  # warm-up
run(True)
times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
for _ in range(REPEATS):
    for flag in (False, True):
        times[flag].append(run(flag))
t0 = time.perf_counter()
for batch in data:
    digest(batch)
alone = time.perf_counter() - t0
print(
    f"backend {jax.default_backend()}, {platform.processor() or platform.machine()}, "
    f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"
)
print("| batches | measure | no hash | hashed | ratio |\n|---|---|---|---|---|")
for i, what in enumerate(("wall-clock", "CPU time")):
    base = statistics.median(t[i] for t in times[False])
    hashed = statistics.median(t[i] for t in times[True])
    print(f"| {STEPS} | {what} | {base:.3f} s | {hashed:.3f} s | {hashed / base:.3f} |")
base = statistics.median(t[0] for t in times[False])
print(f"digests of the epoch's batches alone: {alone:.3f} s = {alone / base:.1%} of the epoch")
