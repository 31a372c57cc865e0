"""DP noise and the DP-SGD gradient (clip, sum, noise once, divide by the expected size)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from jaxwise._shared._checks import (
    check_array,
    check_float,
    check_key,
)
from jaxwise._shared._losses import (
    ChunkSize,
    Method,
    batch_size_of,
    check_clip_norm,
    check_loss,
    leaf_label,
)
from jaxwise._shared._random import draw_length, padded_length
from jaxwise._typing import Batch, Grads, ModelState, Params
from jaxwise.per_example import clip_and_sum, masked_clip_and_sum
from jaxwise.privacy._state import (
    NO_MODEL_STATE,
    advance,
    check_state_flags,
    dp_context,
    per_example,
)
from jaxwise.tree import path_names

__all__ = [
    "DPGradient",
    "add_dp_noise",
    "check_noise",
    "check_noise_scale",
    "dp_gradient_accumulated",
    "noise_step",
    "noisy_mean",
    "standard_normal",
]


def check_noise(noise_multiplier: Any) -> None:
    check_float(noise_multiplier, "noise_multiplier", min_value=0.0)


def check_noise_scale(clip_norm: Any, noise_multiplier: Any) -> None:
    """Noise std ``σ·C`` must be finite: ``C = inf`` (no clipping) only without noise."""
    if float(noise_multiplier) > 0 and float(clip_norm) == float("inf"):
        raise ValueError(
            "`clip_norm` must be finite when `noise_multiplier` > 0 (the noise std is "
            "noise_multiplier * clip_norm)"
        )


def add_dp_noise(
    summed: Grads, key: jax.Array, clip_norm: float, noise_multiplier: float, batch_size: ArrayLike
) -> Grads:
    """``(summed + N(0, σ²C²)) / batch_size``: ONE normal draw over all parameters.

    The noise for every leaf comes from a single ``jax.random.normal`` of the
    total parameter count, sliced per leaf (no per-leaf key splitting, one
    random-bits kernel); entries are independent across and within leaves.

    Args:
        summed: the sum of clipped per-example gradients (a pytree of float arrays).
        key: a PRNG key.
        clip_norm: ``C``, the per-example clipping norm.
        noise_multiplier: ``σ``: the noise std is ``σ·C``.
        batch_size: the denominator (the *expected* batch size under Poisson
            sampling, see the module notes).

    Returns:
        A pytree like ``summed``: ``(summed + noise) / batch_size``.

    Raises:
        TypeError: a bad ``key``, or a non-array or non-floating leaf of ``summed`` (named).
        ValueError: a bad ``clip_norm``, ``noise_multiplier`` or ``batch_size``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> add_dp_noise({"w": jnp.ones(3)}, jax.random.key(0), 1.0, 0.0, 2)["w"].tolist()
        [0.5, 0.5, 0.5]
    """
    check_clip_norm(clip_norm)
    check_noise(noise_multiplier)
    check_noise_scale(clip_norm, noise_multiplier)
    check_key(key)
    check_float(batch_size, "batch_size", min_value=0.0, min_inclusive=False, allow_traced=True)
    for path, leaf in zip(path_names(summed), jax.tree.leaves(summed)):
        check_array(leaf, "summed")
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
            raise TypeError(
                f"`summed` leaf `{path or '<root>'}` has dtype {jnp.result_type(leaf)}; "
                "Gaussian noise needs floating-point gradients (integer, boolean and complex "
                "leaves cannot hold it)"
            )
    std = (
        float(noise_multiplier) * float(clip_norm) if noise_multiplier else 0.0
    )  # σ = 0: none, even with C = inf
    noisy, _, _ = noise_step(summed, key, (), noise=None, std=std, noisy=bool(std))
    return noisy_mean(noisy, None, 0.0, batch_size)


def noise_step(
    summed: Any,
    key: jax.Array,
    state: Any,
    *,
    noise: Any,
    std: Any,
    noisy: bool = True,
    extra: int = 0,
) -> tuple[Any, Any, jax.Array | None]:
    """``(summed + std · noise, new mechanism state, extra normals)``: the one noising step.

    ONE `flat_normal` draw from ``key``: its first ``flat_size(summed)`` entries are the
    gradient's ``z`` (turned into the noise by ``noise.correlate``, sliced per leaf and cast
    to each leaf's dtype), the ``extra`` entries after them independent standard normals for
    a clip policy's own release (a second draw or a key split inside the step made XLA:CPU
    serialise the noise behind the gradient). ``noisy=False`` (``σ = 0``) adds no noise and
    leaves the state as it is.

    Args:
        summed: the sum of clipped per-example gradients (a pytree of float arrays).
        key: this step's key.
        state: the mechanism's state (``()`` for ``noise=None``).
        noise: a `NoiseMechanism`, or ``None`` (DP-SGD).
        std: ``σ·C`` (a float, or a traced scalar under an adaptive clip).
        noisy: add the gradient's noise (``False`` for ``σ = 0``).
        extra: how many further standard normals to draw (float32 ``(extra,)``).

    Returns:
        ``(noisy sum like summed, new state, (extra,) float32 normals or None)``.
    """
    if not noisy and not extra:
        return summed, state, None
    size = flat_size(summed) if noisy else 0
    flat = flat_normal(key, summed, extra=extra)
    normals = flat[size : size + extra].astype(jnp.float32) if extra else None
    if not noisy:
        return summed, state, normals
    z: Any = flat[:size]
    if noise is not None:
        z, state = noise.correlate(state, z)
    out = jax.tree.map(
        lambda x, n: x + (std * n).astype(x.dtype), summed, unflatten_like(z, summed)
    )
    return out, state, normals


def standard_normal(key: jax.Array, like: Any) -> Any:
    """``z``: a standard-normal tree like ``like``, ONE ``jax.random.normal`` sliced per leaf.

    The draw is `flat_normal`'s; each slice is cast to its leaf's dtype.
    """
    return unflatten_like(flat_normal(key, like), like)


def _draw_dtype(like: Any) -> Any:
    """The leaves' common dtype; float32 when they differ or there are none."""
    dtypes = {jnp.dtype(x.dtype) for x in jax.tree.leaves(like)}
    return dtypes.pop() if len(dtypes) == 1 else jnp.dtype(jnp.float32)


