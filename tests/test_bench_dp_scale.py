"""Smoke test: benchmarks/bench_dp_scale.py runs in its quick (CPU) mode and writes its table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_dp_scale.py"


@pytest.mark.slow
def test_bench_dp_scale_quick(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_dp_scale", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_dp_scale", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    monkeypatch.setenv("OUT", str(tmp_path))
    # the causal LM of the quick sizes: every method, the embedding table, jax-privacy (the
    # classifier runs the same programs without the table; `make bench` runs both); the
    # micro-batches of 16 are the micro-batched program at another size: not compiled again
    methods = [name for name in module.programs(module.QUICK[1], 4) if name != module.MICRO16]
    text = module.main(["--quick", "--n", "1", "--configs", "1", "--methods", ",".join(methods)])
    written = (tmp_path / "dp_scale.md").read_text()
    assert written == text
    assert (tmp_path / "results" / "cpu" / "dp_scale.md").read_text() == text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "ms |" in line]
    methods = {line.split(" | ")[2] for line in rows}
    assert {"non-private", "DP auto", "DP ghost", "DP vmap", module.MICRO} <= methods
    # every DP program on the quick configs ran (a time; no note but auto's plan)
    for line in rows:
        note = line.rstrip().rsplit(" | ", 1)[1].rstrip("| ").strip()
        if " | DP auto | " in line:
            assert note.startswith("auto = "), line
        else:
            assert note == "", line


@pytest.mark.slow
def test_bench_dp_scale_whole_step_quick(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_dp_scale", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_dp_scale", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    monkeypatch.setenv("OUT", str(tmp_path))
    text = module.main(["--quick", "--n", "1", "--whole-step"])
    assert (tmp_path / "dp_whole_step.md").read_text() == text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "ms |" in line]
    assert [line.split(" | ")[2] for line in rows] == ["non-private", "DP-SGD", "BandMF(8)"]
