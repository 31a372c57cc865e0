"""``make bench-check``: the timed hot paths as in-run ratios, each against its committed baseline.

For a developer to run before resolving an issue that touches a hot path (not part of
``make test``: clocks flake; the deterministic guards are ``tests/test_perf_guards.py``). Each
check times jaxwise's program and its plain peer in the same process, interleaved, after
warm-up, in CPU time (less moved by the other processes of a shared machine than wall time),
and prints the ratio next to its baseline (``baselines.json``, measured on this project's
2-core CPU machine) and its target (the issue's bar). A ratio more than ``TOLERANCE`` above
both its baseline and its target is a regression: the exit code is then 1 (two runs of the
same code differ by up to ~15 % on a shared machine: a ratio under its target is not flagged).
``--write-baselines`` records the median of three runs of each check as the new baselines
(after a deliberate change, with the load noted).

Checks: ``jaxwise watch`` on small jitted calls, kernel least-squares steps and donating train
steps (``bench_watch.py``'s loops and measure); ghost clipping and the default DP gradient on
``bench_mf_ghost.py``'s transformer block vs the non-private gradient; the compiled epoch vs a
bare ``jit(lax.scan)`` of the same step; AdamW vs ``optax.adamw``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_watch
import jax
import jax.numpy as jnp
import numpy as np
import optax
from bench_mf_ghost import transformer
from common import block, environment_line, table

from jaxwise import optim, privacy
from jaxwise.models import init_mlp
from jaxwise.train import TrainState, make_train_epoch

BASELINES = Path(__file__).resolve().parent / "baselines.json"
TOLERANCE = 0.10  # this much above its baseline and its target: a regression
ROUNDS = 9


def paired_ratio(ours: Callable[[], Any], peer: Callable[[], Any], rounds: int = ROUNDS) -> float:
    """Median over interleaved rounds of (CPU time of ``ours()``) / (CPU time of ``peer()``),
    results blocked, after two warm-up calls each."""
    for fn in (ours, peer, ours, peer):
        block(fn())
    ratios = []
    for _ in range(rounds):
        times = []
        for fn in (ours, peer):
            start = time.process_time()
            block(fn())
            times.append(time.process_time() - start)
        ratios.append(times[0] / times[1])
    return statistics.median(ratios)


def watch_ratio(make: Callable[[], Callable[[], Any]]) -> float:
    """``bench_watch.py``'s overhead ratio (1 + added CPU per call / plain) of one loop."""
    bench_watch.REPEAT = 11
    m = bench_watch._measure(make)
    return 1 + m["added"] / m["plain"]


def _dp_ratio(method: Any, noise_multiplier: float) -> float:
    loss, params, batch = transformer(layer_norm=True, attention=True)
    key = jax.random.key(0)

    def mean_loss(p, b):
        return jnp.mean(jax.vmap(loss, in_axes=(None, 0))(p, b))

    plain = jax.jit(jax.grad(mean_loss))
    dp = jax.jit(
        lambda p, b, k: privacy.dp_gradient(
            loss, p, b, k, clip_norm=1.0, noise_multiplier=noise_multiplier, method=method
        )[0]
    )
    return paired_ratio(lambda: dp(params, batch, key), lambda: plain(params, batch))


def ghost_ratio() -> float:
    """Ghost clipping (σ = 0) / non-private gradient, transformer block B=32 T=64 d=128."""
    return _dp_ratio("ghost", 0.0)


def dp_gradient_ratio() -> float:
    """The default DP gradient (``method="auto"``, σ = 1) / non-private, same block."""
    return _dp_ratio("auto", 1.0)