def flat_size(like: Any) -> int:
    """``P`` rounded up to a multiple of 8 (``P`` the entries of ``like``): the flat draw's size.

    Elementwise work on an odd length ran 2-3x slower on XLA:CPU (67,331 entries), so the
    noise mechanisms work on the padded vector; the padding is never read into a gradient.
    """
    return padded_length(sum(int(np.size(x)) for x in jax.tree.leaves(like)))


def flat_zeros(like: Any) -> jax.Array:
    """Zeros of the flat draw's shape ``(flat_size(like),)`` and dtype."""
    return jnp.zeros((flat_size(like),), _draw_dtype(like))


def flat_normal(key: jax.Array, like: Any, extra: int = 0) -> jax.Array:
    """ONE draw of standard normals: ``flat_size(like)`` for ``like``'s entries, then ``extra``.

    The draw has the leaves' common dtype (float32 when they differ or there are none); its
    first ``P`` entries are the same whatever ``extra`` is, and its length is
    ``draw_length(flat_size(like) + extra)`` (rounded up to a multiple of 8 on CPU).
    """
    size = draw_length(flat_size(like) + extra)
    return jax.random.normal(key, (size,), _draw_dtype(like))


def unflatten_like(flat: jax.Array, like: Any) -> Any:
    """The first entries of ``flat`` as a tree like ``like``, each cast to its leaf's dtype."""
    leaves, treedef = jax.tree.flatten(like)
    sizes = [int(np.size(x)) for x in leaves]
    offsets = np.cumsum([0, *sizes])
    z = [
        flat[a:b].reshape(x.shape).astype(x.dtype)
        for x, a, b in zip(leaves, offsets[:-1], offsets[1:])
    ]
    return jax.tree.unflatten(treedef, z)


