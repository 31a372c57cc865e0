"""Per-example gradients, their norms and clipped sums — in bounded memory.

``loss_single(params, *example)`` is the loss of ONE example (unbatched
arrays). Everything here maps it over the leading axis of the batch arrays
with ``in_axes=(None, 0, …)`` — never the default ``in_axes=0``, which
silently maps the parameters too when their leading dimension happens to
equal the batch size.

Memory: a per-example gradient is as large as the model, so ``B`` of them
take ``B × P`` floats (20 GB for 10M parameters at B = 512). With
``chunk_size`` the batch is processed ``chunk`` examples at a time inside
one ``lax.scan`` (padded and masked when ``B`` is not a multiple), so peak
temporary memory is ``O(chunk × P)``. For dense-layer models,
``method="ghost"`` computes the norms without materialising per-example
gradients at all (Goodfellow, 2015): for a layer with input ``a_i`` and
output gradient ``g_i``, ``‖∇W‖² = ‖a_i‖² ‖g_i‖²`` and ``‖∇b‖² = ‖g_i‖²``.

References:
  Goodfellow, Efficient Per-Example Gradient Computations, 2015,
  https://arxiv.org/abs/1510.01799

Example:
    >>> import jax.numpy as jnp
    >>> loss = lambda w, x, y: (x @ w - y) ** 2
    >>> per_example_grad_norms(loss, jnp.ones(2), jnp.eye(2), jnp.zeros(2)).tolist()
    [2.0, 2.0]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise.models import mlp_layers
from jaxwise.optim import global_norm
from jaxwise.tree import path_names

__all__ = [
    "DenseLoss",
    "LabelErrors",
    "auto_chunk_size",
    "clip_and_sum",
    "find_label_errors",
    "hardest_examples",
    "mlp_loss",
    "per_example_grad_norms",
    "per_example_grads",
]

LossSingle = Callable[..., jax.Array]


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


def batch_size_of(batch: tuple[Any, ...], name: str = "batch") -> int:
    """The shared leading size of the batch arrays (ValueError naming any mismatch)."""
    if not batch:
        raise ValueError(f"`{name}` is empty: pass the per-example arrays (e.g. x, y)")
    sizes = []
    for i, arg in enumerate(batch):
        for path, leaf in zip(path_names(arg), jax.tree.leaves(arg)):
            shape = jnp.shape(leaf)
            label = f"{name}[{i}]" + (f".{path}" if path else "")
            if len(shape) == 0:
                raise ValueError(f"`{label}` is a scalar; every batch array needs a leading example axis")
            sizes.append((label, shape[0]))
    if not sizes:
        raise ValueError(f"`{name}` has no arrays")
    if len({s for _, s in sizes}) != 1:
        listing = ", ".join(f"`{label}`: {s}" for label, s in sizes)
        raise ValueError(f"batch arrays must share their leading (example) dimension, got {listing}")
    return sizes[0][1]


def _check_chunk(chunk_size: Any) -> None:
    if chunk_size is None or chunk_size == "auto":
        return
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"`chunk_size` must be a positive int, 'auto' or None, got {chunk_size!r}")


def _check_loss(loss_single: Any) -> None:
    if not callable(loss_single):
        raise TypeError(f"`loss_single` must be callable (params, *example) -> scalar, got {type(loss_single).__name__}")


def check_clip_norm(clip_norm: Any) -> None:
    """``clip_norm`` must be a positive number (``inf`` allowed: no clipping)."""
    if isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float, np.floating)) or not clip_norm > 0:
        raise ValueError(f"`clip_norm` must be a number > 0, got {clip_norm!r}")


# --------------------------------------------------------------------------
# The vmap path
# --------------------------------------------------------------------------


def per_example_grads(loss_single: LossSingle, params: Any, *batch: Any) -> Any:
    """Gradients of every example: a pytree like ``params`` with a leading batch axis.

    ``vmap(grad(loss_single), in_axes=(None, 0, …))``: the parameters are
    shared, only the batch is mapped. Memory ``B × P``; see
    :func:`per_example_grad_norms` and :func:`clip_and_sum` for chunked paths.

    Example:
        >>> import jax.numpy as jnp
        >>> g = per_example_grads(lambda w, x: jnp.sum(w * x), jnp.ones(2), jnp.asarray([[1.0, 2.0], [3.0, 4.0]]))
        >>> g.tolist()
        [[1.0, 2.0], [3.0, 4.0]]
    """
    _check_loss(loss_single)
    batch_size_of(batch)
    return jax.vmap(jax.grad(loss_single), in_axes=(None, *([0] * len(batch))))(params, *batch)


def _norm_single(loss_single: LossSingle) -> Callable[..., jax.Array]:
    def norm(params: Any, *example: Any) -> jax.Array:
        return global_norm(jax.grad(loss_single)(params, *example))

    return norm


def _clip_factor(norms: jax.Array, clip_norm: float) -> jax.Array:
    """``min(1, C / ‖g‖)`` with 1 for ``‖g‖ = 0`` (and for ``C = inf``)."""
    safe = jnp.where(norms > 0, norms, 1.0)
    return jnp.where(norms > clip_norm, clip_norm / safe, 1.0)


def _clipped_sum_chunk(loss_single: LossSingle, params: Any, batch: tuple, weights: jax.Array,
                       clip_norm: float) -> tuple[Any, jax.Array]:
    """Clipped sum of one chunk: norms by ``vmap`` (fused, nothing kept), then ONE weighted backward pass.

    ``Σ_i f_i ∇L_i = ∇(Σ_i f_i L_i)`` with the factors ``f_i`` held constant,
    so the per-example gradients are never stored for the sum.
    """
    axes = (None, *([0] * len(batch)))
    norms = jax.vmap(_norm_single(loss_single), in_axes=axes)(params, *batch)
    factor = jax.lax.stop_gradient(_clip_factor(norms, clip_norm) * weights)

    def weighted(p: Any) -> jax.Array:
        return jnp.sum(jax.vmap(loss_single, in_axes=axes)(p, *batch) * factor)

    return jax.grad(weighted)(params), norms


# --------------------------------------------------------------------------
# Chunking: pad to a multiple, scan over chunks
# --------------------------------------------------------------------------


def _chunked(batch: tuple, chunk: int) -> tuple[tuple, jax.Array, int]:
    """Batch reshaped to ``(n_chunks, chunk, …)`` (padded with example 0) and the real-example mask."""
    n = batch_size_of(batch)
    n_chunks = -(-n // chunk)
    pad = n_chunks * chunk - n

    def reshape(x: jax.Array) -> jax.Array:
        if pad:
            x = jnp.concatenate([x, jnp.broadcast_to(x[:1], (pad, *x.shape[1:]))], axis=0)
        return x.reshape(n_chunks, chunk, *x.shape[1:])

    mask = (jnp.arange(n_chunks * chunk) < n).reshape(n_chunks, chunk)
    return jax.tree.map(reshape, batch), mask, n


def per_example_grad_norms(
    loss_single: LossSingle,
    params: Any,
    *batch: Any,
    chunk_size: int | str | None = None,
    method: str = "vmap",
    memory_budget: int = 256 * 2**20,
) -> jax.Array:
    """Global L2 norm of every example's gradient, shape ``(B,)``.

    Args:
      loss_single: ``loss_single(params, *example) -> scalar``.
      params: shared parameters.
      *batch: arrays with a leading example axis (any ``B``).
      chunk_size: ``None`` (all at once, ``B × P`` memory), an int (at most
        ``chunk × P`` at a time; ``B`` need not be a multiple), or
        ``"auto"`` (the largest power-of-two chunk whose compiled temporary
        memory fits ``memory_budget`` bytes, see :func:`auto_chunk_size`).
      method: ``"vmap"``, or ``"ghost"`` for losses built with
        :func:`mlp_loss` (no per-example gradients materialised).

    Example:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(w * x)
        >>> x = jnp.asarray([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0]])
        >>> per_example_grad_norms(loss, jnp.ones(2), x, chunk_size=2).tolist()
        [5.0, 1.0, 10.0]
    """
    _check_loss(loss_single)
    _check_chunk(chunk_size)
    n = batch_size_of(batch)
    if method == "ghost":
        return _ghost(loss_single).norms(params, *batch)
    if method != "vmap":
        raise ValueError(f"`method` must be 'vmap' or 'ghost', got {method!r}")
    norm = _norm_single(loss_single)
    if chunk_size == "auto":
        chunk_size = auto_chunk_size(loss_single, params, *batch, memory_budget=memory_budget)
    if chunk_size is None or chunk_size >= n:
        return jax.vmap(norm, in_axes=(None, *([0] * len(batch))))(params, *batch)
    chunks, _, n = _chunked(batch, chunk_size)

    def one_chunk(_: None, chunk: tuple) -> tuple[None, jax.Array]:
        return None, jax.vmap(norm, in_axes=(None, *([0] * len(batch))))(params, *chunk)

    _, norms = jax.lax.scan(one_chunk, None, chunks)
    return norms.reshape(-1)[:n]


def clip_and_sum(
    loss_single: LossSingle,
    params: Any,
    *batch: Any,
    clip_norm: float,
    chunk_size: int | str | None = None,
    method: str = "vmap",
    weights: jax.Array | None = None,
    memory_budget: int = 256 * 2**20,
) -> tuple[Any, jax.Array]:
    """Sum over examples of gradients clipped to norm ``clip_norm``, and the pre-clip norms.

    ``Σ_i w_i · g_i · min(1, C / ‖g_i‖)`` where ``w_i`` are optional
    per-example ``weights`` (e.g. a 0/1 mask of real examples in a padded
    Poisson batch). Whole-batch, chunked and ghost paths give the same
    result.

    Returns:
      ``(summed, norms)``: a pytree like ``params`` and ``(B,)`` norms.

    Example:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(w * x)
        >>> summed, norms = clip_and_sum(loss, jnp.ones(2), jnp.asarray([[3.0, 4.0], [0.0, 0.5]]), clip_norm=1.0)
        >>> [round(v, 4) for v in summed.tolist()], norms.tolist()
        ([0.6, 1.3], [5.0, 0.5])
    """
    _check_loss(loss_single)
    _check_chunk(chunk_size)
    check_clip_norm(clip_norm)
    n = batch_size_of(batch)
    w = jnp.ones((n,), jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
    if w.shape != (n,):
        raise ValueError(f"`weights` must have shape ({n},), got {w.shape}")
    if method == "ghost":
        return _ghost(loss_single).clip_and_sum(params, *batch, clip_norm=clip_norm, weights=w)
    if method != "vmap":
        raise ValueError(f"`method` must be 'vmap' or 'ghost', got {method!r}")
    if chunk_size == "auto":
        chunk_size = auto_chunk_size(loss_single, params, *batch, memory_budget=memory_budget)
    if chunk_size is None or chunk_size >= n:
        return _clipped_sum_chunk(loss_single, params, batch, w, clip_norm)
    chunks, mask, n = _chunked(batch, chunk_size)
    chunk_weights = jnp.where(mask, jnp.concatenate([w, jnp.zeros((mask.size - n,), w.dtype)]).reshape(mask.shape), 0.0)
    zero = jax.tree.map(jnp.zeros_like, params)

    def one_chunk(total: Any, xs: tuple) -> tuple[Any, jax.Array]:
        chunk, cw = xs
        summed, norms = _clipped_sum_chunk(loss_single, params, chunk, cw, clip_norm)
        return jax.tree.map(jnp.add, total, summed), norms

    total, norms = jax.lax.scan(one_chunk, zero, (chunks, chunk_weights))
    return total, norms.reshape(-1)[:n]


def auto_chunk_size(loss_single: LossSingle, params: Any, *batch: Any, memory_budget: int = 256 * 2**20) -> int:
    """The largest power-of-two chunk whose compiled temporary memory fits ``memory_budget`` bytes.

    Compiles the chunked norm computation for candidate chunk sizes
    (``jit(...).lower(...).compile().memory_analysis().temp_size_in_bytes``,
    binary search, a few compilations) — do it once per model and batch
    shape, not per step. Returns at least 1.

    Example:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(jnp.tanh(x @ w))
        >>> auto_chunk_size(loss, jnp.ones((256, 256)), jnp.ones((64, 256)), memory_budget=2**22) < 64
        True
    """
    n = batch_size_of(batch)
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget <= 0:
        raise ValueError(f"`memory_budget` must be a positive number of bytes, got {memory_budget!r}")
    spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), (params, batch))

    def temp_bytes(chunk: int) -> int:
        fn = jax.jit(lambda p, b: per_example_grad_norms(loss_single, p, *b, chunk_size=chunk))
        return int(fn.lower(*spec).compile().memory_analysis().temp_size_in_bytes)

    candidates = [1 << k for k in range(int(np.log2(n)) + 1)]
    if candidates[-1] != n:
        candidates.append(n)
    lo, hi = 0, len(candidates) - 1  # invariant: candidates[lo] fits or lo == 0
    if temp_bytes(candidates[hi]) <= memory_budget:
        return candidates[hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if temp_bytes(candidates[mid]) <= memory_budget:
            lo = mid
        else:
            hi = mid
    return candidates[lo]


# --------------------------------------------------------------------------
# Ghost norms for dense-layer models
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DenseLoss:
    """The per-example loss of a :mod:`jaxwise.models` MLP, with a ghost-norm fast path.

    Calling it is ``loss_from_logits(mlp_apply(params, x), y)`` for ONE
    example, so it works everywhere a ``loss_single`` does; ``method="ghost"``
    additionally uses its structure.
    """

    loss_from_logits: Callable[[jax.Array, jax.Array], jax.Array]

    def __call__(self, params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        logits, _ = self._forward(params, x)
        return self.loss_from_logits(logits, y)

    @staticmethod
    def _forward(params: Any, x: jax.Array, eps: list[jax.Array] | None = None) -> tuple[jax.Array, list[jax.Array]]:
        """Logits and the input of every layer; ``eps[l]`` is added to layer l's output."""
        layers = mlp_layers(params)
        inputs = []
        for i, layer in enumerate(layers):
            inputs.append(x)
            z = x @ layer["w"] + layer["b"]
            if eps is not None:
                z = z + eps[i]
            x = jax.nn.relu(z) if i < len(layers) - 1 else z
        return x, inputs

    def _output_grads(self, params: Any, x: jax.Array, y: jax.Array, weights: jax.Array | None = None
                      ) -> tuple[list[jax.Array], list[jax.Array], jax.Array]:
        """Per-example gradients w.r.t. each layer's output (one batched backward pass)."""
        layers = mlp_layers(params)
        eps = [jnp.zeros((x.shape[0], layer["w"].shape[1]), x.dtype) for layer in layers]

        def total(eps: list[jax.Array]) -> tuple[jax.Array, tuple]:
            logits, inputs = self._forward(params, x, eps)
            losses = jax.vmap(self.loss_from_logits)(logits, y)
            return jnp.sum(losses if weights is None else losses * weights), (inputs, losses)

        grads, (inputs, losses) = jax.grad(total, has_aux=True)(eps)
        return grads, inputs, losses

    @staticmethod
    def _sq_norms(inputs: list[jax.Array], grads: list[jax.Array]) -> jax.Array:
        return sum(
            jnp.sum(jnp.square(a), axis=1) * jnp.sum(jnp.square(g), axis=1) + jnp.sum(jnp.square(g), axis=1)
            for a, g in zip(inputs, grads)
        )

    def norms(self, params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        """Per-example gradient norms without per-example gradients: ``(B,)``."""
        grads, inputs, _ = self._output_grads(params, x, y)
        return jnp.sqrt(self._sq_norms(inputs, grads))

    def clip_and_sum(self, params: Any, x: jax.Array, y: jax.Array, *, clip_norm: float,
                     weights: jax.Array) -> tuple[Any, jax.Array]:
        """Clipped gradient sum from the same pass: ``∇W = Aᵀ diag(f) G``, ``∇b = Gᵀ f`` per layer."""
        grads, inputs, _ = self._output_grads(params, x, y)
        norms = jnp.sqrt(self._sq_norms(inputs, grads))
        factor = _clip_factor(norms, clip_norm) * weights
        summed = {}
        for i, (a, g) in enumerate(zip(inputs, grads)):
            scaled = g * factor[:, None].astype(g.dtype)
            summed[f"dense_{i}"] = {"w": a.T @ scaled, "b": jnp.sum(scaled, axis=0)}
        return summed, norms


def mlp_loss(loss_from_logits: Callable[[jax.Array, jax.Array], jax.Array]) -> DenseLoss:
    """A per-example MLP loss usable with ``method="ghost"``.

    Args:
      loss_from_logits: ``(logits (C,), label ()) -> scalar`` for one example,
        e.g. ``lambda z, y: -jax.nn.log_softmax(z)[y]``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxwise.models import init_mlp
        >>> loss = mlp_loss(lambda z, y: -jax.nn.log_softmax(z)[y])
        >>> p, x, y = init_mlp(0, (2, 8, 3)), jnp.ones((4, 2)), jnp.zeros(4, jnp.int32)
        >>> bool(jnp.allclose(per_example_grad_norms(loss, p, x, y, method="ghost"),
        ...                   per_example_grad_norms(loss, p, x, y), rtol=1e-5))
        True
    """
    if not callable(loss_from_logits):
        raise TypeError(f"`loss_from_logits` must be callable, got {type(loss_from_logits).__name__}")
    return DenseLoss(loss_from_logits)


def _ghost(loss_single: LossSingle) -> DenseLoss:
    if not isinstance(loss_single, DenseLoss):
        raise ValueError(
            "method='ghost' needs a loss built with jaxwise.per_example.mlp_loss(...) (a dense-layer model "
            "whose structure is known); use method='vmap' for any other loss"
        )
    return loss_single


# --------------------------------------------------------------------------
# Hard examples and label errors
# --------------------------------------------------------------------------


def hardest_examples(
    loss_single: LossSingle, params: Any, *batch: Any, k: int, chunk_size: int | str | None = None,
    method: str = "vmap",
) -> tuple[jax.Array, jax.Array]:
    """The ``k`` examples with the largest gradient norm: ``(indices, norms)``, largest first.

    Example:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(w * x)
        >>> idx, norms = hardest_examples(loss, jnp.ones(2), jnp.asarray([[1.0, 0], [5.0, 0], [2.0, 0]]), k=2)
        >>> idx.tolist(), norms.tolist()
        ([1, 2], [5.0, 2.0])
    """
    n = batch_size_of(batch)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"`k` must be an int in [1, {n}], got {k!r}")
    norms = per_example_grad_norms(loss_single, params, *batch, chunk_size=chunk_size, method=method)
    top, idx = jax.lax.top_k(norms, k)
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
    loss_single: LossSingle, params: Any, *batch: Any, k: int, chunk_size: int | str | None = None,
    method: str = "vmap",
) -> LabelErrors:
    """Rank examples of a *trained* model by gradient norm: mislabeled ones stand out.

    After training, a correctly labeled example is fitted (small gradient);
    one whose label contradicts its neighbours keeps a large gradient.

    Example:
        >>> import jax.numpy as jnp
        >>> loss = lambda w, x, y: (x @ w - y) ** 2
        >>> x, y = jnp.eye(3), jnp.asarray([1.0, 1.0, -5.0])
        >>> find_label_errors(loss, jnp.ones(3), x, y, k=1).indices.tolist()
        [2]
    """
    idx, norms = hardest_examples(loss_single, params, *batch, k=k, chunk_size=chunk_size, method=method)
    picked = tuple(jax.tree.map(lambda a: jnp.take(a, idx, axis=0), arg) for arg in batch)
    losses = jax.vmap(loss_single, in_axes=(None, *([0] * len(batch))))(params, *picked)
    return LabelErrors(np.asarray(idx), np.asarray(norms), np.asarray(losses))
