"""Overlap a job's compilations: programs compile ahead of their first call, in a second thread.

XLA compiles with the GIL released, so on a machine with two or more cores a program
compiled in a background thread costs no wall time while the main thread compiles or runs
another one. A job builds its initial state and compiles its evaluation and verification
programs in the background while the main thread compiles the training program; each call
then finds its program compiled (``jax.jit(f).lower(...).compile()`` fills the cache that
``f(...)`` reads).

Examples:
    >>> import jax, jax.numpy as jnp
    >>> double = jax.jit(lambda x: 2 * x)
    >>> with overlapped() as background:
    ...     ready = background.submit(precompile, double, jax.ShapeDtypeStruct((3,), jnp.float32))
    ...     ready.result()
    >>> double(jnp.ones(3)).tolist()  # no compilation here: compiled in the background
    [2.0, 2.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

__all__ = ["ONE_SHOT_OPTIONS", "compile_one_shot", "overlapped", "precompile"]

# XLA options for a program that runs once or a few times (the initial state, a final check):
# the backend's optimisation passes cost more compile time than they can save in running time.
ONE_SHOT_OPTIONS = {"xla_backend_optimization_level": 0}


def precompile(jitted: Any, *args: Any) -> None:
    """Compile ``jitted`` for ``args`` (arrays or ``jax.ShapeDtypeStruct``s) without running it.

    The next call with arguments of the same shapes, dtypes and shardings runs the compiled
    program: no tracing, no compilation.
    """
    jitted.lower(*args).compile()


def compile_one_shot(jitted: Any, *args: Any) -> Any:
    """``jitted`` compiled for ``args`` with `ONE_SHOT_OPTIONS`; call the result directly.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> square = compile_one_shot(jax.jit(lambda x: x * x), jnp.ones(2))
        >>> square(jnp.full(2, 3.0)).tolist()
        [9.0, 9.0]
    """
    return jitted.lower(*args).compile(compiler_options=ONE_SHOT_OPTIONS)


class _Pool(ThreadPoolExecutor):
    """A one-thread pool that remembers its tasks, so that none fails unnoticed."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="jaxwise-compile")
        self.tasks: list[Future[Any]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        task = super().submit(fn, *args, **kwargs)
        self.tasks.append(task)
        return task


@contextmanager
def overlapped() -> Iterator[ThreadPoolExecutor]:
    """One background thread for the block; every task submitted to it ends before the block does.

    Tasks run one after the other, in the order submitted. On an exception in the block the
    tasks not started yet are cancelled and the running one is waited for (a compilation
    cannot be interrupted), so no job leaves a thread compiling behind it. When the block
    ends normally, a task that failed raises its error there, even if nobody asked for its
    result.
    """
    pool = _Pool()
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    for task in pool.tasks:
        task.result()