def noisy_mean(summed: Any, noise: Any, std: Any, batch_size: Any) -> Any:
    """``(summed + std · noise) / batch_size`` leaf by leaf (``noise=None``: no noise)."""
    if noise is None:
        return jax.tree.map(lambda x: x / jnp.asarray(batch_size, x.dtype), summed)
    return jax.tree.map(
        lambda x, z: (x + (std * z).astype(x.dtype)) / jnp.asarray(batch_size, x.dtype),
        summed,
        noise,
    )


class DPGradient(NamedTuple):
    """What [`dp_gradient`][jaxwise.privacy.dp_gradient] and
    [`dp_gradient_accumulated`][jaxwise.privacy.dp_gradient_accumulated] return.

    Attributes:
        grads: the noisy mean gradient, a pytree like ``params``.
        norms: the pre-clip per-example norms, float32 ``(B,)`` (``(M, m)`` accumulated);
            0 for the masked-out (padding) rows of a ``mask``.
        model_state: the new model state, or ``None`` when none was given.
        state: ``{"noise": the mechanism's state, "clip": the clip policy's}`` after the step
            (pass it back as ``state=`` next step; ``()`` parts without them).
    """

    grads: Any
    norms: jax.Array
    model_state: Any = None
    state: Any = ()


def clipped_sum(
    loss: Callable[..., Any],
    params: Any,
    batch: Any,
    *,
    clip_norm: Any,
    method: Method,
    chunk_size: ChunkSize,
    mask: jax.Array | None,
    model_state: Any,
    freeze_model_state: bool,
) -> tuple[Any, jax.Array, Any]:
    """``(sum of clipped per-example gradients, norms (B,), new model state or None)``.

    The clipping of `dp_gradient` before its noise; ``model_state`` is `NO_MODEL_STATE`
    for a loss without one.
    """
    check_loss(loss)
    check_state_flags(freeze_model_state)
    n = batch_size_of(batch)
    weights = None if mask is None else jnp.asarray(mask).astype(jnp.float32)
    new_state = None
    with dp_context(freeze_model_state):
        if model_state is not NO_MODEL_STATE:
            new_state = advance(loss, params, model_state, batch)
            loss, batch = per_example(loss, model_state, batch, n)
        if weights is None:
            summed, norms = clip_and_sum(
                loss, params, batch, clip_norm=clip_norm, method=method, chunk_size=chunk_size
            )
        else:  # padding rows replaced once at the input; their norms (never released) are 0
            summed, norms = masked_clip_and_sum(
                loss,
                params,
                batch,
                clip_norm=clip_norm,
                method=method,
                chunk_size=chunk_size,
                weights=weights,
            )
    return summed, norms, new_state


def _scan_clipped(
    loss: Callable[..., Any],
    params: Any,
    microbatches: Any,
    weights: jax.Array,
    model_state: Any,
    options: dict[str, Any],
) -> tuple[Any, jax.Array]:
    """The clipped sums of every micro-batch, accumulated in a ``lax.scan``, and the norms."""
    m, inner = weights.shape

    def accumulate(total: Any, xs: tuple[Any, jax.Array, jax.Array]) -> tuple[Any, jax.Array]:
        micro, w, j = xs
        step_loss = loss
        if model_state is not NO_MODEL_STATE:
            step_loss, micro = per_example(loss, model_state, micro, inner, salt=j)
        summed, norms = masked_clip_and_sum(step_loss, params, micro, weights=w, **options)
        return jax.tree.map(jnp.add, total, summed), norms

    zero = jax.tree.map(jnp.zeros_like, params)
    xs = (microbatches, weights, jnp.arange(m, dtype=jnp.uint32))
    return jax.lax.scan(accumulate, zero, xs)


def _inner_size(microbatches: Any) -> int:
    """The micro-batch size ``m``: axis 1 of every leaf of ``microbatches`` ``(M, m, …)``."""
    sizes = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(microbatches)[0]:
        label = leaf_label("microbatches", path)
        if len(np.shape(leaf)) < 2:
            raise ValueError(
                f"`{label}` has shape {np.shape(leaf)}; every leaf of `microbatches` needs "
                "two leading axes (micro-batches, examples)"
            )
        sizes.append((label, int(np.shape(leaf)[1])))
    if len({s for _, s in sizes}) != 1:
        listing = ", ".join(f"{label}: {s}" for label, s in sizes)
        raise ValueError(
            f"every leaf of `microbatches` must share the micro-batch size (axis 1), got {listing}"
        )
    return sizes[0][1]


