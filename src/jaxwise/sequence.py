"""Sequences and control flow with ``lax.scan``: masks, segments, returns, loops, RNNs, ODEs.

Everything here is built on ``lax.scan`` / ``lax.associative_scan`` (never a
Python loop that unrolls into the program), reads masks step by step from
the scanned inputs (never from the carry), uses finite fills instead of
``-inf``, and is reverse-differentiable — including :func:`bounded_while`,
the differentiable replacement for ``lax.while_loop``.

Example:
    >>> import jax.numpy as jnp
    >>> discounted_returns(jnp.asarray([1.0, 2.0, 3.0, 4.0]), jnp.asarray([0.0, 1.0, 0.0, 1.0]), 0.5).tolist()
    [2.0, 2.0, 5.0, 4.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "bounded_while",
    "discounted_returns",
    "gru_cell",
    "init_gru",
    "init_lstm",
    "lambda_returns",
    "lengths_to_mask",
    "linear_recurrence",
    "lstm_cell",
    "masked_mean",
    "masked_sum",
    "odeint_rk4",
    "piecewise",
    "piecewise_select",
    "rk4_step",
    "run_bidirectional",
    "run_rnn",
    "segment_mean",
    "segment_softmax",
]

Array = jax.Array


def _concrete(x: Any) -> np.ndarray | None:
    """A host copy of ``x`` if it is concrete (not a tracer), else ``None``."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


def _check_callable(f: Any, name: str) -> None:
    if not callable(f):
        raise TypeError(f"`{name}` must be callable, got {type(f).__name__}")


# --------------------------------------------------------------------------
# Masks and masked reductions
# --------------------------------------------------------------------------


def lengths_to_mask(lengths: Array, max_len: int) -> Array:
    """``mask[..., t] = t < lengths[...]``: a bool mask of shape ``(*lengths.shape, max_len)``.

    Built from the lengths, never from ``value != 0`` (a real zero is not padding).
    Negative lengths or lengths above ``max_len`` raise when concrete.

    Example:
        >>> lengths_to_mask(jnp.asarray([1, 3]), 3).tolist()
        [[True, False, False], [True, True, True]]
    """
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 0:
        raise ValueError(f"`max_len` must be a static int >= 0, got {max_len!r}")
    lengths = jnp.asarray(lengths) if not isinstance(lengths, jax.core.Tracer) else lengths
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise TypeError(f"`lengths` must be integers, got dtype {lengths.dtype}")
    host = _concrete(lengths)
    if host is not None and host.size:
        if host.min() < 0:
            raise ValueError(f"`lengths` must be >= 0, got {int(host.min())}")
        if host.max() > max_len:
            raise ValueError(f"`lengths` must be <= max_len={max_len}, got {int(host.max())}")
    return jnp.arange(max_len) < lengths[..., None]


def _check_mask_shape(x: Array, mask: Array) -> Array:
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"`mask` must be boolean, got dtype {mask.dtype}")
    try:
        shape = np.broadcast_shapes(mask.shape, x.shape)
    except ValueError:
        shape = None
    if shape != tuple(x.shape):
        raise ValueError(f"`mask` of shape {mask.shape} does not broadcast to `x` of shape {x.shape}")
    return jnp.broadcast_to(mask, x.shape)


def masked_sum(x: Array, mask: Array, axis: int | tuple[int, ...] | None = None) -> Array:
    """Sum of the entries of ``x`` where ``mask`` is True (others contribute exactly 0, NaN included).

    Example:
        >>> float(masked_sum(jnp.asarray([1.0, jnp.nan, 3.0]), jnp.asarray([True, False, True])))
        4.0
    """
    x = jnp.asarray(x)
    mask = _check_mask_shape(x, mask)
    return jnp.sum(jnp.where(mask, x, 0), axis=axis)


