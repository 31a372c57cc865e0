"""Hard examples and suspected label errors from per-example gradient norms."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._checks import check_int
from jaxwise.per_example._api import per_example_grad_norms
from jaxwise.per_example._common import ChunkSize, LossFn, Method, batch_size_of


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
class LabelErrors:
    """Suspected label errors, most suspicious first.

    Attributes:
      indices: ``(k,)`` row indices into the batch.
      grad_norms: their per-example gradient norms.
      losses: their per-example losses.
    """

    indices: np.ndarray
    grad_norms: np.ndarray
    losses: np.ndarray


def find_label_errors(
    loss: LossFn,
    params: Any,
    batch: Any,
    *,
    k: int,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
) -> LabelErrors:
    """Rank examples of a *trained* model by gradient norm: mislabeled ones stand out.

    After training, a correctly labeled example is fitted (small gradient);
    one whose label contradicts its neighbours keeps a large gradient.

    Examples:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, xy: (xy[0] @ w - xy[1]) ** 2
        >>> x, y = jnp.eye(3), jnp.asarray([1.0, 1.0, -5.0])
        >>> find_label_errors(loss, jnp.ones(3), (x, y), k=1).indices.tolist()
        [2]
    """
    idx, norms = hardest_examples(loss, params, batch, k=k, method=method, chunk_size=chunk_size)
    picked = jax.tree.map(lambda a: jnp.take(a, idx, axis=0), batch)
    losses = jax.vmap(loss, in_axes=(None, 0))(params, picked)
    return LabelErrors(np.asarray(idx), np.asarray(norms), np.asarray(losses))
