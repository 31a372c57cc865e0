"""Sequences and control flow with ``lax.scan``: masks, segments, returns, loops, RNNs, ODEs.

Everything here is built on ``lax.scan`` / ``lax.associative_scan`` (never a Python loop that
unrolls into the program), reads masks step by step from the scanned inputs (never from the carry),
uses finite fills instead of ``-inf``, and is reverse-differentiable — including
[`bounded_while`][jaxwise.sequence.bounded_while], the differentiable replacement for
``lax.while_loop``.

Modules: ``_masks`` (masks from lengths, masked and segment reductions), ``_returns``
(discounted, TD(λ) and GAE returns), ``_loops`` (bounded while, linear recurrences,
piecewise), ``_rnn`` (GRU/LSTM cells and runners), ``_ode`` (RK4).

Examples:
    >>> import jax.numpy as jnp
    >>> r, d = jnp.asarray([1.0, 2.0, 3.0, 4.0]), jnp.asarray([0.0, 1.0, 0.0, 1.0])
    >>> discounted_returns(r, d, 0.5).tolist()
    [2.0, 2.0, 5.0, 4.0]
"""

from jaxwise.sequence._loops import bounded_while as bounded_while
from jaxwise.sequence._loops import linear_recurrence as linear_recurrence
from jaxwise.sequence._loops import piecewise as piecewise
from jaxwise.sequence._loops import piecewise_select as piecewise_select
from jaxwise.sequence._masks import lengths_to_mask as lengths_to_mask
from jaxwise.sequence._masks import masked_mean as masked_mean
from jaxwise.sequence._masks import masked_sum as masked_sum
from jaxwise.sequence._masks import segment_mean as segment_mean
from jaxwise.sequence._masks import segment_softmax as segment_softmax
from jaxwise.sequence._ode import odeint_rk4 as odeint_rk4
from jaxwise.sequence._ode import rk4_step as rk4_step
from jaxwise.sequence._returns import discounted_returns as discounted_returns
from jaxwise.sequence._returns import gae as gae
from jaxwise.sequence._returns import lambda_returns as lambda_returns
from jaxwise.sequence._rnn import gru_cell as gru_cell
from jaxwise.sequence._rnn import init_gru as init_gru
from jaxwise.sequence._rnn import init_lstm as init_lstm
from jaxwise.sequence._rnn import lstm_cell as lstm_cell
from jaxwise.sequence._rnn import run_bidirectional as run_bidirectional
from jaxwise.sequence._rnn import run_rnn as run_rnn

__all__ = [
    "bounded_while",
    "discounted_returns",
    "gae",
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