def dp_gradient_accumulated(
    loss: Callable[..., Any],
    params: Params,
    microbatches: Batch,
    key: jax.Array,
    *,
    clip_norm: float,
    noise_multiplier: float,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
    mask: jax.Array | None = None,
    expected_batch_size: float,
    model_state: ModelState = NO_MODEL_STATE,
    freeze_model_state: bool = False,
) -> DPGradient:
    """DP-SGD over a logical batch split into micro-batches: noise added ONCE.

    Every leaf of ``microbatches`` has shape ``(M, m, …)`` (M micro-batches of m
    examples); ``mask`` ``(M, m)`` marks real examples. The clipped sums of
    all micro-batches are accumulated in a ``lax.scan``, then one noise draw
    is added and the total divided by ``expected_batch_size``. Adding noise
    per micro-batch (a common bug) would multiply the noise variance by M.
    ``model_state`` and ``freeze_model_state`` are as in
    [`dp_gradient`][jaxwise.privacy.dp_gradient]: the state advances once per logical
    batch, and the keys of micro-batch ``j``'s example ``i`` get ``j·m + i`` folded in.

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example (with ``model_state``:
            ``loss(params, model_state, example) -> (scalar, new_model_state)``).
        params: the parameters, any pytree of float arrays.
        microbatches: any pytree whose leaves share two leading axes ``(M, m)``.
        key: PRNG key for the noise.
        clip_norm: ``C``, the per-example clipping norm.
        noise_multiplier: ``σ``: the noise std is ``σ·C``.
        method: as in [`clip_and_sum`][jaxwise.per_example.clip_and_sum].
        chunk_size: as in [`clip_and_sum`][jaxwise.per_example.clip_and_sum].
        mask: optional bool ``(M, m)``: real examples.
        expected_batch_size: the denominator (``q·N`` with Poisson sampling).
        model_state: the model's non-trainable state (omit it for a loss without one).
        freeze_model_state: run BatchNorm layers of adapted models in inference mode.

    Returns:
        A [`DPGradient`][jaxwise.privacy.DPGradient]: the noisy mean gradient, the norms
            ``(M, m)``, the new model state (``None`` without one) and the (empty) state.

    Raises:
        TypeError: a bad ``loss``, ``params``, ``microbatches``, ``key`` or
            ``freeze_model_state``.
        ValueError: leaves without two shared leading axes, a ``mask`` of another shape, or
            model state (or a layer) that mixes examples.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(w * x)
        >>> micro = jnp.asarray([[[3.0, 4.0]], [[0.0, 1.0]]])  # M = 2 micro-batches of 1
        >>> g, norms, _, _ = dp_gradient_accumulated(loss, jnp.ones(2), micro, jax.random.key(0),
        ...     clip_norm=1.0, noise_multiplier=0.0, expected_batch_size=2.0)
        >>> [round(v, 4) for v in g.tolist()], norms.tolist()
        ([0.3, 0.9], [[5.0], [1.0]])
    """
    check_loss(loss)
    check_state_flags(freeze_model_state)
    m = batch_size_of(microbatches, "microbatches")
    inner = _inner_size(microbatches)
    weights = (
        jnp.ones((m, inner), jnp.float32) if mask is None else jnp.asarray(mask).astype(jnp.float32)
    )
    if weights.shape != (m, inner):
        raise ValueError(f"`mask` must have shape ({m}, {inner}), got {weights.shape}")
    with dp_context(freeze_model_state):
        new_state = None
        if model_state is not NO_MODEL_STATE:
            first = jax.tree.map(lambda x: x[0], microbatches)
            new_state = advance(loss, params, model_state, first)
        options = dict(clip_norm=clip_norm, method=method, chunk_size=chunk_size)
        total, norms = _scan_clipped(loss, params, microbatches, weights, model_state, options)
    noisy = add_dp_noise(total, key, clip_norm, noise_multiplier, expected_batch_size)
    return DPGradient(noisy, norms, new_state, {"noise": (), "clip": ()})