def masked_mean(x: Array, mask: Array, axis: int | tuple[int, ...] | None = None) -> Array:
    """Mean over the masked entries; the denominator is ``max(1, count)``, so empty rows give 0.

    Numerator and denominator are both masked; gradients are finite even
    for fully masked rows.

    Example:
        >>> m = jnp.asarray([[True, True, False], [False, False, False]])
        >>> masked_mean(jnp.asarray([[1.0, 3.0, 100.0], [5.0, 5.0, 5.0]]), m, axis=1).tolist()
        [2.0, 0.0]
    """
    x = jnp.asarray(x)
    mask = _check_mask_shape(x, mask)
    total = jnp.sum(jnp.where(mask, x, 0), axis=axis)
    count = jnp.sum(mask.astype(x.dtype), axis=axis)
    return total / jnp.maximum(count, 1)


# --------------------------------------------------------------------------
# Segments
# --------------------------------------------------------------------------


def _check_segments(values: Array, segment_ids: Array, num_segments: Any) -> Array:
    if num_segments is None or isinstance(num_segments, jax.core.Tracer):
        raise ValueError("`num_segments` must be a static Python int (it sets the output shape)")
    if isinstance(num_segments, bool) or not isinstance(num_segments, (int, np.integer)) or num_segments < 1:
        raise ValueError(f"`num_segments` must be a positive int, got {num_segments!r}")
    segment_ids = jnp.asarray(segment_ids) if not isinstance(segment_ids, jax.core.Tracer) else segment_ids
    if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
        raise TypeError(f"`segment_ids` must be integers, got dtype {segment_ids.dtype}")
    if segment_ids.shape != values.shape[:1]:
        raise ValueError(f"`segment_ids` must have shape {values.shape[:1]}, got {segment_ids.shape}")
    host = _concrete(segment_ids)
    if host is not None and host.size and (host.min() < 0 or host.max() >= num_segments):
        raise ValueError(
            f"`segment_ids` must be in [0, {num_segments}), got values in [{int(host.min())}, {int(host.max())}] "
            "(jax.ops.segment_sum would silently drop them)"
        )
    return segment_ids


def segment_softmax(scores: Array, segment_ids: Array, num_segments: int) -> Array:
    """Softmax of ``scores`` within each segment (e.g. attention over a node's edges).

    The per-segment max is subtracted (stable for scores of any size); empty
    segments are harmless; out-of-range ids raise when concrete.

    Args:
      scores: float ``(N, …)``.
      segment_ids: int ``(N,)`` in ``[0, num_segments)``.
      num_segments: static int.

    Example:
        >>> segment_softmax(jnp.asarray([1.0, 1.0, 500.0]), jnp.asarray([0, 0, 1]), 3).tolist()
        [0.5, 0.5, 1.0]
    """
    scores = jnp.asarray(scores)
    segment_ids = _check_segments(scores, segment_ids, num_segments)
    seg_max = jax.ops.segment_max(scores, segment_ids, num_segments)
    seg_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(seg_max), seg_max, 0.0))
    e = jnp.exp(scores - seg_max[segment_ids])
    total = jax.ops.segment_sum(e, segment_ids, num_segments)
    return e / total[segment_ids]


def segment_mean(values: Array, segment_ids: Array, num_segments: int) -> Array:
    """Mean of ``values`` per segment; empty segments give 0.

    Example:
        >>> segment_mean(jnp.asarray([1.0, 3.0, 5.0]), jnp.asarray([0, 0, 2]), 3).tolist()
        [2.0, 0.0, 5.0]
    """
    values = jnp.asarray(values)
    segment_ids = _check_segments(values, segment_ids, num_segments)
    total = jax.ops.segment_sum(values, segment_ids, num_segments)
    count = jax.ops.segment_sum(jnp.ones(values.shape[:1], values.dtype), segment_ids, num_segments)
    return total / jnp.maximum(count, 1).reshape((-1,) + (1,) * (values.ndim - 1))


