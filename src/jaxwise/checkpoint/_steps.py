"""Which steps of a checkpoint directory may be taken: complete, intact, this run's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxwise._shared._checks import check_path
from jaxwise.checkpoint import _format as fmt
from jaxwise.checkpoint import _native as native
from jaxwise.checkpoint._format import CheckpointError, Damaged

__all__ = [
    "Foreign",
    "candidates",
    "check_identity",
    "check_run_id",
    "latest_step",
    "load_metadata",
    "read_meta",
    "step_problem",
]

FORMATS = (fmt.FORMAT, *native.FORMATS)


class Foreign(CheckpointError):
    """An intact step that is not this run's: another run's, or a renamed or copied directory."""


def read_meta(step_dir: Path) -> dict[str, Any]:
    """The sealed metadata of a jaxwise step, or `Damaged`."""
    try:
        doc = json.loads((step_dir / fmt.META / "metadata").read_text())
    except (OSError, ValueError) as err:
        raise Damaged(f"its metadata is unreadable ({type(err).__name__})") from None
    if not fmt.verify_seal(doc) or doc.get("format") not in FORMATS:
        raise Damaged("its metadata fails the integrity check (edited or corrupted)")
    return doc


def check_identity(doc: dict[str, Any], number: int | None, run_id: str | None) -> None:
    """`Foreign` when the step in directory ``number`` is not the step of ``run_id``."""
    if number is not None and doc.get("step") != number:
        raise Foreign(
            f"its metadata says step {doc.get('step')}: a renamed or copied step directory"
        )
    if run_id is not None and doc.get("run_id") != run_id:
        raise Foreign("written by another run")


def step_problem(step_dir: Path, number: int, run_id: str | None) -> CheckpointError | None:
    """Why the step in ``step_dir`` may not be taken (``Damaged``/``Foreign``), or None."""
    found = fmt.layout(step_dir)
    if found is None:
        return Damaged("it is incomplete (an interrupted write or a stray directory)")
    if found[0] == "orbax":
        return None if run_id is None else Foreign("written by plain orbax, not by this run")
    try:
        check_identity(read_meta(step_dir), number, run_id)
    except CheckpointError as err:
        return err
    return None


def check_run_id(run_id: Any) -> str | None:
    """``run_id`` when it is None or a non-empty string, else ``TypeError``."""
    if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()):
        raise TypeError(f"`run_id` must be a non-empty str or None, got {run_id!r}")
    return run_id


def latest_step(path: str | Path, *, run_id: str | None = None) -> int | None:
    """The newest step under ``path`` that is complete with intact metadata, or ``None``.

    A cheap check (the arrays are verified by [`restore`][jaxwise.checkpoint.restore]);
    steps written by plain orbax count too (unless ``run_id`` is given). A step directory
    whose metadata names another step (renamed or copied) never counts; with ``run_id``,
    only that run's steps count.

    Args:
        path: the checkpoint directory.
        run_id: count only the steps this run wrote.

    Returns:
        The step number, or ``None`` when there is no complete step.

    Examples:
        >>> import tempfile
        >>> latest_step(tempfile.mkdtemp()) is None
        True
    """
    check_path(path, "path")
    run_id = check_run_id(run_id)
    for step, step_dir in sorted(fmt.step_dirs(Path(path).absolute()).items(), reverse=True):
        if step_problem(step_dir, step, run_id) is None:
            return step
    return None


def _named_step(root: Path, steps: dict[int, Path], step: int, run_id: str | None) -> Any:
    if step not in steps:
        raise CheckpointError(
            f"no checkpoint for step {step} in {root}; available: {sorted(steps)}"
        )
    try:
        doc = read_meta(steps[step])
        check_identity(doc, step, run_id)
    except Foreign as err:
        raise CheckpointError(f"checkpoint step {step} in {root}: {err}") from None
    except Damaged as err:
        raise CheckpointError(f"checkpoint step {step} in {root} is damaged: {err}") from None
    return dict(doc["user"])


def load_metadata(
    path: str | Path, step: int | None = None, *, run_id: str | None = None
) -> dict[str, Any]:
    """The user metadata saved with a step (by default the newest step `latest_step` finds).

    After [`restore`][jaxwise.checkpoint.restore], pass the step that was restored (a
    ``TrainState``'s ``int(state.step)``) to read that step's metadata.

    Args:
        path: the checkpoint directory.
        step: the step (default: the newest one whose metadata is intact).
        run_id: take only the steps this run wrote.

    Returns:
        The ``metadata`` dict given to ``save``.

    Raises:
        CheckpointError: no such step, or the step is damaged or not ``run_id``'s (named).

    Examples:
        >>> import tempfile, jax.numpy as jnp
        >>> from jaxwise.checkpoint import save
        >>> directory = tempfile.mkdtemp()
        >>> _ = save(directory, {"w": jnp.ones(2)}, {"epoch": 3}, step=30)
        >>> load_metadata(directory), load_metadata(directory, step=30)
        ({'epoch': 3}, {'epoch': 3})
    """
    check_path(path, "path")
    run_id = check_run_id(run_id)
    root = Path(path).absolute()
    steps = fmt.step_dirs(root)
    if step is not None:
        return _named_step(root, steps, step, run_id)
    problems = []
    for number, step_dir in sorted(steps.items(), reverse=True):
        problem = step_problem(step_dir, number, run_id)
        if problem is None and fmt.layout(step_dir) == ("jaxwise", step_dir):
            return dict(read_meta(step_dir)["user"])
        problems.append(f"step {number} ({problem or 'written by plain orbax: no metadata'})")
    detail = f": {'; '.join(problems)}" if problems else ""
    raise CheckpointError(f"no intact checkpoint in {root}{detail}")


def candidates(root: Path, step: int | None) -> list[tuple[int | None, Path]]:
    """The step directories to try, newest first (``(None, root)`` for a bare orbax pytree)."""
    if not root.exists():
        raise CheckpointError(f"no checkpoint directory at {root}")
    if fmt.is_pytree_dir(root):
        return [(None, root)]  # ``path`` is itself a plain orbax pytree checkpoint
    steps = fmt.step_dirs(root)
    if step is not None:
        if step not in steps:
            raise CheckpointError(
                f"no checkpoint for step {step} in {root}; available: {sorted(steps)}"
            )
        return [(step, steps[step])]
    if not steps:
        raise CheckpointError(
            f"no complete checkpoint in {root} (an interrupted write leaves none)"
        )
    return [(number, steps[number]) for number in sorted(steps, reverse=True)]
