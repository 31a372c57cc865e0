"""JAX's persistent compilation cache for CLI jobs, and honest compile counting.

A CLI job runs inside `persistent_cache`: compiled programs are stored under the
user's cache directory (``$XDG_CACHE_HOME/jaxwise/jax-cache``, ``~/.cache/...`` by default)
and a second run loads them instead of compiling. `CompileTally` counts the training
program's compilations and tells the two apart, from JAX's own monitoring events:
``/jax/compilation_cache/cache_hits`` fires inside a backend compile that was served from
the cache, so a compile event that follows a hit is a load, not a compilation. Both events
fire in the thread that compiles: the tally counts only the measuring thread's, so programs
compiled meanwhile in a background thread (``jobs._overlap``) are not mistaken for it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax

CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_SETTINGS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)

__all__ = ["CompileTally", "default_cache_dir", "persistent_cache"]


def default_cache_dir() -> Path:
    """``$JAXWISE_CACHE_DIR``, else ``$XDG_CACHE_HOME/jaxwise/jax-cache`` (``~/.cache/...``).

    Returns:
        The directory (not created).
    """
    explicit = os.environ.get("JAXWISE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jaxwise" / "jax-cache"


@contextmanager
def persistent_cache(directory: Path | None) -> Iterator[Path | None]:
    """Turn on JAX's persistent compilation cache in ``directory`` for the block (None: off).

    Every program is cached (no minimum compile time or size). The previous settings are
    restored afterwards, so a job run in-process (tests, notebooks) leaves JAX as it was.

    Args:
        directory: the cache directory (created if missing), or ``None`` for no cache (off
            for the block even where JAX's cache was configured outside, e.g. by
            ``JAX_COMPILATION_CACHE_DIR``: ``--no-cache`` means it).

    Yields:
        The directory in use: ``None`` when off or when the directory cannot be created
            (the job then runs without the cache).
    """
    from jax.experimental.compilation_cache import compilation_cache

    if directory is None:
        if jax.config.jax_compilation_cache_dir is None:
            yield None
            return
        saved_dir = jax.config.jax_compilation_cache_dir
        jax.config.update("jax_compilation_cache_dir", None)
        compilation_cache.reset_cache()
        try:
            yield None
        finally:
            jax.config.update("jax_compilation_cache_dir", saved_dir)
            compilation_cache.reset_cache()
        return

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (
        OSError
    ):  # e.g. a read-only home: run without the cache (the summary says cache_dir None)
        yield None
        return
    saved = {name: getattr(jax.config, name) for name in _SETTINGS}
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()
    try:
        yield directory
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


class CompileTally:
    """Compilations of the blocks measured with `measure`: fresh ones and cache loads.

    Attributes:
        compiled: programs XLA compiled.
        loaded: programs loaded from the persistent compilation cache.
        seconds: total backend time (compiling or loading).

    Examples:
        >>> import jax, jax.numpy as jnp, tempfile
        >>> x, tally = jnp.ones(4), CompileTally()
        >>> with persistent_cache(Path(tempfile.mkdtemp())), tally.measure():  # a new cache
        ...     _ = jax.jit(lambda v: v * 3)(x)
        >>> tally.total, tally.describe("f")
        (1, 'f compiled 1×')
    """

    def __init__(self) -> None:
        self.compiled = 0
        self.loaded = 0
        self.seconds = 0.0

    @property
    def total(self) -> int:
        """``compiled + loaded``."""
        return self.compiled + self.loaded

    @contextmanager
    def measure(self) -> Iterator[CompileTally]:
        """Count the backend compilations (and cache loads) of this thread inside the block.

        Yields:
            The tally itself.
        """
        thread = threading.get_ident()
        hits, compiles, seconds = [0], [0], [0.0]

        def on_event(event: str, **_: Any) -> None:
            if event == CACHE_HIT_EVENT and threading.get_ident() == thread:
                hits[0] += 1

        def on_duration(event: str, duration_secs: float, **_: Any) -> None:
            if event == COMPILE_EVENT and threading.get_ident() == thread:
                compiles[0] += 1
                seconds[0] += duration_secs

        jax.monitoring.register_event_listener(on_event)
        jax.monitoring.register_event_duration_secs_listener(on_duration)
        try:
            yield self
        finally:
            jax.monitoring.unregister_event_listener(on_event)
            jax.monitoring.unregister_event_duration_listener(on_duration)
        loaded = min(hits[0], compiles[0])
        self.loaded += loaded
        self.compiled += compiles[0] - loaded
        self.seconds += seconds[0]

    def describe(self, what: str) -> str:
        """``"epoch compiled 1×"``, ``"epoch loaded from the compilation cache 1×"``, or both.

        Args:
            what: the name of the program(s) counted.

        Returns:
            The phrase.
        """
        parts = []
        if self.compiled or not self.loaded:
            parts.append(f"compiled {self.compiled}×")
        if self.loaded:
            parts.append(f"loaded from the compilation cache {self.loaded}×")
        return f"{what} " + ", ".join(parts)

    def as_dict(self, cache_dir: Path | None) -> dict[str, Any]:
        """The tally for the CLI's JSON output.

        Args:
            cache_dir: the persistent cache directory in use, or ``None``.

        Returns:
            ``{compiled, loaded_from_cache, seconds, cache_dir}``.
        """
        return {
            "compiled": self.compiled,
            "loaded_from_cache": self.loaded,
            "seconds": self.seconds,
            "cache_dir": str(cache_dir) if cache_dir is not None else None,
        }
