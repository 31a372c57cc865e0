"""The one place that unpacks what a user's loss returns: ``loss``, ``(loss, aux)``,
``(loss, new_model_state)`` or ``(loss, (new_model_state, aux))``, checking its structure."""

from __future__ import annotations

from typing import Any

__all__ = ["describe", "unpack_loss_output"]


def describe(out: Any) -> str:
    """A short description of a value for an error message (``a tuple of 3``, ``dict``...)."""
    if hasattr(out, "shape") and hasattr(out, "dtype"):
        return f"a bare array of shape {tuple(out.shape)}"
    if isinstance(out, tuple):
        return f"a tuple of {len(out)}"
    return type(out).__name__


def unpack_loss_output(
    out: Any, *, model_state: bool, has_aux: bool, name: str
) -> tuple[Any, Any, Any]:
    """``(loss, new_model_state, aux)`` from a loss's output (``None`` for the absent parts).

    Args:
        out: what the loss returned.
        model_state: the loss returns a new model state.
        has_aux: the loss returns an auxiliary output.
        name: how the error names the loss (e.g. ``"`loss_fn` `mse`"``).

    Returns:
        ``(loss, new_model_state, aux)``.

    Raises:
        TypeError: ``out`` does not have the structure the flags ask for.

    Examples:
        >>> unpack_loss_output((1.0, "s"), model_state=True, has_aux=False, name="`f`")
        (1.0, 's', None)
    """
    if not model_state:
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError(
                    f"{name} with has_aux=True must return (loss, aux), got {describe(out)}"
                )
            return out[0], None, out[1]
        return out, None, None
    want = "(loss, (new_model_state, aux))" if has_aux else "(loss, new_model_state)"
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            f"{name} with model_state=True must return {want}, got {describe(out)}; a loss "
            "without model state needs model_state=False"
        )
    loss, rest = out
    if has_aux:
        if not (isinstance(rest, tuple) and len(rest) == 2):
            raise TypeError(
                f"{name} with model_state=True and has_aux=True must return {want}, got "
                f"(loss, {describe(rest)})"
            )
        return loss, rest[0], rest[1]
    return loss, rest, None
