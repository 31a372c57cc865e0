"""``jaxwise lint``: a JAX-specific static analyzer (Python AST only: nothing is imported or run).

Rules (stable codes; one module each, ``_jwNNN_*.py``):

========  ====================================================================
JW001     ``jax.jit`` created inside a function or loop body and called there
          (a lambda, closure, bound method or partial: a recompile every call)
JW002     a plain class (identity ``__hash__``) used as a static argument
JW003     the same PRNG key passed to two ``jax.random`` draws without a split
          (in functions and in module-level script code)
JW004     removed, legacy or non-existent JAX APIs (``jax.tree_map``, ``PRNGKey``)
JW005     a Python ``for`` over ``range(N ≥ 100)`` (literal or module constant)
          or over ``range(static_arg)`` inside a jitted function (unrolled)
JW006     a large module-level array read inside a jitted function (a constant)
JW007     ``jnp.where(c, log(x) / sqrt(x) / a/x, …)`` without an inner where
          (also through a precomputed mask and product denominators)
JW008     a Python scalar global that changes, read inside a jitted function
JW009     ``print`` inside a jitted function (runs once, at trace time)
JW010     ``jax.vmap(jax.grad(f))`` mapping the parameters with default in_axes
JW011     ``np.asarray`` view of an array that is later donated
========  ====================================================================

Suppress one line with ``# noqa: JW001`` (or a bare ``# noqa``). The package
imports neither JAX nor NumPy, so ``jaxwise lint`` starts fast.

Examples:
    >>> [f.code for f in lint_source("import jax\\nk = jax.random.PRNGKey(0)\\n")]
    ['JW004']
"""

from jaxwise.lint._core import Finding as Finding
from jaxwise.lint._core import LintError as LintError
from jaxwise.lint._driver import MAX_BYTES as MAX_BYTES
from jaxwise.lint._driver import RULES as RULES
from jaxwise.lint._driver import lint_paths as lint_paths
from jaxwise.lint._driver import lint_source as lint_source
from jaxwise.lint._driver import read_source as read_source

__all__ = ["MAX_BYTES", "RULES", "Finding", "LintError", "lint_paths", "lint_source", "read_source"]
