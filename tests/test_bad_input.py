"""Table-driven bad calls at the public boundary of numerics, debug, autodiff and sequence.

Every row is one bad call: it must raise the expected exception type (``TypeError`` for a
wrong kind of value, ``ValueError`` for a wrong value) from jaxwise's own code (the raising
frame is in the jaxwise package), and the message must name the argument in backticks —
never a failure deep inside JAX or NumPy.

Every row passes bad input on purpose: the lines a type checker rejects for it carry
``# pyright: ignore[reportArgumentType]``.
"""

import os
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import autodiff as ad
from jaxwise import debug
from jaxwise import numerics as jn
from jaxwise import sequence as sq

NAN, INF = float("nan"), float("inf")
X = jnp.ones(3)
M = jnp.ones(3, bool)
LOGITS = jnp.zeros((2, 4))
LABELS = jnp.asarray([1, 3])
R, D, V = jnp.ones(4), jnp.zeros(4), jnp.ones(4)
LSTM = sq.init_lstm(0, 2, 3)


def oscillator(t, y, w):
    return jnp.stack([y[1], -(w**2) * y[0]])


ROWS = [
    # ---- numerics: arrays expected ----
    ("safe_sqrt(None)", lambda: jn.safe_sqrt(None), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("safe_sqrt(str)", lambda: jn.safe_sqrt("1.0"), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("safe_sqrt(dict)", lambda: jn.safe_sqrt({"a": 1.0}), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("safe_sqrt(int array)", lambda: jn.safe_sqrt(jnp.ones(3, jnp.int32)), TypeError, "x"),
    ("safe_sqrt(ragged)", lambda: jn.safe_sqrt([[1.0], [1.0, 2.0]]), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("safe_log(None)", lambda: jn.safe_log(None), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("safe_log(bool)", lambda: jn.safe_log(jnp.ones(2, bool)), TypeError, "x"),
    ("safe_log(fill=nan)", lambda: jn.safe_log(X, fill=NAN), ValueError, "fill"),
    ("safe_log(fill=inf)", lambda: jn.safe_log(X, fill=-INF), ValueError, "fill"),
    ("safe_log(fill=str)", lambda: jn.safe_log(X, fill="0"), TypeError, "fill"),  # pyright: ignore[reportArgumentType]
    ("safe_log(fill=True)", lambda: jn.safe_log(X, fill=True), TypeError, "fill"),
    ("sinc(None)", lambda: jn.sinc(None), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("sinc(str)", lambda: jn.sinc("x"), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("entropy(None)", lambda: jn.entropy(None), TypeError, "p"),  # pyright: ignore[reportArgumentType]
    ("entropy(int)", lambda: jn.entropy(jnp.asarray([1, 0])), TypeError, "p"),
    ("entropy(where=float)", lambda: jn.entropy(X, where=jnp.ones(3)), TypeError, "where"),
    ("entropy(where=shape)", lambda: jn.entropy(X, where=jnp.ones(4, bool)), ValueError, "where"),
    ("entropy(where=str)", lambda: jn.entropy(X, where="all"), TypeError, "where"),  # pyright: ignore[reportArgumentType]
    ("entropy(axis=5)", lambda: jn.entropy(X, axis=5), ValueError, "axis"),
    ("logit(None)", lambda: jn.logit(None), TypeError, "p"),  # pyright: ignore[reportArgumentType]
    ("logit(str)", lambda: jn.logit("0.5"), TypeError, "p"),  # pyright: ignore[reportArgumentType]
    ("safe_norm(None)", lambda: jn.safe_norm(None), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("safe_norm(int)", lambda: jn.safe_norm(jnp.ones(3, jnp.int32)), TypeError, "x"),
    ("safe_norm(axis=3)", lambda: jn.safe_norm(X, axis=3), ValueError, "axis"),
    ("cosine(None, x)", lambda: jn.cosine_similarity(None, X), TypeError, "a"),  # pyright: ignore[reportArgumentType]
    ("cosine(x, None)", lambda: jn.cosine_similarity(X, None), TypeError, "b"),  # pyright: ignore[reportArgumentType]
    ("cosine(dtypes)", lambda: jn.cosine_similarity(X, jnp.ones(3, jnp.float16)), TypeError, "a"),
    ("cosine(shapes)", lambda: jn.cosine_similarity(X, jnp.ones(4)), ValueError, "a"),
    ("cosine(axis)", lambda: jn.cosine_similarity(X, X, axis=2), ValueError, "axis"),
    ("logsumexp(None)", lambda: jn.logsumexp(None), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("logsumexp(empty)", lambda: jn.logsumexp(jnp.zeros(0)), ValueError, "x"),
    (
        "logsumexp(where=int)",
        lambda: jn.logsumexp(X, where=jnp.ones(3, jnp.int32)),
        TypeError,
        "where",
    ),
    ("logsumexp(axis)", lambda: jn.logsumexp(X, axis=1), ValueError, "axis"),
    ("softmax(None)", lambda: jn.softmax(None), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("softmax(str)", lambda: jn.softmax("abc"), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    (
        "softmax(where=shape)",
        lambda: jn.softmax(X, where=jnp.ones((2, 3), bool)),
        ValueError,
        "where",
    ),
    ("softmax(axis)", lambda: jn.softmax(X, axis=-2), ValueError, "axis"),
    ("log_softmax(None)", lambda: jn.log_softmax(None), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("log_softmax(where=float)", lambda: jn.log_softmax(X, where=jnp.ones(3)), TypeError, "where"),
    ("mask_logits(None)", lambda: jn.mask_logits(None, M), TypeError, "logits"),  # pyright: ignore[reportArgumentType]
    ("mask_logits(mask=None)", lambda: jn.mask_logits(X, None), TypeError, "mask"),  # pyright: ignore[reportArgumentType]
    ("mask_logits(mask=float)", lambda: jn.mask_logits(X, jnp.ones(3)), TypeError, "mask"),
    ("mask_logits(mask shape)", lambda: jn.mask_logits(X, jnp.ones(5, bool)), ValueError, "mask"),
    ("cross_entropy(None)", lambda: jn.cross_entropy(None, LABELS), TypeError, "logits"),  # pyright: ignore[reportArgumentType]
    ("cross_entropy(str)", lambda: jn.cross_entropy("z", LABELS), TypeError, "logits"),  # pyright: ignore[reportArgumentType]
    ("cross_entropy(scalar)", lambda: jn.cross_entropy(jnp.ones(()), LABELS), ValueError, "logits"),
    (
        "cross_entropy(empty batch)",
        lambda: jn.cross_entropy(jnp.zeros((0, 4)), jnp.zeros(0, int)),
        ValueError,
        "logits",
    ),
    (
        "cross_entropy(no classes)",
        lambda: jn.cross_entropy(jnp.zeros((2, 0)), LABELS),
        ValueError,
        "logits",
    ),
    ("cross_entropy(labels None)", lambda: jn.cross_entropy(LOGITS, None), TypeError, "labels"),  # pyright: ignore[reportArgumentType]
    (
        "cross_entropy(labels float)",
        lambda: jn.cross_entropy(LOGITS, jnp.ones(2)),
        TypeError,
        "labels",
    ),
    (
        "cross_entropy(labels shape)",
        lambda: jn.cross_entropy(LOGITS, jnp.asarray([1])),
        ValueError,
        "labels",
    ),
    (
        "cross_entropy(labels range)",
        lambda: jn.cross_entropy(LOGITS, jnp.asarray([1, 4])),
        ValueError,
        "labels",
    ),
    (
        "cross_entropy(labels neg)",
        lambda: jn.cross_entropy(LOGITS, jnp.asarray([-1, 0])),
        ValueError,
        "labels",
    ),
    (
        "cross_entropy(class_mask)",
        lambda: jn.cross_entropy(LOGITS, LABELS, class_mask=jnp.ones(4)),
        TypeError,
        "class_mask",
    ),
    (
        "cross_entropy(weights shape)",
        lambda: jn.cross_entropy(LOGITS, LABELS, weights=jnp.ones(3)),
        ValueError,
        "weights",
    ),
    (
        "cross_entropy(weights int)",
        lambda: jn.cross_entropy(LOGITS, LABELS, weights=LABELS),
        TypeError,
        "weights",
    ),
    ("double_where(fn)", lambda: jn.double_where(None, X, M, 1.0, 0.0), TypeError, "fn"),  # pyright: ignore[reportArgumentType]
    ("double_where(x)", lambda: jn.double_where(jnp.log, None, M, 1.0, 0.0), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    (
        "double_where(ok)",
        lambda: jn.double_where(jnp.log, X, jnp.ones(3), 1.0, 0.0),
        TypeError,
        "ok",
    ),
    ("straight_through(fn)", lambda: jn.straight_through("round"), TypeError, "fn"),  # pyright: ignore[reportArgumentType]
    ("round_ste(None)", lambda: jn.round_ste(None), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("round_ste(int)", lambda: jn.round_ste(jnp.ones(2, jnp.int32)), TypeError, "x"),
    # ---- debug ----
    ("locate_nan(fn)", lambda: debug.locate_nan(None, X), TypeError, "fn"),  # pyright: ignore[reportArgumentType]
    ("locate_nan(str fn)", lambda: debug.locate_nan("f", X), TypeError, "fn"),  # pyright: ignore[reportArgumentType]
    ("checked(fn)", lambda: debug.checked(3), TypeError, "fn"),  # pyright: ignore[reportArgumentType]
    ("checked(errors)", lambda: debug.checked(jnp.log, errors="everything"), ValueError, "errors"),
    ("checked(errors None)", lambda: debug.checked(jnp.log, errors=None), ValueError, "errors"),  # pyright: ignore[reportArgumentType]
    # ---- autodiff ----
    ("jacobian(f)", lambda: ad.jacobian(None), TypeError, "f"),  # pyright: ignore[reportArgumentType]
    ("jacobian(mode)", lambda: ad.jacobian(jnp.sin, mode="central"), ValueError, "mode"),  # pyright: ignore[reportArgumentType]
    ("jacobian_mode(f)", lambda: ad.jacobian_mode("f", X), TypeError, "f"),  # pyright: ignore[reportArgumentType]
    ("jvp_many(f)", lambda: ad.jvp_many(None, X, jnp.eye(3)), TypeError, "f"),  # pyright: ignore[reportArgumentType]
    ("jvp_many(tangents)", lambda: ad.jvp_many(jnp.sin, X, jnp.ones(3)), ValueError, "tangents"),
    ("hvp(f)", lambda: ad.hvp(3, X, X), TypeError, "f"),  # pyright: ignore[reportArgumentType]
    ("hvp(method)", lambda: ad.hvp(jnp.sum, X, X, method="exact"), ValueError, "method"),  # pyright: ignore[reportArgumentType]
    ("hvp(v structure)", lambda: ad.hvp(jnp.sum, X, (X,)), ValueError, "v"),
    ("hvp(v shape)", lambda: ad.hvp(jnp.sum, X, jnp.ones(4)), ValueError, "v"),
    ("cg_solve(matvec)", lambda: ad.cg_solve(None, X, iters=3), TypeError, "matvec"),  # pyright: ignore[reportArgumentType]
    ("cg_solve(iters=0)", lambda: ad.cg_solve(lambda v: v, X, iters=0), ValueError, "iters"),
    ("cg_solve(iters float)", lambda: ad.cg_solve(lambda v: v, X, iters=2.5), TypeError, "iters"),  # pyright: ignore[reportArgumentType]
    ("cg_solve(iters bool)", lambda: ad.cg_solve(lambda v: v, X, iters=True), TypeError, "iters"),
    ("cg_solve(tol nan)", lambda: ad.cg_solve(lambda v: v, X, iters=2, tol=NAN), ValueError, "tol"),
    ("cg_solve(tol<0)", lambda: ad.cg_solve(lambda v: v, X, iters=2, tol=-1.0), ValueError, "tol"),
    (
        "cg_solve(matvec shape)",
        lambda: ad.cg_solve(lambda v: v[:1], X, iters=2),
        ValueError,
        "matvec",
    ),
    ("newton_cg_step(f)", lambda: ad.newton_cg_step(None, X), TypeError, "f"),  # pyright: ignore[reportArgumentType]
    (
        "newton_cg_step(cg_iters)",
        lambda: ad.newton_cg_step(jnp.sum, X, cg_iters=0),
        ValueError,
        "cg_iters",
    ),
    (
        "newton_cg_step(damping nan)",
        lambda: ad.newton_cg_step(jnp.sum, X, damping=NAN),
        ValueError,
        "damping",
    ),
    (
        "newton_cg_step(damping inf)",
        lambda: ad.newton_cg_step(jnp.sum, X, damping=INF),
        ValueError,
        "damping",
    ),
    (
        "newton_cg_step(damping<0)",
        lambda: ad.newton_cg_step(jnp.sum, X, damping=-0.1),
        ValueError,
        "damping",
    ),
    (
        "newton_cg_step(damping str)",
        lambda: ad.newton_cg_step(jnp.sum, X, damping="1"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "damping",
    ),
    (
        "newton_cg_step(hvp_method)",
        lambda: ad.newton_cg_step(jnp.sum, X, hvp_method="x"),  # pyright: ignore[reportArgumentType]
        ValueError,
        "hvp_method",
    ),
    ("newton_cg(steps=0)", lambda: ad.newton_cg(jnp.sum, X, steps=0), ValueError, "steps"),
    ("newton_cg(steps float)", lambda: ad.newton_cg(jnp.sum, X, steps=2.0), TypeError, "steps"),  # pyright: ignore[reportArgumentType]
    ("newton_cg(tol nan)", lambda: ad.newton_cg(jnp.sum, X, tol=NAN), ValueError, "tol"),
    (
        "newton_cg(damping nan)",
        lambda: ad.newton_cg(jnp.sum, X, damping=NAN),
        ValueError,
        "damping",
    ),
    ("newton_cg(cg_iters)", lambda: ad.newton_cg(jnp.sum, X, cg_iters=-1), ValueError, "cg_iters"),
    # ---- sequence: masks and segments ----
    ("lengths_to_mask(lengths None)", lambda: sq.lengths_to_mask(None, 3), TypeError, "lengths"),  # pyright: ignore[reportArgumentType]
    ("lengths_to_mask(float)", lambda: sq.lengths_to_mask(jnp.ones(2), 3), TypeError, "lengths"),
    (
        "lengths_to_mask(negative)",
        lambda: sq.lengths_to_mask(jnp.asarray([-1]), 3),
        ValueError,
        "lengths",
    ),
    (
        "lengths_to_mask(too long)",
        lambda: sq.lengths_to_mask(jnp.asarray([4]), 3),
        ValueError,
        "lengths",
    ),
    (
        "lengths_to_mask(max_len<0)",
        lambda: sq.lengths_to_mask(jnp.asarray([1]), -1),
        ValueError,
        "max_len",
    ),
    (
        "lengths_to_mask(max_len float)",
        lambda: sq.lengths_to_mask(jnp.asarray([1]), 3.0),  # pyright: ignore[reportArgumentType]
        TypeError,
        "max_len",
    ),
    ("masked_sum(x None)", lambda: sq.masked_sum(None, M), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("masked_sum(mask float)", lambda: sq.masked_sum(X, jnp.ones(3)), TypeError, "mask"),
    ("masked_sum(mask shape)", lambda: sq.masked_sum(X, jnp.ones(4, bool)), ValueError, "mask"),
    ("masked_mean(x str)", lambda: sq.masked_mean("x", M), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("masked_mean(mask None)", lambda: sq.masked_mean(X, None), TypeError, "mask"),  # pyright: ignore[reportArgumentType]
    (
        "segment_softmax(scores None)",
        lambda: sq.segment_softmax(None, jnp.zeros(3, int), 2),  # pyright: ignore[reportArgumentType]
        TypeError,
        "scores",
    ),
    (
        "segment_softmax(scores int)",
        lambda: sq.segment_softmax(jnp.ones(3, int), jnp.zeros(3, int), 2),
        TypeError,
        "scores",
    ),
    (
        "segment_softmax(ids float)",
        lambda: sq.segment_softmax(X, jnp.zeros(3), 2),
        TypeError,
        "segment_ids",
    ),
    (
        "segment_softmax(ids range)",
        lambda: sq.segment_softmax(X, jnp.asarray([0, 1, 2]), 2),
        ValueError,
        "segment_ids",
    ),
    (
        "segment_softmax(ids shape)",
        lambda: sq.segment_softmax(X, jnp.zeros(2, int), 2),
        ValueError,
        "segment_ids",
    ),
    (
        "segment_softmax(num 0)",
        lambda: sq.segment_softmax(X, jnp.zeros(3, int), 0),
        ValueError,
        "num_segments",
    ),
    (
        "segment_softmax(num None)",
        lambda: sq.segment_softmax(X, jnp.zeros(3, int), None),  # pyright: ignore[reportArgumentType]
        TypeError,
        "num_segments",
    ),
    (
        "segment_softmax(where float)",
        lambda: sq.segment_softmax(X, jnp.zeros(3, int), 1, where=X),
        TypeError,
        "where",
    ),
    (
        "segment_mean(values None)",
        lambda: sq.segment_mean(None, jnp.zeros(3, int), 2),  # pyright: ignore[reportArgumentType]
        TypeError,
        "values",
    ),
    (
        "segment_mean(num float)",
        lambda: sq.segment_mean(X, jnp.zeros(3, int), 2.0),  # pyright: ignore[reportArgumentType]
        TypeError,
        "num_segments",
    ),
    # ---- sequence: returns ----
    (
        "discounted_returns(rewards None)",
        lambda: sq.discounted_returns(None, D, 0.9),  # pyright: ignore[reportArgumentType]
        TypeError,
        "rewards",
    ),
    (
        "discounted_returns(rewards str)",
        lambda: sq.discounted_returns("r", D, 0.9),  # pyright: ignore[reportArgumentType]
        TypeError,
        "rewards",
    ),
    (
        "discounted_returns(empty)",
        lambda: sq.discounted_returns(jnp.ones(0), jnp.ones(0), 0.9),
        ValueError,
        "rewards",
    ),
    (
        "discounted_returns(2-D)",
        lambda: sq.discounted_returns(jnp.ones((2, 4)), D, 0.9),
        ValueError,
        "rewards",
    ),
    (
        "discounted_returns(dones len)",
        lambda: sq.discounted_returns(R, jnp.zeros(3), 0.9),
        ValueError,
        "dones",
    ),
    (
        "discounted_returns(dones None)",
        lambda: sq.discounted_returns(R, None, 0.9),  # pyright: ignore[reportArgumentType]
        TypeError,
        "dones",
    ),
    (
        "discounted_returns(gamma nan)",
        lambda: sq.discounted_returns(R, D, NAN),
        ValueError,
        "gamma",
    ),
    (
        "discounted_returns(gamma inf)",
        lambda: sq.discounted_returns(R, D, INF),
        ValueError,
        "gamma",
    ),
    ("discounted_returns(gamma>1)", lambda: sq.discounted_returns(R, D, 1.01), ValueError, "gamma"),
    ("discounted_returns(gamma<0)", lambda: sq.discounted_returns(R, D, -0.1), ValueError, "gamma"),
    (
        "discounted_returns(gamma str)",
        lambda: sq.discounted_returns(R, D, "0.9"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "gamma",
    ),
    (
        "discounted_returns(gamma vector)",
        lambda: sq.discounted_returns(R, D, jnp.ones(2)),
        TypeError,
        "gamma",
    ),
    (
        "discounted_returns(truncated only)",
        lambda: sq.discounted_returns(R, D, 0.9, truncated=D),
        ValueError,
        "next_values",
    ),
    (
        "discounted_returns(next_values len)",
        lambda: sq.discounted_returns(R, D, 0.9, truncated=D, next_values=jnp.ones(5)),
        ValueError,
        "next_values",
    ),
    (
        "lambda_returns(values len)",
        lambda: sq.lambda_returns(R, D, jnp.ones(3), 0.9, 0.5),
        ValueError,
        "values",
    ),
    ("lambda_returns(lam nan)", lambda: sq.lambda_returns(R, D, V, 0.9, NAN), ValueError, "lam"),
    ("lambda_returns(lam 2)", lambda: sq.lambda_returns(R, D, V, 0.9, 2.0), ValueError, "lam"),
    (
        "lambda_returns(gamma nan)",
        lambda: sq.lambda_returns(R, D, V, NAN, 0.5),
        ValueError,
        "gamma",
    ),
    (
        "lambda_returns(truncated len)",
        lambda: sq.lambda_returns(R, D, V, 0.9, 0.5, truncated=jnp.zeros(2), next_values=V),
        ValueError,
        "truncated",
    ),
    ("gae(values len T)", lambda: sq.gae(R, D, V, 0.9, 0.9), ValueError, "values"),
    ("gae(values None)", lambda: sq.gae(R, D, None, 0.9, 0.9), TypeError, "values"),  # pyright: ignore[reportArgumentType]
    ("gae(lam -1)", lambda: sq.gae(R, D, jnp.ones(5), 0.9, -1.0), ValueError, "lam"),
    ("gae(gamma bool)", lambda: sq.gae(R, D, jnp.ones(5), True, 0.9), TypeError, "gamma"),
    (
        "gae(truncated only)",
        lambda: sq.gae(R, D, jnp.ones(5), 0.9, 0.9, truncated=D),
        ValueError,
        "next_values",
    ),
    # ---- sequence: loops ----
    (
        "bounded_while(cond)",
        lambda: sq.bounded_while(None, lambda c: c, 0.0, 3),  # pyright: ignore[reportArgumentType]
        TypeError,
        "cond_fun",
    ),
    (
        "bounded_while(body)",
        lambda: sq.bounded_while(lambda c: c < 1, 3, 0.0, 3),  # pyright: ignore[reportArgumentType]
        TypeError,
        "body_fun",
    ),
    (
        "bounded_while(max_steps 0)",
        lambda: sq.bounded_while(lambda c: c < 1, lambda c: c, 0.0, 0),
        ValueError,
        "max_steps",
    ),
    (
        "bounded_while(max_steps float)",
        lambda: sq.bounded_while(lambda c: c < 1, lambda c: c, 0.0, 2.0),  # pyright: ignore[reportArgumentType]
        TypeError,
        "max_steps",
    ),
    ("linear_recurrence(a None)", lambda: sq.linear_recurrence(None, X), TypeError, "a"),  # pyright: ignore[reportArgumentType]
    ("linear_recurrence(b str)", lambda: sq.linear_recurrence(X, "b"), TypeError, "b"),  # pyright: ignore[reportArgumentType]
    ("linear_recurrence(shapes)", lambda: sq.linear_recurrence(X, jnp.ones(4)), ValueError, "a"),
    ("piecewise(branches empty)", lambda: sq.piecewise(0, [], 1.0), ValueError, "branches"),
    ("piecewise(branch)", lambda: sq.piecewise(0, [jnp.sin, 3], 1.0), TypeError, "branches[1]"),  # pyright: ignore[reportArgumentType]
    (
        "piecewise_select(lengths)",
        lambda: sq.piecewise_select([M], [X, X]),
        ValueError,
        "conditions",
    ),
    # ---- sequence: RNNs and ODEs ----
    ("init_lstm(key str)", lambda: sq.init_lstm("k", 2, 3), TypeError, "key"),  # pyright: ignore[reportArgumentType]
    ("init_lstm(input_dim 0)", lambda: sq.init_lstm(0, 0, 3), ValueError, "input_dim"),
    ("init_lstm(hidden_dim float)", lambda: sq.init_lstm(0, 2, 3.0), TypeError, "hidden_dim"),  # pyright: ignore[reportArgumentType]
    ("init_gru(hidden_dim -1)", lambda: sq.init_gru(0, 2, -1), ValueError, "hidden_dim"),
    ("init_gru(key None)", lambda: sq.init_gru(None, 2, 3), TypeError, "key"),  # pyright: ignore[reportArgumentType]
    ("run_rnn(cell)", lambda: sq.run_rnn("lstm", LSTM, jnp.ones((4, 2)), None), TypeError, "cell"),  # pyright: ignore[reportArgumentType]
    ("run_rnn(xs None)", lambda: sq.run_rnn(sq.lstm_cell, LSTM, None, None), TypeError, "xs"),  # pyright: ignore[reportArgumentType]
    (
        "run_rnn(xs 1-D)",
        lambda: sq.run_rnn(sq.lstm_cell, LSTM, jnp.ones(4), None),  # pyright: ignore[reportArgumentType]
        ValueError,
        "xs",
    ),
    (
        "run_rnn(xs int)",
        lambda: sq.run_rnn(sq.lstm_cell, LSTM, jnp.ones((4, 2), int), None),  # pyright: ignore[reportArgumentType]
        TypeError,
        "xs",
    ),
    (
        "run_rnn(mask float)",
        lambda: sq.run_rnn(sq.lstm_cell, LSTM, jnp.ones((4, 2)), None, mask=jnp.ones(4)),  # pyright: ignore[reportArgumentType]
        TypeError,
        "mask",
    ),
    (
        "run_rnn(mask shape)",
        lambda: sq.run_rnn(sq.lstm_cell, LSTM, jnp.ones((4, 2)), None, mask=jnp.ones(3, bool)),  # pyright: ignore[reportArgumentType]
        ValueError,
        "mask",
    ),
    ("rk4_step(f)", lambda: sq.rk4_step(None, 0.0, 1.0, 0.1), TypeError, "f"),  # pyright: ignore[reportArgumentType]
    ("odeint_rk4(f)", lambda: sq.odeint_rk4(3, X, 0.0, 0.1, 3), TypeError, "f"),  # pyright: ignore[reportArgumentType]
    (
        "odeint_rk4(n_steps 0)",
        lambda: sq.odeint_rk4(oscillator, jnp.ones(2), 0.0, 0.1, 0, 1.0),
        ValueError,
        "n_steps",
    ),
    (
        "odeint_rk4(n_steps float)",
        lambda: sq.odeint_rk4(oscillator, jnp.ones(2), 0.0, 0.1, 3.0, 1.0),  # pyright: ignore[reportArgumentType]
        TypeError,
        "n_steps",
    ),
    (
        "odeint_rk4(dt nan)",
        lambda: sq.odeint_rk4(oscillator, jnp.ones(2), 0.0, NAN, 3, 1.0),
        ValueError,
        "dt",
    ),
    (
        "odeint_rk4(dt str)",
        lambda: sq.odeint_rk4(oscillator, jnp.ones(2), 0.0, "0.1", 3, 1.0),  # pyright: ignore[reportArgumentType]
        TypeError,
        "dt",
    ),
    (
        "odeint_rk4(t0 inf)",
        lambda: sq.odeint_rk4(oscillator, jnp.ones(2), INF, 0.1, 3, 1.0),
        ValueError,
        "t0",
    ),
    (
        "odeint_rk4(t0 None)",
        lambda: sq.odeint_rk4(oscillator, jnp.ones(2), None, 0.1, 3, 1.0),  # pyright: ignore[reportArgumentType]
        TypeError,
        "t0",
    ),
]


@pytest.mark.parametrize(("name", "call", "error", "argument"), ROWS, ids=[row[0] for row in ROWS])
def test_bad_call_names_the_argument(name, call, error, argument):
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error, f"{name}: {type(info.value).__name__}: {info.value}"
    assert f"`{argument}`" in str(info.value), (
        f"{name}: message does not name `{argument}`: {info.value}"
    )
    raised_in = traceback.extract_tb(info.tb)[-1].filename
    assert f"{os.sep}jaxwise{os.sep}" in raised_in, f"{name}: raised in {raised_in}, not by jaxwise"


def test_the_table_is_large_and_names_are_unique():
    assert len(ROWS) >= 150
    assert len({row[0] for row in ROWS}) == len(ROWS)


def test_numpy_scalars_are_accepted_where_numbers_are_expected():
    out = sq.discounted_returns(R, D, np.float32(0.5))  # pyright: ignore[reportArgumentType]
    assert out.shape == (4,)
    assert sq.lengths_to_mask(jnp.asarray([1]), np.int64(2)).shape == (1, 2)  # pyright: ignore[reportArgumentType]
    assert ad.cg_solve(lambda v: v, X, iters=np.int32(2)).shape == (3,)  # pyright: ignore[reportArgumentType]
    assert jax.tree.leaves(sq.init_gru(np.int64(0), np.int64(2), np.int64(3)))  # pyright: ignore[reportArgumentType]
