"""XLA cost analysis of ghost clipping vs a non-private gradient at mid sizes (no timing).

For the models of ``bench_dp_scale.py`` at three CPU-sized configurations: FLOPs, bytes
accessed and compiled memory (temp + argument + output) of ``clip_and_sum(...,
method="ghost")`` and of ``dp_gradient(..., method="ghost")`` (with its noise draw), each as a
ratio to the jitted non-private gradient. Machine-independent; run it against two source trees
(``PYTHONPATH=<tree>/src``) for a before/after comparison.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from bench_dp_scale import Config, _cost, _memory, init, make_batch, make_loss

from jaxwise.per_example import clip_and_sum
from jaxwise.privacy import dp_gradient

CONFIGS = [
    Config("classifier L2 d128 H4 T64", 2, 128, 4, 64, 1024, False, (16,)),
    Config("causal LM L2 d128 H4 T128 V4096", 2, 128, 4, 128, 4096, True, (8,)),
    Config("causal LM L2 d256 H4 T32 V1024", 2, 256, 4, 32, 1024, True, (16,)),
]


def _analyse(fn, *args):
    compiled = jax.jit(fn).lower(*args).compile()
    cost = _cost(compiled)
    memory = _memory(compiled)
    assert memory is not None
    return cost["flops"], cost["bytes accessed"], memory


def main() -> None:
    print("| model | B | program | FLOPs | bytes accessed | memory |")
    print("|---|---|---|---|---|---|")
    for cfg in CONFIGS:
        b = cfg.batches[0]
        params, batch = init(cfg, jax.random.key(0)), make_batch(cfg, b, jax.random.key(1))
        key, loss = jax.random.key(2), make_loss(cfg)

        def non_private(p, bt, k, loss=loss):
            del k
            return jax.grad(lambda p: jnp.mean(jax.vmap(loss, in_axes=(None, 0))(p, bt)))(p)

        def ghost_sum(p, bt, k, loss=loss):
            del k
            return clip_and_sum(loss, p, bt, clip_norm=1.0, method="ghost")

        def ghost_dp(p, bt, k, loss=loss):
            return dp_gradient(loss, p, bt, k, clip_norm=1.0, noise_multiplier=1.0, method="ghost")

        f0, b0, m0 = _analyse(non_private, params, batch, key)
        for name, fn in (("clip_and_sum ghost", ghost_sum), ("dp_gradient ghost", ghost_dp)):
            f, by, m = _analyse(fn, params, batch, key)
            print(f"| {cfg.name} | {b} | {name} | {f / f0:.2f}× | {by / b0:.2f}× | {m / m0:.2f}× |")


if __name__ == "__main__":
    main()
