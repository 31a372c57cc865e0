"""Command-line option checks, JAX-free: a bad option is refused before JAX is even imported.

Messages name the option as the user typed it (``--lr``), never an internal argument name.

>>> option_float(0.01, "--lr", min_value=0.0, min_inclusive=False)
0.01
>>> parameter_count((2, 64, 64, 3))
4547
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from jaxwise._shared._checks import UserError, check_float, check_int

MAX_SEED = 2**32

__all__ = [
    "MAX_SEED",
    "available_memory",
    "check_hidden",
    "check_training_options",
    "explicit_nans",
    "option_float",
    "option_int",
    "parameter_count",
]

# --------------------------------------------------------------------------
# Options: every value checked before any work, messages name the option
# --------------------------------------------------------------------------


def option_float(value: Any, option: str, **bounds: Any) -> float:
    """``check_float`` for a command-line option: a `UserError` naming ``option``."""
    try:
        return check_float(value, option, **bounds)
    except (TypeError, ValueError) as err:
        raise UserError(str(err).replace("`", "")) from None


def option_int(value: Any, option: str, **bounds: Any) -> int:
    """``check_int`` for a command-line option: a `UserError` naming ``option``."""
    try:
        return check_int(value, option, **bounds)
    except (TypeError, ValueError) as err:
        raise UserError(str(err).replace("`", "")) from None


def check_training_options(cfg: Any) -> None:
    """Checks shared by every training job's options (``--epochs`` … ``--noise-multiplier``)."""
    option_int(cfg.epochs, "--epochs", min_value=1, max_value=1_000_000)
    if cfg.batch_size is not None:
        option_int(cfg.batch_size, "--batch-size", min_value=1)
    option_int(cfg.seed, "--seed", min_value=0, max_value=MAX_SEED - 1)
    option_float(cfg.lr, "--lr", min_value=0.0, min_inclusive=False, max_value=10.0)
    option_float(cfg.clip_norm, "--clip-norm", min_value=0.0, min_inclusive=False, max_value=1e6)
    option_float(cfg.noise_multiplier, "--noise-multiplier", min_value=0.0, max_value=1e4)
    check_hidden(cfg.hidden)


def parameter_count(sizes: Sequence[int]) -> int:
    """Weights and biases of an MLP with layer widths ``sizes`` (input first).

    >>> parameter_count((2, 64, 64, 3))
    4547
    """
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def available_memory() -> int:
    """Bytes of memory available to this process (Linux ``MemAvailable``, else physical pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AV_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**40


TRAINING_COPIES = 6  # parameters, gradients, two Adam moments, the update, the donated swap


def check_hidden(hidden: Sequence[int], n_in: int = 1, n_out: int = 1) -> int:
    """Positive widths whose model fits in memory; returns the parameter count.

    Called once before the data is read (with 1 input and 1 output: a lower bound, so
    ``--hidden 100000,100000`` is refused at once) and again with the real sizes.
    """
    if not hidden or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in hidden):
        raise UserError(
            f"--hidden must be positive layer widths like 64,64, got {','.join(map(str, hidden))}"
        )
    count = parameter_count((n_in, *hidden, n_out))
    need = count * 4 * TRAINING_COPIES
    have = available_memory()
    if need > 0.8 * have:
        raise UserError(
            f"--hidden {','.join(map(str, hidden))}: the model has {count:.3g} parameters, about "
            f"{need / 1e9:.3g} GB to train (parameters, gradients, Adam moments), but only "
            f"{have / 1e9:.3g} GB of memory is available; choose smaller --hidden widths"
        )
    return count


# `jaxwise watch` options that take a value (everything before SCRIPT is an option of ours)
_WATCH_VALUED = ("--json", "--fail-on", "--warmup")


def explicit_nans(argv: Sequence[str]) -> list[str]:
    """Rewrite a bare ``--nans`` of ``jaxwise watch`` as ``--nans=stop``.

    ``--nans`` takes an optional value (``--nans=report``); written bare right before SCRIPT,
    argparse would read the script's name as that value.

    >>> explicit_nans(["watch", "--nans", "train.py", "--nans"])
    ['watch', '--nans=stop', 'train.py', '--nans']
    """
    out = list(argv)
    if "watch" not in out:
        return out
    i = out.index("watch") + 1
    while i < len(out) and out[i].startswith("-"):
        if out[i] == "--nans":
            out[i] = "--nans=stop"
        elif out[i] in _WATCH_VALUED:
            i += 1
        i += 1
    return out