def epoch_ratio() -> float:
    """``make_train_epoch`` / a bare ``jit(lax.scan)`` of the same Adam step (spiral MLP)."""
    x, y = bench_watch._data()
    tx = optax.adam(1e-2)
    params = init_mlp(jax.random.key(0), (2, 64, 64, 3))
    epoch = make_train_epoch(bench_watch._loss, bench_watch.BATCH, donate=False)
    state = TrainState.create(params, tx, 1)
    n, size = x.shape[0], bench_watch.BATCH

    @jax.jit
    def bare(params, opt_state, key, data):
        steps = n // size
        order = jax.random.permutation(key, n)[: steps * size].reshape(steps, size)

        def body(carry, idx):
            p, s = carry
            value, g = jax.value_and_grad(bench_watch._loss)(p, (data[0][idx], data[1][idx]))
            updates, s = tx.update(g, s, p)
            return (optax.apply_updates(p, updates), s), value

        return jax.lax.scan(body, (params, opt_state), order)

    opt_state = tx.init(params)
    return paired_ratio(
        lambda: epoch(state, (x, y)),
        lambda: bare(params, opt_state, jax.random.key(1), (x, y)),
        rounds=21,
    )


def optimizer_ratio() -> float:
    """jaxwise AdamW update / ``optax.adamw`` update, 2M float32 parameters in 20 leaves."""
    rng = np.random.default_rng(0)
    params = {f"w{i:02d}": jnp.asarray(rng.normal(size=100_000), jnp.float32) for i in range(20)}

    def program(tx):
        state = tx.init(params)

        @jax.jit
        def update(grads, state, params):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        return lambda: update(params, state, params)

    return paired_ratio(program(optim.adamw(1e-3)), program(optax.adamw(1e-3)), rounds=21)


CHECKS: dict[str, tuple[Callable[[], float], float, str]] = {
    "watch: small jitted calls (`x + 1.0`)": (
        lambda: watch_ratio(bench_watch.small_call_loop),
        1.05,
        "bench_watch.py",
    ),
    "watch: kernel least-squares steps": (
        lambda: watch_ratio(bench_watch.kernel_loop),
        1.05,
        "bench_watch.py",
    ),
    "watch: donating train steps (`make_train_step`)": (
        lambda: watch_ratio(bench_watch.spiral_step_loop),
        1.05,
        "bench_watch.py",
    ),
    "ghost clipping / non-private (transformer block)": (ghost_ratio, 1.10, "bench_mf_ghost.py"),
    "default DP gradient / non-private (transformer block)": (
        dp_gradient_ratio,
        1.16,
        "issue 51",
    ),
    "compiled epoch / bare jit(lax.scan)": (epoch_ratio, 1.05, "bench_train.py"),
    "AdamW / optax.adamw update": (optimizer_ratio, 1.05, "bench_optim.py"),
}


def main(argv: list[str]) -> int:
    write = "--write-baselines" in argv
    baselines = json.loads(BASELINES.read_text()) if BASELINES.exists() else {}
    ratios: dict[str, float] = {}
    rows = []
    regressed = []
    start = time.perf_counter()
    with jax.numpy_dtype_promotion("standard"):  # Optax's own code
        for name, (check, target, source) in CHECKS.items():
            # a baseline is the median of 3 runs: one run's outlier (0.84 for the epoch once)
            # would flag every later run
            runs = [check() for _ in range(3 if write else 1)]
            ratios[name] = value = statistics.median(runs)
            base = baselines.get("ratios", {}).get(name)
            status = "new" if base is None else "ok"
            limit = None if base is None else max(base, target) * (1 + TOLERANCE)
            if limit is not None and value > limit:
                status = f"REGRESSED (> {limit:.3f})"
                regressed.append(name)
            elif value > target:
                status += ", over target"
            base_text = "–" if base is None else f"{base:.3f}"
            rows.append([name, f"**{value:.3f}**", base_text, f"≤ {target}", status, source])
            print(f"{name}: {value:.3f} (baseline {base_text}, target ≤ {target})", flush=True)
    load = os.getloadavg()[0]
    print()
    print(f"_{environment_line()}, load average {load:.1f}, {time.perf_counter() - start:.0f} s_")
    print()
    print(table(["check", "ratio", "baseline", "target", "status", "benchmark"], rows))
    if write:
        rounded = {name: round(value, 3) for name, value in ratios.items()}
        record = {
            "environment": environment_line(),
            "load": round(load, 1),
            "runs": "median of 3 (bench_check.py --write-baselines)",
            "ratios": rounded,
        }
        BASELINES.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        print(f"\nbaselines written to {BASELINES}")
        return 0
    if regressed:
        print(f"\n{len(regressed)} regressed beyond {TOLERANCE:.0%} of the baseline: {regressed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
