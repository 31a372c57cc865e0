"""Write ``checkpoint_format3/``: a checkpoint in the single-file layout jaxwise wrote until the
fifth round (``<step>/state/data``, format ``jaxwise-checkpoint-3``).

Run with the sources of commit 007ca54 (the last that wrote it) first on the path:
``git archive 007ca54 src | tar -x -C /tmp/old && PYTHONPATH=/tmp/old/src python
tests/data/make_checkpoint_format3.py``. ``tests/test_checkpoint_orbax_read.py`` rebuilds the
same tree with `tree` below and restores the fixture bit for bit.
"""

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp

OUT = Path(__file__).parent / "checkpoint_format3"


def tree():
    """The saved tree: nesting, a dotted key, several dtypes, a typed key, a scalar."""
    return {
        "params": {"enc.w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3, jnp.bfloat16)},
        "count": jnp.asarray(7, jnp.int32),
        "mask": jnp.asarray([True, False]),
        "key": jax.random.key(5),
    }


if __name__ == "__main__":
    from jaxwise.checkpoint import save

    shutil.rmtree(OUT, ignore_errors=True)
    save(OUT, tree(), {"epoch": 2}, step=4)
    (OUT / ".jaxwise-writer.lock").unlink()
