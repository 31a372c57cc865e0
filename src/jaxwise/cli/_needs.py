"""Command-line checks with the standard library only: option types, options without effect.

Imported by `jaxwise.cli` when it builds its parser (``--help`` stays free of NumPy and JAX).

>>> log_writers("jsonl,tensorboard")
('jsonl', 'tensorboard')
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "LOGS",
    "NEEDS",
    "fail_conditions",
    "hidden_sizes",
    "log_writers",
    "positive_int",
    "rule_codes",
    "without_effect",
]

LOGS = ("jsonl", "tensorboard", "mlflow")  # --log's writers (as jobs._fitting.LOGS)

NEEDS = {  # an option -> the option without which it has no effect
    "--clip-norm": "--dp",
    "--noise-multiplier": "--dp",
}


def log_writers(text: str) -> tuple[str, ...]:
    """``--log``'s value: writer names among `LOGS`, comma-separated (argparse's ``type``)."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in LOGS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown writer {', '.join(map(repr, unknown or [text]))}; expected a "
            f"comma-separated list of {', '.join(LOGS)}"
        )
    return names


def without_effect(
    args: argparse.Namespace,
    argv: Sequence[str],
    build: Callable[[], tuple[argparse.ArgumentParser, dict[str, Any]]],
) -> str | None:
    """The first option given that has no effect without another one, as an error message.

    "Given" as argparse read it (an abbreviation too): ``argv`` is parsed again by a fresh
    parser from ``build`` (the parser and its subcommands' parsers) with the defaults of
    those options unset.
    """
    dest = {option: option.lstrip("-").replace("-", "_") for option in (*NEEDS, *NEEDS.values())}
    idle = [
        o
        for o, needed in NEEDS.items()
        if hasattr(args, dest[o]) and not getattr(args, dest[needed])
    ]
    if not idle:
        return None
    probe, commands = build()
    unset = object()
    commands[args.command].set_defaults(**{dest[o]: unset for o in idle})
    again = probe.parse_args(argv)
    for option in idle:
        if getattr(again, dest[option]) is not unset:
            needed = NEEDS[option]
            return f"{option} has no effect without {needed}: add {needed} or drop {option}"
    return None


def hidden_sizes(text: str) -> tuple[int, ...]:
    """``--hidden``: comma-separated positive layer widths (argparse's ``type``)."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer widths like 64,64, got {text!r}"
        ) from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"expected positive layer widths like 64,64, got {text!r}")
    return sizes


def positive_int(text: str) -> int:
    """An integer option that must be at least 1 (argparse's ``type``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def rule_codes(text: str) -> list[str]:
    """``--select``/``--ignore``: comma-separated lint rule codes (argparse's ``type``)."""
    from jaxwise.lint import RULES

    codes = [c.strip().upper() for c in text.split(",") if c.strip()]
    unknown = [c for c in codes if c not in RULES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown rule code(s) {', '.join(unknown)}; known: {', '.join(RULES)}"
        )
    return codes


def fail_conditions(text: str) -> tuple[str, ...]:
    """``watch --fail-on``: conditions among recompile, nan, donation (argparse's ``type``)."""
    known = ("recompile", "nan", "donation")
    conditions = tuple(c.strip() for c in text.split(",") if c.strip())
    unknown = [c for c in conditions if c not in known]
    if unknown or not conditions:
        raise argparse.ArgumentTypeError(
            f"expected conditions among {','.join(known)}, got {text!r}"
        )
    return conditions
