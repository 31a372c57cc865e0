"""Find where a NaN (or inf) comes from, and check values at run time.

``jax_debug_nans`` has gaps: it checks only the outputs of compiled programs, it ignores ``inf``
unless ``jax_debug_infs`` is set too, it stops checking already-compiled functions once ``vmap`` has
run anywhere in the process (JAX 0.12.0.1), and it stops at the *first* NaN — even one that a
``jnp.where`` later discards. [`locate_nan`][jaxwise.debug.locate_nan] does not rely on it: it runs
the call once (with the user's debug flags temporarily off), and if an output is not finite it
replays the function's jaxpr equation by equation, following the NaN's *provenance* from its
creation to the output. A NaN that a ``select_n`` (``jnp.where``) discards is not the culprit; the
report names the primitive that created the NaN reaching the output, whether that happened in the
forward or the backward pass, and the user's file:line.

Modules: ``_locate`` ([`locate_nan`][jaxwise.debug.locate_nan] and its replay), ``_frames`` (which
frame is the user's) and ``_runtime`` ([`checked`][jaxwise.debug.checked],
[`assert_finite`][jaxwise.debug.assert_finite]).

Examples:
    >>> import jax, jax.numpy as jnp
    >>> loss = lambda x: jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))
    >>> report = locate_nan(jax.grad(loss), jnp.zeros(2))
    >>> report.primitive, report.phase
    ('mul', 'backward')
"""

from jaxwise._shared._frames import Frame as Frame
from jaxwise.debug._locate import NanReport as NanReport
from jaxwise.debug._locate import locate_nan as locate_nan
from jaxwise.debug._runtime import assert_finite as assert_finite
from jaxwise.debug._runtime import checked as checked

__all__ = ["Frame", "NanReport", "assert_finite", "checked", "locate_nan"]
