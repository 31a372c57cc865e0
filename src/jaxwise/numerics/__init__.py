"""Numerically stable building blocks whose gradients never turn NaN.

The classic failure: ``jnp.where(x > 0, jnp.log(x), 0.0)`` has a finite value
but a NaN gradient at ``x = 0``, because the unselected branch's infinite
derivative is multiplied by a zero cotangent (``0 · ∞ = NaN``). The fix is
the *double where*: make the dangerous function see a safe input where it is
not selected. Everything here is safe under ``jit``, ``vmap``, ``grad`` and,
where they exist, second derivatives.

Masks follow ``jax.nn``: ``where=`` marks the entries that take part. Masked
logits are filled with ``finfo(dtype).min`` — never ``-inf``, because a fully
masked row would compute ``-inf - (-inf) = NaN``.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> float(jax.grad(lambda x: safe_sqrt(x))(0.0))
    0.0
"""

from jaxwise.numerics._core import double_where as double_where
from jaxwise.numerics._elementwise import entropy as entropy
from jaxwise.numerics._elementwise import logit as logit
from jaxwise.numerics._elementwise import round_ste as round_ste
from jaxwise.numerics._elementwise import safe_log as safe_log
from jaxwise.numerics._elementwise import safe_sqrt as safe_sqrt
from jaxwise.numerics._elementwise import sinc as sinc
from jaxwise.numerics._elementwise import straight_through as straight_through
from jaxwise.numerics._norms import cosine_similarity as cosine_similarity
from jaxwise.numerics._norms import safe_norm as safe_norm
from jaxwise.numerics._softmax import cross_entropy as cross_entropy
from jaxwise.numerics._softmax import log_softmax as log_softmax
from jaxwise.numerics._softmax import logsumexp as logsumexp
from jaxwise.numerics._softmax import mask_logits as mask_logits
from jaxwise.numerics._softmax import softmax as softmax

__all__ = [
    "cosine_similarity",
    "cross_entropy",
    "double_where",
    "entropy",
    "log_softmax",
    "logit",
    "logsumexp",
    "mask_logits",
    "round_ste",
    "safe_log",
    "safe_norm",
    "safe_sqrt",
    "sinc",
    "softmax",
    "straight_through",
]
