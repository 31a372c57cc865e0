"""A training loop over variable-length batches that compiles a bounded number of times.

Without bucketing every new sequence length is a new program; with `plan_buckets` the lengths
are padded to a few boundaries chosen to waste the least padding, and `CompileBudget` turns
"it compiles at most once per bucket" into an assertion with the reason for every compile.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise.buckets import pad_to_bucket, padding_waste, plan_buckets
from jaxwise.compilation import CompileBudget, CompileCounter

rng = np.random.default_rng(0)
lengths = rng.integers(5, 120, size=200)  # 200 batches, lengths 5..119
batches = [rng.normal(size=(int(n), 16)).astype(np.float32) for n in lengths]


def make_step():
    """A jitted masked least-squares gradient step on a (length, 16) batch."""

    def step(w, x, mask):
        def loss(w):
            err = jnp.where(mask[:, None], x @ w - 1.0, 0.0)
            return jnp.sum(err**2) / jnp.maximum(jnp.sum(mask), 1)

        return w - 0.01 * jax.grad(loss)(w)

    return jax.jit(step)


# Two separate functions: JAX shares compiled programs between jits of the same function.
naive_step, bucketed_step = make_step(), make_step()

w = jnp.zeros((16, 1), jnp.float32)
with CompileCounter(naive_step) as naive:
    for x in batches[:40]:
        w = naive_step(w, x, np.ones(len(x), bool))
print(f"unpadded: {naive.count} compiles for 40 batches")

buckets = plan_buckets(lengths, max_buckets=6)
total, share = padding_waste(lengths, buckets)
print(f"buckets {buckets}: padding {share:.1%} of the padded elements")

with CompileBudget(len(buckets), bucketed_step, exact=True) as budget:  # one per bucket, exactly
    for x in batches:
        padded, mask = pad_to_bucket(x, buckets)
        w = bucketed_step(w, padded, mask)
print(f"bucketed: {budget.count} compiles for {len(batches)} batches (one per bucket)")
