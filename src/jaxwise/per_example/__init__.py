"""Per-example gradients, their norms and clipped sums — for any JAX loss, in bounded memory.

``loss(params, example)`` is the loss of ONE example; ``params`` is any pytree (plain
dicts, a Flax NNX/linen or Equinox model through the `jaxwise.models` adapters). The
batch is ONE argument, any pytree (a tuple ``(x, y)``, a dict, a registered dataclass)
whose leaves share a leading example axis; ``loss`` receives one example, that axis
removed. Everything here maps ``loss`` over that axis with ``in_axes=(None, 0)`` — never
the default ``in_axes=0``, which silently maps the parameters too when their leading
dimension happens to equal the batch size. Label-error ranking by gradient norm lives in
`jaxwise.label_errors` (`hardest_examples`, `find_label_errors` with
``Scoring(method="gradnorm")``).

Methods (``method=``):

- ``"ghost"``: the per-example program is traced once and every parameter
  use is classified (`ghost_coverage`): dense layers, convolutions and
  embedding lookups get their norms from activations and output gradients of
  ONE forward and ONE backward pass (Goodfellow 2015; ghost clipping, Li et
  al. 2022; mixed ghost clipping, Bu et al. 2023); biases, scales and any
  other use get exact per-example gradients for those leaves only. The
  clipped sum is book-keeping from the same pass.
- ``"vmap"``: materialise per-example gradients (``B × P`` memory, or
  ``chunk × P`` with ``chunk_size``); ``"chunked"``: the same, micro-batch by micro-batch in
  a ``lax.scan`` (each micro-batch's gradients kept, clipped and summed: one backward pass).
- ``"auto"`` (default): ghost or micro-batched per-example gradients, whichever a small
  per-backend cost table says is cheaper for the shapes (`clip_plan` says which and why).

References:
  Goodfellow, Efficient Per-Example Gradient Computations, 2015, arXiv:1510.01799;
  Li et al., Large Language Models Can Be Strong Differentially Private Learners,
  2022, arXiv:2110.05679; Bu et al., Differentially Private Optimization on Large
  Model at Small Cost, 2023, arXiv:2210.00038.

Examples:
    >>> import jax.numpy as jnp
    >>> loss = lambda w, example: (example["x"] @ w - example["y"]) ** 2
    >>> batch = {"x": jnp.eye(2), "y": jnp.zeros(2)}
    >>> per_example_grad_norms(loss, jnp.ones(2), batch).tolist()
    [2.0, 2.0]
"""

from jaxwise._shared._losses import LossFn as LossFn
from jaxwise.per_example._api import ClipPlan as ClipPlan
from jaxwise.per_example._api import clip_and_sum as clip_and_sum
from jaxwise.per_example._api import clip_plan as clip_plan
from jaxwise.per_example._api import ghost_coverage as ghost_coverage
from jaxwise.per_example._api import masked_clip_and_sum as masked_clip_and_sum
from jaxwise.per_example._api import per_example_grad_norms as per_example_grad_norms
from jaxwise.per_example._graph import CoverageRow as CoverageRow
from jaxwise.per_example._vmap import auto_chunk_size as auto_chunk_size
from jaxwise.per_example._vmap import per_example_grads as per_example_grads

__all__ = [
    "ClipPlan",
    "CoverageRow",
    "LossFn",
    "auto_chunk_size",
    "clip_and_sum",
    "clip_plan",
    "ghost_coverage",
    "masked_clip_and_sum",
    "per_example_grad_norms",
    "per_example_grads",
]