# --------------------------------------------------------------------------
# Returns
# --------------------------------------------------------------------------


def _check_same_length(**arrays: Any) -> None:
    shapes = {name: jnp.shape(a) for name, a in arrays.items() if a is not None}
    for name, shape in shapes.items():
        if len(shape) != 1:
            raise ValueError(f"`{name}` must be 1-D (one trajectory; batch with vmap), got shape {shape}")
    if len(set(shapes.values())) > 1:
        raise ValueError("`rewards`, `dones` and the other per-step arrays must have the same length, got "
                         + ", ".join(f"{k}: {v[0]}" for k, v in shapes.items()))


def discounted_returns(
    rewards: Array, dones: Array, gamma: float | Array, *, truncated: Array | None = None,
    next_values: Array | None = None,
) -> Array:
    """``G_t = r_t + γ (1 − d_t) G_{t+1}`` by a reverse ``lax.scan``.

    Truncation is not termination: at a step cut by a time limit
    (``truncated[t] = 1``, ``dones[t] = 0``) the return bootstraps from the
    value of the true next state, ``G_t = r_t + γ next_values[t]``, instead of
    being treated as terminal (the common RL bug). With ``next_values`` the
    last step also bootstraps (``G_{T-1} = r + γ next_values[T-1]`` unless
    done); without, the trajectory is assumed to end there.

    Args:
      rewards, dones: 1-D ``(T,)`` (``dones`` 0/1 or bool: true terminations).
      gamma: discount (may be traced).
      truncated: optional 1-D 0/1 flags of time-limit cuts.
      next_values: optional ``(T,)`` estimates ``V(s_{t+1})`` of each step's
        actual next state (required with ``truncated``).

    Example:
        >>> r, d = jnp.asarray([1.0, 1.0, 1.0]), jnp.zeros(3)
        >>> discounted_returns(r, d, 0.5, truncated=jnp.asarray([0.0, 1.0, 0.0]),
        ...                    next_values=jnp.asarray([0.0, 10.0, 0.0])).tolist()
        [4.0, 6.0, 1.0]
    """
    _check_same_length(rewards=rewards, dones=dones, truncated=truncated, next_values=next_values)
    if truncated is not None and next_values is None:
        raise ValueError("`truncated` needs `next_values` (the value estimates to bootstrap from)")
    rewards = jnp.asarray(rewards)
    dtype = rewards.dtype if jnp.issubdtype(rewards.dtype, jnp.floating) else jnp.float32
    rewards = rewards.astype(dtype)
    not_done = 1 - jnp.asarray(dones).astype(dtype)
    gamma = jnp.asarray(gamma, dtype)
    cut = jnp.zeros_like(rewards) if truncated is None else jnp.asarray(truncated).astype(dtype)
    boot = jnp.zeros_like(rewards) if next_values is None else jnp.asarray(next_values).astype(dtype)
    last = boot[-1] if next_values is not None else jnp.zeros((), dtype)

    def step(future: Array, xs: tuple) -> tuple[Array, Array]:
        r, nd, c, v = xs
        following = c * v + (1 - c) * future
        g = r + gamma * nd * following
        return g, g

    _, returns = jax.lax.scan(step, last, (rewards, not_done, cut, boot), reverse=True)
    return returns


