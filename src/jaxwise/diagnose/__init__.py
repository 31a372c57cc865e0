"""Runtime diagnosis: values baked into programs, and why a function recompiled.

:func:`captured_constants` traces a function and lists what its program holds fixed: arrays
captured from closures or module globals (bigger programs, stale values, no gradients) and
Python scalars read from globals or closures (their value at trace time is baked in; a later
change of the global is silently ignored). :func:`why_recompiled` runs a series of calls and
classifies every compile from the structured :class:`~jaxwise.compilation.CacheMiss` (kind,
argument, old, new), with the fix.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> f = jax.jit(lambda x: x * 2.0)
    >>> results = why_recompiled(f, [(jnp.ones(3),), (jnp.ones(4),)])
    >>> kinds = [r.kind for r in results]
    >>> kinds, results[1].argument
    (['first', 'shape'], 'x')
"""

from jaxwise.diagnose._constants import CapturedConstant as CapturedConstant
from jaxwise.diagnose._constants import CapturedScalar as CapturedScalar
from jaxwise.diagnose._constants import ConstantReport as ConstantReport
from jaxwise.diagnose._constants import captured_constants as captured_constants
from jaxwise.diagnose._recompiles import FIXES as FIXES
from jaxwise.diagnose._recompiles import Recompile as Recompile
from jaxwise.diagnose._recompiles import why_recompiled as why_recompiled

__all__ = [
    "FIXES",
    "CapturedConstant",
    "CapturedScalar",
    "ConstantReport",
    "Recompile",
    "captured_constants",
    "why_recompiled",
]
