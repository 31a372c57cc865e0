"""pytest plugin of the TPU lane (``-p lane_progress``): a record that survives a stopped chunk.

JUnit XML is written only when pytest ends; a chunk stopped by its time guard (SIGINT) still
ends, one killed does not. This plugin appends, as each test finishes, one JSON line to
``$LANE_RECORD`` (``{"test", "unit", "outcome", "seconds", "message"}``) and, when the last
test of a unit (a file, or ``src/jaxwise``'s doctests) has run, ``{"done": unit}``: `lane.sh`
resumes a chunk by skipping the done units. At the start it writes the environment
(``$LANE_ENVIRONMENT``, JSON: Python, JAX, backend, device kind, libtpu) and, at the end and
after each unit, the compilation counts (``$LANE_COMPILES``: backend compiles, loads from
the persistent compilation cache, and their seconds, from ``jax.monitoring``).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import pytest

CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def unit_of(nodeid: str) -> str:
    """``tests/test_x.py::test_y[1]`` → ``tests/test_x.py``; a package doctest → ``src/jaxwise``."""
    path = nodeid.split("::", 1)[0]
    return "src/jaxwise" if path.startswith("src/jaxwise") else path


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict[str, Any]:
    """The run's environment (the chip is already open: conftest imported JAX)."""
    import jax

    devices = jax.devices()
    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "libtpu": _version("libtpu"),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "compilation_cache_dir": jax.config.jax_compilation_cache_dir,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


class Record:
    """The per-test lines, the done units and the compilation counts of one chunk."""

    def __init__(self, record: Path, compiles: Path | None) -> None:
        self.record, self.compiles_path = record, compiles
        self.counts = {"compiles": 0, "cache_loads": 0, "compile_seconds": 0.0}
        self._hit_pending = False

    def write(self, line: dict[str, Any]) -> None:
        with self.record.open("a") as f:
            f.write(json.dumps(line) + "\n")

    def on_event(self, event: str, **_: Any) -> None:
        if event == CACHE_HIT_EVENT:
            self._hit_pending = True

    def on_duration(self, event: str, duration_secs: float, **_: Any) -> None:
        if event == COMPILE_EVENT:  # follows a cache hit when it was a load
            key = "cache_loads" if self._hit_pending else "compiles"
            self.counts[key] += 1
            self.counts["compile_seconds"] += duration_secs
            self._hit_pending = False

    def save_counts(self) -> None:
        if self.compiles_path is not None:
            self.compiles_path.write_text(json.dumps(self.counts) + "\n")


class LanePlugin:
    """The hooks, one instance per pytest session (an inner pytester run gets its own)."""

    def __init__(self, record: Record, environment_path: str) -> None:
        self.record, self.environment_path = record, environment_path
        self.listening = False

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.environment_path:
            Path(self.environment_path).write_text(json.dumps(environment()) + "\n")
        if "jax" in sys.modules:
            import jax

            jax.monitoring.register_event_listener(self.record.on_event)
            jax.monitoring.register_event_duration_secs_listener(self.record.on_duration)
            self.listening = True

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        failed_setup = report.when == "setup" and not report.passed
        failed_teardown = report.when == "teardown" and report.failed
        if report.when != "call" and not failed_setup and not failed_teardown:
            return
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        message = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.failed:  # the exception's line ("AssertionError: ..."), else the last line
            crash = getattr(report.longrepr, "reprcrash", None)
            text = crash.message if crash is not None else report.longreprtext.strip()
            message = (text.splitlines() or [""])[0][:300]
        self.record.write(
            {
                "test": report.nodeid,
                "unit": unit_of(report.nodeid),
                "when": report.when,
                "outcome": outcome,
                "seconds": round(report.duration, 3),
                "message": message,
            }
        )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        yield
        unit = unit_of(item.nodeid)
        if nextitem is None or unit_of(nextitem.nodeid) != unit:
            self.record.write({"done": unit})
            self.record.save_counts()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.record.save_counts()
        if self.listening:
            import jax

            jax.monitoring.unregister_event_listener(self.record.on_event)
            jax.monitoring.unregister_event_duration_listener(self.record.on_duration)
            self.listening = False


def pytest_configure(config: pytest.Config) -> None:
    """With ``$LANE_RECORD`` set, this session records (its own `LanePlugin`)."""
    record = os.environ.get("LANE_RECORD")
    if not record:
        return
    compiles = os.environ.get("LANE_COMPILES")
    # absolute now: a test may change the working directory (pytester, monkeypatch.chdir)
    plugin = LanePlugin(
        Record(Path(record).resolve(), Path(compiles).resolve() if compiles else None),
        str(Path(os.environ["LANE_ENVIRONMENT"]).resolve())
        if os.environ.get("LANE_ENVIRONMENT")
        else "",
    )
    config.pluginmanager.register(plugin, "lane_progress_record")
