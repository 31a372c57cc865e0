"""The AdamW step the bandwidth benchmark times reads and writes each array once, in place.

``benchmarks/bench_optim_bandwidth.py`` found (TPU v5e) that Optax's AdamW, and so jaxwise's,
already compiles to one multi-output fusion per leaf: the remaining way to lose bandwidth is
a copy. Donated, the step must alias params, mu and nu onto its outputs and need no
parameter-sized temporary; its numbers are Optax's to the bit.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwise import optim
from jaxwise.compilation import CompileBudget


def _step(tx):
    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


def _params():
    rng = np.random.default_rng(0)
    sizes = [1000 + 37 * i for i in range(20)]
    return {f"l{i:02d}": jnp.asarray(rng.normal(size=n), jnp.float32) for i, n in enumerate(sizes)}


@jax.numpy_dtype_promotion("standard")  # Optax's own schedule and adamw, the peer
def test_donated_adamw_step_is_in_place_and_optax_to_the_bit():
    params = _params()
    grads = jax.tree.map(lambda p: 1e-3 * jnp.cos(p), params)
    schedule = optax.linear_schedule(1e-3, 1e-4, 100)
    ours = optim.adamw(schedule, weight_decay=1e-2, mask=r"l0")
    peer = optax.adamw(schedule, weight_decay=1e-2, mask={k: "l0" in k for k in params})
    assert jax.tree.structure(ours.init(params)) == jax.tree.structure(peer.init(params))
    step, peer_step = _step(ours), _step(peer)
    p_ours, s_ours = jax.tree.map(jnp.copy, params), ours.init(params)
    p_peer, s_peer = jax.tree.map(jnp.copy, params), peer.init(params)
    with CompileBudget(1, step, exact=True):  # the analysis' compile is the calls' one
        stats = step.lower(p_ours, s_ours, grads).compile().memory_analysis()
        for _ in range(4):
            p_ours, s_ours = step(p_ours, s_ours, grads)
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    assert stats is not None
    assert stats.alias_size_in_bytes >= 3 * param_bytes  # params, mu, nu updated in place
    assert stats.temp_size_in_bytes < min(x.nbytes for x in jax.tree.leaves(params))
    for _ in range(4):
        p_peer, s_peer = peer_step(p_peer, s_peer, grads)
    for a, b in zip(jax.tree.leaves((p_ours, s_ours)), jax.tree.leaves((p_peer, s_peer))):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