def lambda_returns(rewards: Array, dones: Array, values: Array, gamma: float | Array, lam: float | Array) -> Array:
    """TD(λ) returns: ``G_t = r_t + γ (1 − d_t) [(1 − λ) V_{t+1} + λ G_{t+1}]``, bootstrapped from ``values[-1]``.

    ``values[t]`` is ``V(s_{t+1})`` (as in ``rlax.lambda_returns``). λ = 1
    gives the bootstrapped discounted return; λ = 0 the one-step TD target.

    Example:
        >>> lambda_returns(jnp.ones(2), jnp.zeros(2), jnp.asarray([4.0, 8.0]), 0.5, 0.0).tolist()
        [3.0, 5.0]
    """
    _check_same_length(rewards=rewards, dones=dones, values=values)
    rewards = jnp.asarray(rewards)
    dtype = rewards.dtype if jnp.issubdtype(rewards.dtype, jnp.floating) else jnp.float32
    discount = jnp.asarray(gamma, dtype) * (1 - jnp.asarray(dones).astype(dtype))
    values = jnp.asarray(values).astype(dtype)
    lam = jnp.asarray(lam, dtype)

    def step(future: Array, xs: tuple) -> tuple[Array, Array]:
        r, disc, v = xs
        g = r + disc * ((1 - lam) * v + lam * future)
        return g, g

    _, returns = jax.lax.scan(step, values[-1], (rewards.astype(dtype), discount, values), reverse=True)
    return returns


# --------------------------------------------------------------------------
# Loops
# --------------------------------------------------------------------------


def bounded_while(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any], init: Any,
                  max_steps: int) -> tuple[Any, Array]:
    """``lax.while_loop`` with at most ``max_steps`` iterations — reverse-mode differentiable.

    Runs a ``lax.scan`` of ``max_steps`` iterations; once ``cond_fun`` is
    False the carry is frozen (each iteration computes
    ``where(running, body(carry), carry)``). Same result and same number of
    body applications as ``lax.while_loop`` when it finishes within
    ``max_steps``.

    Returns:
      ``(carry, steps)`` with ``steps`` the int32 number of body applications.

    Example (Newton's method for √a; the gradient is 1/(2√a)):
        >>> def sqrt(a):
        ...     x, _ = bounded_while(lambda x: jnp.abs(x * x - a) >= 1e-6 * a, lambda x: 0.5 * (x + a / x), a, 50)
        ...     return x
        >>> round(float(sqrt(16.0)), 5), round(float(jax.grad(sqrt)(16.0)), 5)
        (4.0, 0.125)
    """
    _check_callable(cond_fun, "cond_fun")
    _check_callable(body_fun, "body_fun")
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise ValueError(f"`max_steps` must be an int >= 1, got {max_steps!r}")

    def step(state: tuple, _: None) -> tuple[tuple, None]:
        carry, steps = state
        running = jnp.asarray(cond_fun(carry), bool)
        # Double where: once finished, the body is evaluated at `init` (a valid input) and its
        # result discarded, so a body singular at the converged point cannot leak NaN gradients.
        safe = jax.tree.map(lambda c, i: jnp.where(running, c, i), carry, init)
        new = body_fun(safe)
        carry = jax.tree.map(lambda n, o: jnp.where(running, n, o), new, carry)
        return (carry, steps + running.astype(jnp.int32)), None

    (carry, steps), _ = jax.lax.scan(step, (init, jnp.zeros((), jnp.int32)), None, length=int(max_steps))
    return carry, steps


