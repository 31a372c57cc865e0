"""GRU and LSTM cells and the masked ``lax.scan`` runner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_callable, check_int, check_key
from jaxwise.sequence._common import Array, ArrayLike, as_array

P = TypeVar("P")
C = TypeVar("C")

__all__ = ["gru_cell", "init_gru", "init_lstm", "lstm_cell", "run_bidirectional", "run_rnn"]


def _glorot(key: Array, shape: tuple[int, int]) -> Array:
    limit = np.sqrt(6.0 / sum(shape))
    return jax.random.uniform(key, shape, jnp.float32, -limit, limit)


def _init_key(key: Any, input_dim: Any, hidden_dim: Any) -> Any:
    check_int(input_dim, "input_dim", min_value=1)
    check_int(hidden_dim, "hidden_dim", min_value=1)
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return jax.random.key(int(key))
    check_key(key)
    return key


def init_gru(key: Array | int, input_dim: int, hidden_dim: int) -> dict[str, Array]:
    """GRU parameters ``w (D, 3H)``, ``u_zr (H, 2H)``, ``u_h (H, H)``, ``b (3H,)``; gates z, r, h.

    Glorot-uniform weights, zero biases, all float32.

    Args:
        key: a PRNG key, or an int seed.
        input_dim: ``D``, the input size, >= 1.
        hidden_dim: ``H``, the state size, >= 1.

    Returns:
        ``{"b", "u_h", "u_zr", "w"}``, float32 arrays of the shapes above.

    Raises:
        TypeError: ``key`` is not a key or int, or a size is not an int.
        ValueError: a size is < 1.

    Examples:
        >>> {k: v.shape for k, v in init_gru(0, 3, 4).items()}
        {'b': (12,), 'u_h': (4, 4), 'u_zr': (4, 8), 'w': (3, 12)}
    """
    key = _init_key(key, input_dim, hidden_dim)
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "b": jnp.zeros((3 * hidden_dim,), jnp.float32),
        "u_h": _glorot(k3, (hidden_dim, hidden_dim)),
        "u_zr": _glorot(k2, (hidden_dim, 2 * hidden_dim)),
        "w": _glorot(k1, (input_dim, 3 * hidden_dim)),
    }


def gru_cell(params: dict[str, Array], h: Array, x: Array) -> tuple[Array, Array]:
    """One GRU step (Cho et al., 2014): ``h' = (1 − z) ⊙ h + z ⊙ ĥ``; returns ``(h', h')``.

    ``z = σ(x W_z + h U_z + b_z)``, ``r = σ(x W_r + h U_r + b_r)``,
    ``ĥ = tanh(x W_h + (r ⊙ h) U_h + b_h)``: z → 1 takes the candidate.
    PyTorch's ``nn.GRU`` differs twice: it writes ``h' = (1 − z) ⊙ ĥ + z ⊙ h``
    (z → 1 *keeps* the state) and applies the reset after the matrix product,
    ``r ⊙ (h U_h + b_hn)``. Convert weights accordingly.

    Args:
        params: from [`init_gru`][jaxwise.sequence.init_gru].
        h: the state, ``(..., H)``.
        x: the input, ``(..., D)``.

    Returns:
        ``(h', h')``: the new state (``(..., H)``) as both carry and output, the shape
            [`run_rnn`][jaxwise.sequence.run_rnn] expects of a cell.

    Examples:
        >>> p = init_gru(0, 2, 3)
        >>> gru_cell(p, jnp.zeros(3), jnp.ones(2))[0].shape
        (3,)
    """
    hidden = h.shape[-1]
    gx = x @ params["w"] + params["b"]
    zr = jax.nn.sigmoid(gx[..., : 2 * hidden] + h @ params["u_zr"])
    z, r = zr[..., :hidden], zr[..., hidden:]
    candidate = jnp.tanh(gx[..., 2 * hidden :] + (r * h) @ params["u_h"])
    new = (1 - z) * h + z * candidate
    return new, new


def init_lstm(key: Array | int, input_dim: int, hidden_dim: int) -> dict[str, Array]:
    """LSTM parameters, gates stacked i, f, g, o: ``w (D, 4H)``, ``u (H, 4H)``, ``b (4H,)``.

    The forget-gate bias starts at 1 (Jozefowicz et al., 2015).

    Args:
        key: a PRNG key, or an int seed.
        input_dim: ``D``, the input size, >= 1.
        hidden_dim: ``H``, the state size, >= 1.

    Returns:
        ``{"b", "u", "w"}``, float32 arrays of the shapes above (Glorot-uniform weights).

    Raises:
        TypeError: ``key`` is not a key or int, or a size is not an int.
        ValueError: a size is < 1.

    Examples:
        >>> init_lstm(0, 3, 2)["b"].tolist()
        [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    """
    key = _init_key(key, input_dim, hidden_dim)
    k1, k2 = jax.random.split(key)
    b = jnp.zeros((4 * hidden_dim,), jnp.float32).at[hidden_dim : 2 * hidden_dim].set(1.0)
    return {
        "b": b,
        "u": _glorot(k2, (hidden_dim, 4 * hidden_dim)),
        "w": _glorot(k1, (input_dim, 4 * hidden_dim)),
    }


def lstm_cell(
    params: dict[str, Array], carry: tuple[Array, Array], x: Array
) -> tuple[tuple[Array, Array], Array]:
    """One LSTM step: ``c' = f ⊙ c + i ⊙ g``, ``h' = o ⊙ tanh(c')``; returns ``((h', c'), h')``.

    Args:
        params: from [`init_lstm`][jaxwise.sequence.init_lstm].
        carry: ``(h, c)``, each ``(..., H)``.
        x: the input, ``(..., D)``.

    Returns:
        ``((h', c'), h')``: the new carry and the output ``h'``, each ``(..., H)``.

    Examples:
        >>> p = init_lstm(0, 2, 3)
        >>> (h, c), out = lstm_cell(p, (jnp.zeros(3), jnp.zeros(3)), jnp.ones(2))
        >>> h.shape, bool(jnp.all(out == h))
        ((3,), True)
    """
    h, c = carry
    hidden = h.shape[-1]
    # Two products, x W + h U, rather than one [x, h] @ [[W], [U]]: the concatenation puts the
    # input's (zero) tangent into every backward product, and the two products were measured
    # faster in forward + backward on CPU (benchmarks/bench_sequence.py).
    gates = x @ params["w"] + h.astype(x.dtype) @ params["u"] + params["b"]
    i = jax.nn.sigmoid(gates[..., :hidden])
    f = jax.nn.sigmoid(gates[..., hidden : 2 * hidden])
    g = jnp.tanh(gates[..., 2 * hidden : 3 * hidden])
    o = jax.nn.sigmoid(gates[..., 3 * hidden :])
    c = f * c + i * g
    h = o * jnp.tanh(c)
    return (h, c), h


def run_rnn(
    cell: Callable[[P, C, Array], tuple[C, Array]],
    params: P,
    xs: ArrayLike,
    carry0: C,
    mask: ArrayLike | None = None,
    checkpoint: bool = True,
    reverse: bool = False,
) -> tuple[C, Array]:
    """Run ``cell(params, carry, x) -> (carry, output)`` over one sequence ``xs (T, D)`` (a scan).

    ``mask (T,)`` is read step by step from the scanned inputs: at a padding
    step the carry is kept and the output is 0 — so the final carry is the
    one after the last real step, and gradients w.r.t. padded inputs are
    exactly 0. ``checkpoint=True`` (the default) wraps the step in
    ``jax.checkpoint``: the backward pass recomputes each step's activations
    from its carry and input instead of reading them from stacks of ``T``
    saved arrays. The gradients are the same, memory is O(T · carry) rather
    than O(T · activations), and on CPU it is faster (the LSTM's forward +
    backward took 0.7-0.8x the time of storing, `benchmarks/bench_sequence.py`):
    writing and reading the stacks costs more than one extra matrix product
    per step. ``checkpoint=False`` stores them (try it on accelerators).
    ``reverse=True`` runs from the end (outputs stay aligned with ``xs``).
    Batch with ``vmap``.

    Args:
        cell: ``cell(params, carry, x) -> (carry, output)``, e.g.
            [`gru_cell`][jaxwise.sequence.gru_cell] or [`lstm_cell`][jaxwise.sequence.lstm_cell].
        params: the cell's parameters.
        xs: float ``(T, D)``: one sequence.
        carry0: the initial carry (any pytree the cell takes).
        mask: optional bool ``(T,)``: False at padding steps.
        checkpoint: recompute each step's activations in the backward pass.
        reverse: run from the last step to the first.

    Returns:
        ``(final_carry, outputs)`` with ``outputs`` of shape ``(T, H)``.

    Raises:
        TypeError: ``cell`` is not callable, ``xs`` is not floating point, or ``mask`` is
            not boolean.
        ValueError: ``xs`` is not ``(T, D)``, ``mask`` is not ``(T,)``, or ``cell`` fails
            on one step of ``xs`` with ``carry0`` (a feature size ``D`` or a carry size that
            does not fit ``params``, named with the shapes) or returns a carry of another
            shape.

    Examples:
        >>> p = init_gru(0, 2, 3)
        >>> h, out = run_rnn(gru_cell, p, jnp.ones((5, 2)), jnp.zeros(3), mask=jnp.arange(5) < 3)
        >>> out.shape, bool(jnp.all(out[3:] == 0))
        ((5, 3), True)
    """
    check_callable(cell, "cell")
    xs = as_array(xs, "xs", dtype_kind="f")
    if xs.ndim < 2:
        raise ValueError(
            f"`xs` must be (T, D) (one sequence; batch with vmap), got shape {xs.shape}"
        )
    if mask is not None:
        mask = as_array(mask, "mask", dtype_kind="b")
        if mask.shape != xs.shape[:1]:
            raise ValueError(
                f"`mask` must be a bool array of shape {xs.shape[:1]}, got shape {mask.shape}"
            )
    _check_cell(cell, params, xs, carry0)

    def step(carry: C, x: Array) -> tuple[C, Array]:
        return cell(params, carry, x)

    def masked_step(carry: C, inputs: tuple[Array, Array]) -> tuple[C, Array]:
        x, keep = inputs
        new_carry, out = cell(params, carry, x)
        carry = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new_carry, carry)
        return carry, jnp.where(keep, out, jnp.zeros_like(out))

    body: Callable[[C, Any], tuple[C, Array]] = step if mask is None else masked_step
    if checkpoint:
        body = jax.checkpoint(body)
    scanned: Any = xs if mask is None else (xs, mask)
    return jax.lax.scan(body, carry0, scanned, reverse=reverse)


def _shapes(tree: Any) -> str:
    shapes = [tuple(jnp.shape(leaf)) for leaf in jax.tree.leaves(tree)]
    return str(shapes[0]) if len(shapes) == 1 else str(shapes)


def _check_cell(cell: Callable[..., Any], params: Any, xs: Array, carry0: Any) -> None:
    """One step traced (shapes only): a wrong feature or carry size named, not a deep error."""
    x = jax.ShapeDtypeStruct(xs.shape[1:], xs.dtype)
    try:
        new_carry, _ = jax.eval_shape(cell, params, carry0, x)
    except (TypeError, ValueError) as err:
        sizes = (
            {k: tuple(jnp.shape(v)) for k, v in params.items()}
            if isinstance(params, dict)
            else None
        )
        raise ValueError(
            f"`cell` fails on one step of `xs` (shape {xs.shape[1:]}: D = {xs.shape[-1]}) with "
            f"`carry0` of shape {_shapes(carry0)}"
            + (f" and `params` {sizes}" if sizes else "")
            + f": check D and the carry size against `params` ({' '.join(str(err).split())})"
        ) from None
    if jax.tree.structure(new_carry) != jax.tree.structure(carry0) or [
        tuple(leaf.shape) for leaf in jax.tree.leaves(new_carry)
    ] != [tuple(jnp.shape(leaf)) for leaf in jax.tree.leaves(carry0)]:
        raise ValueError(
            f"`cell` returns a carry of shape {_shapes(new_carry)}, but `carry0` has shape "
            f"{_shapes(carry0)}: the carry must keep its shape from step to step"
        )


def run_bidirectional(
    cell: Callable[[P, C, Array], tuple[C, Array]],
    params_fwd: P,
    params_bwd: P,
    xs: ArrayLike,
    carry0: C,
    mask: ArrayLike | None = None,
    checkpoint: bool = True,
) -> tuple[tuple[C, C], Array]:
    """A bidirectional RNN: forward and reverse passes, outputs concatenated ``(T, 2H)``.

    With padding at the end (``mask``), the reverse pass starts at the last
    real step (padding keeps the initial carry).

    Args:
        cell: ``cell(params, carry, x) -> (carry, output)``, as in
            [`run_rnn`][jaxwise.sequence.run_rnn].
        params_fwd: the forward cell's parameters.
        params_bwd: the reverse cell's parameters.
        xs: float ``(T, D)``: one sequence.
        carry0: the initial carry of both passes.
        mask: optional bool ``(T,)``: False at padding steps.
        checkpoint: recompute each step's activations in the backward pass.

    Returns:
        ``((forward_carry, reverse_carry), outputs)`` with ``outputs`` of shape ``(T, 2H)``.

    Raises:
        TypeError: as [`run_rnn`][jaxwise.sequence.run_rnn].
        ValueError: as [`run_rnn`][jaxwise.sequence.run_rnn].

    Examples:
        >>> p = init_gru(0, 2, 3)
        >>> _, out = run_bidirectional(gru_cell, p, p, jnp.ones((4, 2)), jnp.zeros(3))
        >>> out.shape
        (4, 6)
    """
    fwd_carry, fwd_out = run_rnn(cell, params_fwd, xs, carry0, mask, checkpoint)
    bwd_carry, bwd_out = run_rnn(cell, params_bwd, xs, carry0, mask, checkpoint, reverse=True)
    return (fwd_carry, bwd_carry), jnp.concatenate([fwd_out, bwd_out], axis=-1)
