"""Golden files, one per JAX version: bit for bit on the JAX that wrote them.

``tests/data/<name>_golden-jax<version>.npz`` is written by ``tests/data/make_<name>_golden.py``
from an old commit of jaxwise under that JAX. XLA's code for the same program changes between
JAX releases (0.12.1 transposes a division differently from 0.12.0, say), so training numbers
move by float32 rounding from one release to the next: a test compares bit for bit against the
file of the JAX it runs on, and with a tolerance against the newest file on a JAX without one.
"""

from pathlib import Path

import jax
import numpy as np

DATA = Path(__file__).parent / "data"


def _version(path: Path) -> tuple[int, ...]:
    text = path.stem.rsplit("-jax", 1)[1]
    return tuple(int(part) for part in text.split("."))


def load(name: str) -> tuple[np.lib.npyio.NpzFile, bool]:
    """``(arrays, exact)``: the golden file of the running JAX (exact) or the newest one."""
    mine = DATA / f"{name}_golden-jax{jax.__version__}.npz"
    if mine.exists():
        return np.load(mine), True
    files = sorted(DATA.glob(f"{name}_golden-jax*.npz"), key=_version)
    if not files:
        raise FileNotFoundError(f"no golden file {name}_golden-jax*.npz in {DATA}")
    return np.load(files[-1]), False