def linear_recurrence(a: Array, b: Array, h0: Array | None = None) -> Array:
    """All ``h_t = a_t ⊙ h_{t−1} + b_t`` (``h_{−1} = h0``, default 0) by ``lax.associative_scan``.

    O(log T) depth: the composition of two steps is again a step,
    ``(a₁, b₁) ∘ (a₂, b₂) = (a₂ a₁, a₂ b₁ + b₂)``. Equal to the sequential
    scan (on CPU the sequential one is often faster; on accelerators the
    associative one parallelises over T).

    Args:
      a, b: ``(T, …)`` arrays of the same shape (elementwise coefficients).

    Example:
        >>> linear_recurrence(jnp.asarray([0.5, 0.5, 0.5]), jnp.asarray([1.0, 1.0, 1.0])).tolist()
        [1.0, 1.5, 1.75]
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.shape != b.shape or a.ndim < 1:
        raise ValueError(f"`a` and `b` must have the same shape (T, …), got {a.shape} and {b.shape}")
    if h0 is not None:
        b = b.at[0].add(a[0] * jnp.asarray(h0, b.dtype))

    def compose(left: tuple, right: tuple) -> tuple:
        a1, b1 = left
        a2, b2 = right
        return a2 * a1, a2 * b1 + b2

    return jax.lax.associative_scan(compose, (a, b))[1]


# --------------------------------------------------------------------------
# Recurrent cells
# --------------------------------------------------------------------------


def _glorot(key: Array, shape: tuple[int, int]) -> Array:
    limit = np.sqrt(6.0 / sum(shape))
    return jax.random.uniform(key, shape, jnp.float32, -limit, limit)


def init_gru(key: Any, input_dim: int, hidden_dim: int) -> dict[str, Array]:
    """GRU parameters: ``w (D, 3H)``, ``u_zr (H, 2H)``, ``u_h (H, H)``, ``b (3H,)``, gate order z, r, h.

    Example:
        >>> {k: v.shape for k, v in init_gru(0, 3, 4).items()}
        {'b': (12,), 'u_h': (4, 4), 'u_zr': (4, 8), 'w': (3, 12)}
    """
    key = jax.random.key(key) if isinstance(key, int) else key
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

    Example:
        >>> p = init_gru(0, 2, 3)
        >>> gru_cell(p, jnp.zeros(3), jnp.ones(2))[0].shape
        (3,)
    """
    hidden = h.shape[-1]
    gx = x @ params["w"] + params["b"]
    zr = jax.nn.sigmoid(gx[..., : 2 * hidden] + h @ params["u_zr"])
    z, r = zr[..., :hidden], zr[..., hidden:]
    candidate = jnp.tanh(gx[..., 2 * hidden:] + (r * h) @ params["u_h"])
    new = (1 - z) * h + z * candidate
    return new, new


def init_lstm(key: Any, input_dim: int, hidden_dim: int) -> dict[str, Array]:
    """LSTM parameters with stacked gates (order i, f, g, o): ``w (D, 4H)``, ``u (H, 4H)``, ``b (4H,)``.

    The forget-gate bias starts at 1 (Jozefowicz et al., 2015).

    Example:
        >>> init_lstm(0, 3, 2)["b"].tolist()
        [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    """
    key = jax.random.key(key) if isinstance(key, int) else key
    k1, k2 = jax.random.split(key)
    b = jnp.zeros((4 * hidden_dim,), jnp.float32).at[hidden_dim:2 * hidden_dim].set(1.0)
    return {"b": b, "u": _glorot(k2, (hidden_dim, 4 * hidden_dim)), "w": _glorot(k1, (input_dim, 4 * hidden_dim))}


def lstm_cell(params: dict[str, Array], carry: tuple[Array, Array], x: Array) -> tuple[tuple[Array, Array], Array]:
    """One LSTM step: ``c' = f ⊙ c + i ⊙ g``, ``h' = o ⊙ tanh(c')``; returns ``((h', c'), h')``.

    Example:
        >>> p = init_lstm(0, 2, 3)
        >>> (h, c), out = lstm_cell(p, (jnp.zeros(3), jnp.zeros(3)), jnp.ones(2))
        >>> h.shape, bool(jnp.all(out == h))
        ((3,), True)
    """
    h, c = carry
    hidden = h.shape[-1]
    gates = x @ params["w"] + h @ params["u"] + params["b"]
    i = jax.nn.sigmoid(gates[..., :hidden])
    f = jax.nn.sigmoid(gates[..., hidden:2 * hidden])
    g = jnp.tanh(gates[..., 2 * hidden:3 * hidden])
    o = jax.nn.sigmoid(gates[..., 3 * hidden:])
    c = f * c + i * g
    h = o * jnp.tanh(c)
    return (h, c), h


Cell = Callable[[Any, Any, Array], tuple[Any, Array]]


