"""AdamW's update against the memory bandwidth: Optax vs jaxwise, on the current backend.

An AdamW step on float32 parameters is memory-bound: it must read params, grads, mu and nu
and write params, mu and nu, 28 bytes per parameter, for ~15 flops per parameter. So its speed
is measured as *effective bandwidth* (those 28 bytes per parameter over the step's time) and
as a fraction of the chip's HBM bandwidth (819 GB/s on a TPU v5e, "TPU v5 lite"; other
devices: n/a).

For 10M and 100M float32 parameters in 20 leaves (on CPU: 1M, quick: 200k), a jitted
``update + apply_updates`` with params and optimizer state donated is timed for
``optax.adamw`` and ``jaxwise.optim.adamw`` in two ways:

- *blocked*: one call, then ``block_until_ready``: the step's latency, including the host's
  round trip to the device (on the TPU v5e, about 0.9 ms: most of a 10M-parameter step);
- *pipelined*: 10 calls, then one ``block_until_ready``: how a training loop runs it (JAX
  dispatches asynchronously), i.e. the device's time per step.

The table also has XLA's ``cost_analysis()`` bytes accessed (over the 28 bytes/parameter
minimum) and the optimized HLO's count of fusions and copies in the entry computation: one
multi-output fusion per leaf means the update already reads and writes each array once.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
from common import QUICK, fmt_time, interleaved_times, main_guard, table, write_section

from jaxwise import optim

N_LEAVES = 20
BYTES_PER_PARAM = 7 * 4  # read p, g, mu, nu; write p, mu, nu (float32)
PEAK_HBM = {"TPU v5 lite": 819e9, "TPU v5e": 819e9}


def backend_sizes() -> list[int]:
    if jax.default_backend() == "cpu":
        return [200_000] if QUICK else [1_000_000]
    return [10_000_000, 100_000_000]


def make_params(n: int, seed: int = 0) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed)
    sizes = rng.multinomial(n - N_LEAVES, np.ones(N_LEAVES) / N_LEAVES) + 1
    return {
        f"layer_{i:02d}": jnp.asarray(rng.normal(size=int(k)), jnp.float32)
        for i, k in enumerate(sizes)
    }


def make_step(tx: optax.GradientTransformation):
    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


def hlo_counts(compiled) -> tuple[int, int]:
    """Fusions and copies in the optimized HLO's entry computation."""
    text = compiled.as_text() or ""
    entry = text[text.find("ENTRY") :] if "ENTRY" in text else text
    entry = entry[: entry.find("\n}\n")] if "\n}\n" in entry else entry
    fusions = len(re.findall(r"\bfusion\(", entry))
    copies = len(re.findall(r"\bcopy(?:-start)?\(", entry))
    return fusions, copies


def bytes_accessed(compiled) -> float:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
        cost = cost[0] if cost else {}
    return float((cost or {}).get("bytes accessed", float("nan")))


def variants() -> dict[str, optax.GradientTransformation]:
    lr, wd = optax.linear_schedule(1e-3, 1e-4, 1000), 1e-2
    return {
        "optax.adamw": optax.adamw(lr, weight_decay=wd),
        "jaxwise.optim.adamw": optim.adamw(lr, weight_decay=wd),
    }


def time_steps(runners, *, number: int, repeat: int) -> list[float]:
    """Per-step times: ``number`` calls, then one block (interleaved, median)."""
    return interleaved_times(
        [lambda r=r: [r() for _ in range(number)][-1] for r in runners], repeat=repeat
    )


def measure(n: int) -> list[list[str]]:
    params = make_params(n)
    grads = jax.tree.map(lambda p: 1e-3 * jnp.cos(p), params)
    peak = PEAK_HBM.get(jax.devices()[0].device_kind) if jax.default_backend() != "cpu" else None
    runners, info = [], []
    for name, tx in variants().items():
        step = make_step(tx)
        box = {"p": jax.tree.map(jnp.copy, params)}
        box["s"] = tx.init(box["p"])
        compiled = step.lower(box["p"], box["s"], grads).compile()

        def one(step=step, box=box):
            box["p"], box["s"] = step(box["p"], box["s"], grads)
            return box["p"]

        runners.append(one)
        info.append((name, bytes_accessed(compiled), *hlo_counts(compiled)))
    repeat = 5 if QUICK else 11
    pipelined = [t / 10 for t in time_steps(runners, number=10, repeat=repeat)]
    blocked = time_steps(runners, number=1, repeat=3 * repeat)
    rows = []
    for mode, times in (("pipelined", pipelined), ("blocked", blocked)):
        for (name, accessed, fusions, copies), t in zip(info, times):
            gbs = n * BYTES_PER_PARAM / t / 1e9
            rows.append(
                [
                    f"{n / 1e6:g}M",
                    name,
                    mode,
                    fmt_time(t),
                    f"{t / times[0]:.3f}",
                    f"{gbs:.1f}",
                    f"**{100 * gbs * 1e9 / peak:.0f}%**" if peak else "n/a",
                    f"{accessed / 1e6:.0f} MB ({accessed / (n * BYTES_PER_PARAM):.2f}x)",
                    str(fusions),
                    str(copies),
                ]
            )
    return rows


def run() -> None:
    d = jax.devices()[0]
    backend = jax.default_backend()
    rows = [row for n in backend_sizes() for row in measure(n)]
    header = [
        "params",
        "AdamW update + apply (donated)",
        "timing",
        "time per step",
        "vs optax",
        "GB/s",
        "% of HBM",
        "XLA bytes accessed (x minimum)",
        "fusions",
        "copies",
    ]
    peak = PEAK_HBM.get(d.device_kind) if backend != "cpu" else None
    body = (
        f"Backend **{backend}**, device **{d.device_kind}** (peak HBM: "
        f"{f'{peak / 1e9:.0f} GB/s' if peak else 'n/a'}); {N_LEAVES} float32 leaves; 28 bytes "
        "per parameter counted (read params, grads, mu, nu; write params, mu, nu); a linear "
        "learning-rate schedule, weight decay 1e-2. *pipelined*: 10 calls per "
        "`block_until_ready` (a training loop); *blocked*: one.\n\n" + table(header, rows)
    )
    write_section(
        f"{backend}/optim_bandwidth",
        f"AdamW update vs memory bandwidth ({backend}, {d.device_kind})",
        body,
    )


if __name__ == "__main__":
    main_guard(run)
