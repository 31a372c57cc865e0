"""Hard examples and label errors from per-example gradient norms of a trained model."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_int
from jaxwise._shared._losses import ChunkSize, LossFn, Method, batch_size_of
from jaxwise.label_errors._confident import LabelIssues
from jaxwise.per_example import per_example_grad_norms

__all__ = ["hardest_examples"]


def hardest_examples(
    loss: LossFn,
    params: Any,
    batch: Any,
    *,
    k: int,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
) -> tuple[jax.Array, jax.Array]:
    """The ``k`` examples with the largest gradient norm: ``(indices, norms)``, largest first.

    After training, a correctly labeled example is fitted (small gradient); one whose label
    contradicts its neighbours keeps a large gradient.

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example.
        params: the (trained) parameters, any pytree of float arrays.
        batch: the examples, any pytree whose leaves share a leading example axis ``B``.
        k: how many examples, in ``[1, B]``.
        method: as in [`per_example_grad_norms`][jaxwise.per_example.per_example_grad_norms].
        chunk_size: as in [`per_example_grad_norms`][jaxwise.per_example.per_example_grad_norms].

    Returns:
        ``(indices (k,) int32, norms (k,))``, the largest norm first.

    Raises:
        TypeError: ``k`` is not an int, or as in `per_example_grad_norms`.
        ValueError: ``k`` outside ``[1, B]``, or as in `per_example_grad_norms`.

    Examples:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(w * x)
        >>> x = jnp.asarray([[1.0, 0], [5.0, 0], [2.0, 0]])
        >>> idx, norms = hardest_examples(loss, jnp.ones(2), x, k=2)
        >>> idx.tolist(), norms.tolist()
        ([1, 2], [5.0, 2.0])
    """
    n = batch_size_of(batch)
    check_int(k, "k", min_value=1, max_value=n)
    norms = per_example_grad_norms(loss, params, batch, method=method, chunk_size=chunk_size)
    top, idx = jax.lax.top_k(norms, int(k))
    return idx, top


@dataclasses.dataclass(frozen=True)
class _ExampleNll:
    """``loss(params, (x, y))``: cross-entropy of ONE example under a batched ``apply_fn``."""

    apply_fn: Callable[[Any, jax.Array], jax.Array]

    def __call__(self, params: Any, example: tuple[jax.Array, jax.Array]) -> jax.Array:
        x, y = example
        logits = self.apply_fn(params, x[None])[0]
        return -jax.nn.log_softmax(logits.astype(jnp.float32))[y]


def gradnorm_issues(
    apply_fn: Callable[[Any, jax.Array], jax.Array], params: Any, x: Any, y: np.ndarray
) -> LabelIssues:
    """Every row ranked by the trained model's per-example gradient norm, largest first.

    ``score`` is minus the gradient norm (lower is more suspicious, as for confident
    learning); confident learning flags nothing here (``flagged`` all False, ``num_issues``
    0).
    """
    xj, yj = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32)
    norms = np.asarray(per_example_grad_norms(_ExampleNll(apply_fn), params, (xj, yj)))
    probs = np.asarray(jax.nn.softmax(apply_fn(params, xj).astype(jnp.float32), -1), np.float64)
    probs = probs / probs.sum(axis=1, keepdims=True)
    order = np.argsort(-norms, kind="stable")
    rows = np.arange(len(y))
    others = probs.copy()
    others[rows, y] = -np.inf
    return LabelIssues(
        order,
        -norms.astype(np.float64)[order],
        probs[rows, y][order],
        np.argmax(others, axis=1)[order],
        np.zeros(len(y), bool),
        0,
        probs,
        "gradnorm",
    )
