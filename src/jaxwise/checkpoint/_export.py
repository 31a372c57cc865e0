"""A saved step as a standalone orbax pytree, checked against its CRC-32 first.

Since the sixth round a single-process step's ``state`` item is itself an orbax pytree
(see ``_native``): plain orbax reads ``<step>/state`` in place. `export_orbax` still writes
any intact step (also one of the earlier single-file format) as an orbax pytree of its own,
with orbax's default (OCDBT) layout, after every leaf passed its CRC-32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from jaxwise._shared._checks import check_int, check_path
from jaxwise.checkpoint import _format as fmt
from jaxwise.checkpoint import _native as native
from jaxwise.checkpoint._format import CheckpointError, Damaged
from jaxwise.checkpoint._steps import Foreign, check_identity, check_run_id, latest_step, read_meta

__all__ = ["export_orbax"]


def _step_tree(root: Path, step: int, run_id: str | None) -> dict[str, Any]:
    """The nested host arrays of native step ``step`` (every leaf's CRC-32 checked)."""
    step_dir = root / str(step)
    if fmt.layout(step_dir) is None:
        raise CheckpointError(f"no complete checkpoint for step {step} in {root}")
    try:
        doc = read_meta(step_dir)
        check_identity(doc, step, run_id)
        if doc["format"] not in native.FORMATS:
            raise CheckpointError(
                f"checkpoint step {step} in {root} is already an orbax pytree (written by a "
                f"multi-process job): read {step_dir / fmt.STATE} with orbax"
            )
        arrays = [np.array(a) for a in native.host_arrays(step_dir, doc)]
    except Foreign as err:
        raise CheckpointError(f"checkpoint step {step} in {root}: {err}") from None
    except Damaged as err:
        raise CheckpointError(f"checkpoint step {step} in {root} is damaged: {err}") from None
    except OSError as err:
        raise CheckpointError(f"checkpoint step {step} in {root} is unreadable: {err}") from None
    return fmt.nest([(tuple(row["path"]), a) for row, a in zip(doc["leaves"], arrays)])


def export_orbax(
    path: str | Path,
    out: str | Path,
    step: int | None = None,
    *,
    run_id: str | None = None,
) -> Path:
    """Write a saved step as a plain orbax pytree at ``out`` (``StandardCheckpointer`` reads it).

    The tree keeps the state's nesting: ``{"params": {"dense": {"w": ...}}, "opt_state": ...,
    "step": ..., "key": ...}`` for a `TrainState` (a typed PRNG key as its raw key data;
    the characters orbax takes for separators escaped in a key: ``.`` as ``%2E``, ``/`` as
    ``%2F``, ``%`` as ``%25``). Every leaf is checked against its CRC-32 first. A step is
    readable by plain orbax in place (``<path>/<step>/state``, the same tree); export one
    to hand a standalone copy to orbax-based tools, or a step saved before the sixth round.
    [`restore`][jaxwise.checkpoint.restore] reads the exported directory too when no key
    needed escaping.

    Args:
        path: the checkpoint directory (a `Checkpointer`'s).
        out: a new directory for the orbax pytree (never an existing one).
        step: the step (default: the newest intact one, see
            [`latest_step`][jaxwise.checkpoint.latest_step]).
        run_id: take only the steps this run wrote.

    Returns:
        ``out`` as an absolute ``Path``.

    Raises:
        CheckpointError: no such step, a damaged step or another run's, or ``out`` exists.
        TypeError: ``path`` or ``out`` is not a path, ``step`` not an int.

    Examples:
        >>> import tempfile, pathlib, jax.numpy as jnp
        >>> import orbax.checkpoint as ocp
        >>> from jaxwise.checkpoint import save
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = save(d / "ck", {"enc": {"w": jnp.ones(2)}}, step=5)
        >>> out = export_orbax(d / "ck", d / "orbax-5")
        >>> ocp.StandardCheckpointer().restore(out)["enc"]["w"].tolist()
        [1.0, 1.0]
    """
    check_path(path, "path")
    check_path(out, "out")
    run_id = check_run_id(run_id)
    root, target = Path(path).absolute(), Path(out).absolute()
    if step is None:
        found = latest_step(root, run_id=run_id)
        if found is None:
            raise CheckpointError(f"no intact checkpoint in {root}")
        step = found
    step = check_int(step, "step", min_value=0)
    if target.exists():
        raise CheckpointError(f"`out` {target} exists: export into a new directory")
    tree = _step_tree(root, step, run_id)
    ocp = fmt.orbax()
    fmt.quiet_orbax()
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(target, tree)
        checkpointer.wait_until_finished()
    return target