def run_rnn(cell: Cell, params: Any, xs: Array, carry0: Any, mask: Array | None = None, checkpoint: bool = False,
            reverse: bool = False) -> tuple[Any, Array]:
    """Run ``cell(params, carry, x) -> (carry, output)`` over one sequence ``xs (T, D)`` with ``lax.scan``.

    ``mask (T,)`` is read step by step from the scanned inputs: at a padding
    step the carry is kept and the output is 0 — so the final carry is the
    one after the last real step, and gradients w.r.t. padded inputs are
    exactly 0. ``checkpoint=True`` wraps the step in ``jax.checkpoint``
    (recompute activations in the backward pass: same gradients, less
    memory). ``reverse=True`` runs from the end (outputs stay aligned with
    ``xs``). Batch with ``vmap``.

    Returns:
      ``(final_carry, outputs (T, H))``.

    Example:
        >>> p = init_gru(0, 2, 3)
        >>> h, out = run_rnn(gru_cell, p, jnp.ones((5, 2)), jnp.zeros(3), mask=jnp.arange(5) < 3)
        >>> out.shape, bool(jnp.all(out[3:] == 0))
        ((5, 3), True)
    """
    _check_callable(cell, "cell")
    xs = jnp.asarray(xs)
    if xs.ndim < 2:
        raise ValueError(f"`xs` must be (T, D) (one sequence; batch with vmap), got shape {xs.shape}")
    if mask is None:
        mask = jnp.ones(xs.shape[:1], bool)
    mask = jnp.asarray(mask)
    if mask.shape != xs.shape[:1] or mask.dtype != jnp.bool_:
        raise ValueError(f"`mask` must be a bool array of shape {xs.shape[:1]}, got {mask.dtype}{list(mask.shape)}")

    def step(carry: Any, inputs: tuple[Array, Array]) -> tuple[Any, Array]:
        x, keep = inputs
        new_carry, out = cell(params, carry, x)
        carry = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new_carry, carry)
        return carry, jnp.where(keep, out, jnp.zeros_like(out))

    if checkpoint:
        step = jax.checkpoint(step)
    return jax.lax.scan(step, carry0, (xs, mask), reverse=reverse)


def run_bidirectional(cell: Cell, params_fwd: Any, params_bwd: Any, xs: Array, carry0: Any,
                      mask: Array | None = None, checkpoint: bool = False) -> tuple[tuple[Any, Any], Array]:
    """A bidirectional RNN: forward and reverse passes, outputs concatenated ``(T, 2H)``.

    With padding at the end (``mask``), the reverse pass starts at the last
    real step (padding keeps the initial carry).

    Example:
        >>> p = init_gru(0, 2, 3)
        >>> _, out = run_bidirectional(gru_cell, p, p, jnp.ones((4, 2)), jnp.zeros(3))
        >>> out.shape
        (4, 6)
    """
    fwd_carry, fwd_out = run_rnn(cell, params_fwd, xs, carry0, mask, checkpoint)
    bwd_carry, bwd_out = run_rnn(cell, params_bwd, xs, carry0, mask, checkpoint, reverse=True)
    return (fwd_carry, bwd_carry), jnp.concatenate([fwd_out, bwd_out], axis=-1)


# --------------------------------------------------------------------------
# ODEs
# --------------------------------------------------------------------------


def _axpy(h: Any, k: Any, y: Any) -> Any:
    return jax.tree.map(lambda ki, yi: yi + h * ki, k, y)


def rk4_step(f: Callable[[Array, Any, Any], Any], t: Array, y: Any, h: Array, args: Any = None) -> Any:
    """One classical Runge-Kutta step of ``dy/dt = f(t, y, args)`` (pytree ``y``).

    Example:
        >>> round(float(rk4_step(lambda t, y, a: -y, 0.0, 1.0, 0.1)), 6)
        0.904837
    """
    _check_callable(f, "f")
    k1 = f(t, y, args)
    k2 = f(t + h / 2, _axpy(h / 2, k1, y), args)
    k3 = f(t + h / 2, _axpy(h / 2, k2, y), args)
    k4 = f(t + h, _axpy(h, k3, y), args)
    return jax.tree.map(lambda yi, a, b, c, d: yi + (h / 6) * (a + 2 * b + 2 * c + d), y, k1, k2, k3, k4)


