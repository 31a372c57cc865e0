"""The one progress bar of jaxwise (``fit`` and the CLI jobs): rich, on stderr, imported lazily.

rich comes with the ``cli`` extra; without it, asking for a bar raises one ``ImportError``
naming the extra, and ``enabled=False`` needs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from jaxwise._shared._extras import require

__all__ = ["progress_bar"]


@contextmanager
def progress_bar(
    enabled: bool,
    total: int | None,
    description: str,
    fields: str,
    *,
    feature: str,
    completed: int = 0,
    **initial: float,
) -> Iterator[Callable[..., None]]:
    """A rich progress bar on stderr; yields ``advance(**values)`` (one step, new field values).

    Args:
        enabled: ``False`` yields a no-op ``advance`` and imports nothing.
        total: the number of steps (``None``: unknown).
        description: the text at the left of the bar.
        fields: the text at the right, a format string over the fields, e.g. ``"loss {loss:.4g}"``.
        feature: what shows the bar, for the message when rich is missing.
        completed: steps already done (a resumed run).
        **initial: the fields' values before the first step.

    Raises:
        ImportError: ``enabled`` and rich is not installed (one line naming the ``cli`` extra).

    Examples:
        >>> bar = progress_bar(True, 2, "train", "loss {loss:.3f}", feature="fit", loss=0.0)
        >>> with bar as advance:  # the bar is drawn on stderr
        ...     advance(loss=1.0)
        ...     advance(loss=0.5)
    """
    if not enabled:
        yield lambda **_: None
        return
    console = require("rich.console", extra="cli", feature=feature)
    rich = require("rich.progress", extra="cli", feature=feature)
    columns = (
        rich.TextColumn("{task.description}"),
        rich.BarColumn(),
        rich.MofNCompleteColumn(),
        rich.TextColumn(re.sub(r"\{(\w+)", r"{task.fields[\1]", fields)),
        rich.TimeElapsedColumn(),
    )
    with rich.Progress(*columns, console=console.Console(stderr=True)) as bar:
        task = bar.add_task(description, total=total, completed=completed, **initial)
        yield lambda **values: bar.update(task, advance=1, **values)
