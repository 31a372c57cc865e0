"""pytest plugin: ``@pytest.mark.compile_budget(n, target=None, exact=False)``.

Registered through the ``pytest11`` entry point, so installing jaxwise is
enough. A marked test fails when its body compiles more than ``n`` jitted
programs (optionally only those of ``target``: a function name, a jitted
function or an object with ``.jitted``); with ``exact=True`` any other count
fails too. The failure lists every compile with the reason it happened.

Eager operations outside ``jit`` (``jnp.ones(3)``: programs defined inside
JAX, compiled once per process and shape) are not counted by default, so a
test gives the same result run alone (``-k``) and in its whole file; pass
``include_eager=True`` to count them.

Example::

    @pytest.mark.compile_budget(1, target="step")
    def test_training_compiles_once():
        for batch in batches:
            state = step(state, batch)

JAX is imported only when a marked test runs.
"""

from jaxwise._pytest_hooks import pytest_configure, pytest_runtest_call

__all__ = ["pytest_configure", "pytest_runtest_call"]