def odeint_rk4(f: Callable[[Array, Any, Any], Any], y0: Any, t0: float, dt: float, n_steps: int,
               args: Any = None) -> tuple[Any, Any]:
    """Integrate ``dy/dt = f(t, y, args)`` with ``n_steps`` RK4 steps of size ``dt`` in a ``lax.scan``.

    Differentiable w.r.t. ``y0`` and ``args`` (backpropagation through the
    scan); batch over initial values with ``vmap``.

    Returns:
      ``(y_T, trajectory)``: the final state and the ``n_steps`` states after
      each step (``y0`` excluded), each leaf of shape ``(n_steps, *leaf.shape)``.

    Example (harmonic oscillator, one period):
        >>> f = lambda t, y, w: jnp.stack([y[1], -w**2 * y[0]])
        >>> yT, traj = odeint_rk4(f, jnp.asarray([1.0, 0.0]), 0.0, 2 * 3.14159265 / 1000, 1000, 1.0)
        >>> [round(v, 4) for v in yT.tolist()], traj.shape
        ([1.0, 0.0], (1000, 2))
    """
    _check_callable(f, "f")
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
        raise ValueError(f"`n_steps` must be an int >= 1, got {n_steps!r}")

    def step(carry: tuple[Any, Array], _: None) -> tuple[tuple[Any, Array], Any]:
        y, t = carry
        y = rk4_step(f, t, y, dt, args)
        return (y, t + dt), y

    (y_final, _), trajectory = jax.lax.scan(step, (y0, jnp.asarray(t0, jnp.float32)), None, length=int(n_steps))
    return y_final, trajectory


# --------------------------------------------------------------------------
# Piecewise functions
# --------------------------------------------------------------------------


def piecewise(index: Array, branches: Sequence[Callable[..., Any]], *operands: Any) -> Any:
    """``branches[index](*operands)`` via ``lax.switch`` (index clamped to the valid range).

    Under ``jit`` with a scalar index, only the chosen branch runs. Under
    ``vmap`` with a batched index, JAX turns ``switch`` into ``select_n``:
    **every branch is computed** for every element and the results
    selected — cost is the sum of the branches, and a branch that is invalid
    for some inputs (``log`` of a negative) still runs on them, so make
    branches safe (see :func:`jaxwise.numerics.double_where`).

    Example:
        >>> piecewise(jnp.asarray(1), [lambda x: x + 1, lambda x: x * 10], 2.0).item()
        20.0
    """
    branches = list(branches)
    if not branches:
        raise ValueError("`branches` must not be empty")
    for i, b in enumerate(branches):
        _check_callable(b, f"branches[{i}]")
    return jax.lax.switch(jnp.clip(jnp.asarray(index, jnp.int32), 0, len(branches) - 1), branches, *operands)


def piecewise_select(conditions: Sequence[Array], values: Sequence[Array], default: Any = 0.0) -> Array:
    """Elementwise piecewise values: the first true condition picks its value (``jnp.select``).

    All ``values`` are computed everywhere (as under ``vmap``); guard them.

    Example:
        >>> x = jnp.asarray([-2.0, 0.5, 3.0])
        >>> piecewise_select([x < 0, x < 1], [jnp.zeros(3), x], default=1.0).tolist()
        [0.0, 0.5, 1.0]
    """
    conditions, values = list(conditions), list(values)
    if len(conditions) != len(values) or not conditions:
        raise ValueError(f"need as many `conditions` as `values` (>= 1), got {len(conditions)} and {len(values)}")
    return jnp.select(conditions, values, default)
