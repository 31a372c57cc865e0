"""User frames: the first frame outside JAX and the libraries around it.

A diagnostic points at the user's line, not at JAX, Optax, Flax, Equinox or jaxwise. This
module reads the traceback JAX stores with every jaxpr equation
(``eqn.source_info.traceback.frames``, for `locate_nan`) and tells library files from the
user's; it walks no live Python stack (``jaxwise.watch._patch`` finds the user's call sites,
``jaxwise._shared._jax`` reads JAX's own frames). Library directories are found with
``importlib.util.find_spec``, so nothing is imported to recognise them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import linecache
import os
import sysconfig
from collections.abc import Iterator
from typing import Any

__all__ = [
    "Frame",
    "is_library_file",
    "live_rule_frames",
    "short_path",
    "source_frames",
]

# Frames in these packages are never "the user's line".
LIBRARIES = ("jax", "jaxlib", "optax", "flax", "equinox", "chex", "orbax", "jaxwise")


@dataclasses.dataclass(frozen=True)
class Frame:
    """One user-code frame: file, line, function and the source line.

    Attributes:
        file: the file's path.
        line: the 1-based line number.
        function: the function's name.
        source: the source line, stripped.
    """

    file: str
    line: int
    function: str
    source: str

    @property
    def where(self) -> str:
        """``"file.py:LINE"`` (relative to the working directory when under it)."""
        return f"{short_path(self.file)}:{self.line}"

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}: {self.source}"


_JAXWISE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # jaxwise/


@functools.cache
def _package_dirs(names: tuple[str, ...]) -> tuple[str, ...]:
    dirs = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or ()) if spec else ():
            dirs.append(os.path.abspath(location) + os.sep)
    return tuple(dirs)


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    stdlib = sysconfig.get_paths().get("stdlib")
    extra = (os.path.abspath(stdlib) + os.sep,) if stdlib else ()
    return _package_dirs(LIBRARIES) + extra


@functools.lru_cache(maxsize=4096)
def is_library_file(path: str) -> bool:
    """True for a file of JAX, jaxlib, Optax, Flax, Equinox, Chex, Orbax, jaxwise or the
    standard library (``<frozen runpy>`` included); user code run from ``<string>``,
    ``<stdin>``, a doctest or a notebook cell is not."""
    if path.startswith("<"):
        return path.startswith("<frozen")
    return os.path.abspath(path).startswith(_library_dirs())


def short_path(path: str) -> str:
    """``path`` relative to the working directory when it is under it, else unchanged."""
    return _short_path(path, os.getcwd())


@functools.lru_cache(maxsize=4096)
def _short_path(path: str, cwd: str) -> str:
    try:
        relative = os.path.relpath(path, cwd)
    except ValueError:  # another drive (Windows)
        return path
    return path if relative.startswith("..") else relative


def source_frames(source_info: Any) -> tuple[Frame, ...]:
    """User frames of a jaxpr equation's ``source_info``, outermost first.

    Library frames are dropped; when nothing else is left (an operation made entirely
    inside a library, e.g. a NaN-producing Optax update called from jaxwise), the frames
    outside JAX are kept so that the report still points somewhere useful. Reads
    ``eqn.source_info.traceback.frames`` (``file_name``, ``function_name``, ``line_num``);
    tests/test_debug.py::test_user_frames_from_source_info fails if JAX changes it.
    """
    traceback = getattr(source_info, "traceback", None)
    if traceback is None:
        return ()
    frames = list(traceback.frames)
    chosen = [f for f in frames if not is_library_file(f.file_name)]
    if not chosen:
        skipped = _package_dirs(("jax", "jaxlib")) + (_JAXWISE_DIR,)
        chosen = [f for f in frames if not os.path.abspath(f.file_name).startswith(skipped)]
    return tuple(
        Frame(
            f.file_name,
            f.line_num,
            f.function_name,
            linecache.getline(f.file_name, f.line_num).strip(),
        )
        for f in reversed(chosen)
    )


_AD_FILE = os.path.join("interpreters", "ad.py")


def _inside_transpose(frames: list[Any]) -> bool:
    """True when the innermost user frame of a live traceback (innermost first) runs inside
    JAX's backward pass: user code that JAX called while transposing (a custom rule)."""
    for i, frame in enumerate(frames):
        if not is_library_file(frame.file_name):
            return any(f.file_name.endswith(_AD_FILE) for f in frames[i + 1 :])
    return False


@contextlib.contextmanager
def live_rule_frames() -> Iterator[None]:
    """While tracing inside the block, operations made by a ``custom_vjp`` backward rule keep
    the rule's own frames.

    When JAX transposes an equation it traces the new operations with the forward
    equation's frames (``source_info_util.user_context``), so everything a backward rule does
    would point at the forward call. Inside this block, an operation traced while user code
    runs inside JAX's backward pass gets the live frames instead. Replaces JAX's
    ``source_info_util.current`` (through ``jaxwise._shared._jax``) for the duration (restored on
    exit); tests/test_debug.py::test_nan_inside_custom_rules_points_into_the_rule fails if JAX
    changes it.
    """
    from jaxwise._shared._jax import live_traceback, source_info_current, with_source_info_current

    original = source_info_current()

    def current() -> Any:
        info = original()
        live = live_traceback()
        if live is not None and info.traceback is not live:
            frames = list(live.frames)
            if _inside_transpose(frames):
                return info.replace(traceback=live)
        return info

    with with_source_info_current(current):
        yield
