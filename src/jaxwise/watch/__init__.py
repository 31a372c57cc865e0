"""Watch any JAX program without changing it: recompiles, NaNs, donations, transfers, time.

``jaxwise watch train.py`` (or ``python -m jaxwise.watch train.py``) runs a script unchanged,
in-process, and reports per jitted function: calls, compiles and compile time, and every
recompile with its cause (kind, argument, old → new) and the user's call site; recompiles after
warm-up are flagged as steady-state recompiles. ``--nans`` locates the first NaN a jitted
function produces (primitive, phase, the user's line); donations JAX could not use and
jaxwise steps' donation errors are reported; ``--transfers`` counts host values copied to the
device per call site. In a notebook::

    with Watch() as w:
        train()
    print(w.report())

Each compile's cause is a [`compilation.CacheMiss`][jaxwise.compilation.CacheMiss] (the one
record of why something compiled); ``jaxwise.train`` reports its donation errors to the watch
through the typed event channel ``jaxwise._shared._events``.

Modules: ``_watch`` (`Watch`), ``_patch`` (the one place that replaces ``jax.jit`` and
``jax.pmap``, for the duration of a watch), ``_calls`` (per-call argument checks),
``_arguments`` (Equinox's arguments by the user's names), ``_donations`` (why a donation
failed), ``_nans`` (NaN checking), ``_report`` (the report and its JSON), ``_run``
(`run_script`: running a script, what ``jaxwise watch`` does).
"""

from jaxwise.watch._report import DonationFinding as DonationFinding
from jaxwise.watch._report import FunctionReport as FunctionReport
from jaxwise.watch._report import NanFinding as NanFinding
from jaxwise.watch._report import TransferSite as TransferSite
from jaxwise.watch._report import WatchReport as WatchReport
from jaxwise.watch._run import run_script as run_script
from jaxwise.watch._watch import Watch as Watch

__all__ = [
    "DonationFinding",
    "FunctionReport",
    "NanFinding",
    "TransferSite",
    "Watch",
    "WatchReport",
    "run_script",
]
