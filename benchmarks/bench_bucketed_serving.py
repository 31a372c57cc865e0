"""Serving 2,000 requests with 200 distinct lengths: plain ``jit`` vs ``BucketedFunction``.

Plain ``jit`` compiles once per new length; ``BucketedFunction`` compiles its
buckets (chosen by ``plan_buckets`` from the observed lengths) at warm-up and
never again. Targets: zero compiles after warm-up, bucketed p99/p50 ≤ 3.
"""

import time
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
from common import QUICK, fmt_time, main_guard, percentile, table, write_section

from jaxwise.buckets import (
    BucketedFunction,
    Padded,
    padding_waste,
    plan_buckets,
    power_of_two_buckets,
)
from jaxwise.compilation import CompileCounter

D = 64


def encode(x, w1, w2, *, mask):
    """A small per-token MLP with a masked mean pool: (n, D) -> (n, D), (D,)."""
    h = jnp.tanh(x @ w1) @ w2
    m = mask[:, None].astype(h.dtype)
    return h, jnp.sum(h * m, axis=0) / jnp.maximum(jnp.sum(m), 1.0)


def run() -> None:
    rng = np.random.default_rng(0)
    n_requests = 500 if QUICK else 2000
    distinct = rng.choice(np.arange(1, 513), size=200, replace=False)
    lengths = rng.choice(distinct, size=n_requests)
    lengths[:200] = distinct  # every distinct length occurs
    rng.shuffle(lengths)
    w1 = rng.normal(size=(D, 4 * D)).astype(np.float32) / 8
    w2 = rng.normal(size=(4 * D, D)).astype(np.float32) / 16
    requests = [rng.normal(size=(n, D)).astype(np.float32) for n in lengths]

    plain = jax.jit(lambda x, w1, w2: encode(x, w1, w2, mask=jnp.ones(x.shape[0], bool)))
    buckets = plan_buckets(lengths, 8)
    served = BucketedFunction(
        encode,
        buckets,
        [
            Padded((None, D), np.float32),
            jax.ShapeDtypeStruct(w1.shape, np.float32),
            jax.ShapeDtypeStruct(w2.shape, np.float32),
        ],
        pass_mask=True,
        out_axes=(0, None),
    )

    def serve(fn, name):
        latencies = []
        with CompileCounter() as counter:
            t_start = time.perf_counter()
            for x in requests:
                t0 = time.perf_counter()
                h, pooled = fn(x, w1, w2)
                h, pooled = np.asarray(h), np.asarray(pooled)
                latencies.append(time.perf_counter() - t0)
            total = time.perf_counter() - t_start
        return total, latencies, counter.count

    with CompileCounter(served) as warm:
        t0 = time.perf_counter()
        served.warmup()
        t_warm = time.perf_counter() - t0
    t_plain, lat_plain, c_plain = serve(plain, "jit")
    t_bucket, lat_bucket, c_bucket = serve(served, "bucketed")

    # Correctness spot check against float64.
    x = requests[0]
    h, pooled = served(x, w1, w2)
    ref = np.tanh(x.astype(np.float64) @ w1) @ w2
    err = float(np.max(np.abs(h - ref)))

    # plan_buckets at scale: 100,000 distinct lengths (the quadratic DP needed m² floats: 80 GB).
    many = np.concatenate(
        [rng.permutation(np.arange(1, 100_001)), rng.integers(1, 100_001, 20_000)]
    )
    tracemalloc.start()
    t0 = time.perf_counter()
    plan_many = plan_buckets(many, 8)
    t_plan = time.perf_counter() - t0
    plan_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    p50p, p99p = percentile(lat_plain, 50), percentile(lat_plain, 99)
    p50b, p99b = percentile(lat_bucket, 50), percentile(lat_bucket, 99)
    rows = [
        [
            "plain `jax.jit`",
            c_plain,
            fmt_time(t_plain),
            fmt_time(p50p),
            fmt_time(p99p),
            f"{p99p / p50p:.1f}",
        ],
        [
            f"`BucketedFunction` ({len(buckets)} buckets)",
            c_bucket,
            fmt_time(t_bucket),
            fmt_time(p50b),
            fmt_time(p99b),
            f"{p99b / p50b:.1f}",
        ],
    ]
    waste_plan = padding_waste(lengths, buckets)[1]
    pow2 = power_of_two_buckets(int(lengths.max()), 8)
    waste_pow2 = padding_waste(lengths, pow2)[1]
    body = (
        table(["serving", "compiles while serving", "total", "p50", "p99", "p99/p50"], rows)
        + f"\n\n- total time ratio bucketed / plain: **{t_bucket / t_plain:.3f}**"
        + f"\n- warm-up: {warm.count} compiles in {fmt_time(t_warm)} (before serving)"
        + f"\n- buckets from `plan_buckets(lengths, 8)`: {buckets}; padding waste {waste_plan:.1%} "
        + f"vs {waste_pow2:.1%} for {len(pow2)} power-of-two buckets {pow2}"
        + f"\n- max abs error vs float64: {err:.1e}"
        + f"\n- {n_requests} requests, {len(distinct)} distinct lengths in [1, 512], D = {D}"
        + "\n- `plan_buckets` on 100,000 distinct lengths (120,000 requests), 8 buckets: "
        + f"{fmt_time(t_plan)}, peak memory {plan_peak / 2**20:.0f} MiB (exact DP, O(K·m) memory); "
        + f"padding waste {padding_waste(many, plan_many)[1]:.1%}"
    )
    write_section("bucketed_serving", "Bucketed AOT serving vs plain jit", body)


if __name__ == "__main__":
    main_guard(run)
