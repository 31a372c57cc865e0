"""Runtime diagnosis: values baked into programs, and why a function recompiled.

[`captured_constants`][jaxwise.diagnose.captured_constants] traces a function and lists what its
program holds fixed: arrays captured from closures or module globals (bigger programs, stale values,
no gradients) and Python scalars read from globals or closures (their value at trace time is baked
in; a later change of the global is silently ignored).
[`why_recompiled`][jaxwise.diagnose.why_recompiled] runs a series of calls and returns, per call,
the structured [`CacheMiss`][jaxwise.compilation.CacheMiss] (kind, argument, old, new) of every
compile it caused; [`fix_for`][jaxwise.diagnose.fix_for] gives the fix for a miss.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> f = jax.jit(lambda x: x * 2.0)
    >>> [first], [second] = why_recompiled(f, [(jnp.ones(3),), (jnp.ones(4),)])
    >>> first.kind, second.kind, second.argument
    ('first', 'shape', 'x')
"""

from jaxwise.diagnose._constants import CapturedConstant as CapturedConstant
from jaxwise.diagnose._constants import CapturedScalar as CapturedScalar
from jaxwise.diagnose._constants import ConstantReport as ConstantReport
from jaxwise.diagnose._constants import captured_constants as captured_constants
from jaxwise.diagnose._recompiles import fix_for as fix_for
from jaxwise.diagnose._recompiles import why_recompiled as why_recompiled

__all__ = [
    "CapturedConstant",
    "CapturedScalar",
    "ConstantReport",
    "captured_constants",
    "fix_for",
    "why_recompiled",
]
