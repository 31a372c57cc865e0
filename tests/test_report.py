"""`jaxwise report` and `watch --html`: the HTML (escaping, sections, strict JSON input), the
CLI's errors, and the page as headless Chromium renders it (DOM, screenshot, console)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from jaxwise.cli import main
from jaxwise.report import (
    run_report_html,
    watch_report_html,
    write_run_report,
    write_watch_report,
)
from jaxwise.report._svg import Series, line_chart, nice_ticks

CHROMIUM = "/usr/bin/chromium"
EVIL = '<script>alert("x")</script>&'

WATCH = {
    "schema": 1,
    "functions": [
        {
            "name": EVIL,
            "where": "train.py:3",
            "calls": 7,
            "compiles": 3,
            "compile_seconds": 0.25,
            "misses": [
                {
                    "kind": "first",
                    "argument": "",
                    "old": "",
                    "new": "",
                    "where": None,
                    "steady_state": False,
                },
                {
                    "kind": "shape",
                    "argument": "x",
                    "old": "f32[3]",
                    "new": "f32[4]",
                    "where": "train.py:9",
                    "steady_state": True,
                },
            ],
        }
    ],
    "nans": [{"function": "step", "primitive": "log", "phase": "forward", "where": "t.py:4"}],
    "donations": [{"function": "step", "argument": "state.params['w']", "cause": "aliased"}],
    "transfers": [
        {
            "where": "t.py:6",
            "function": "step",
            "calls": 5,
            "transfers": 5,
            "bytes": 40,
            "arguments": ["n"],
        }
    ],
    "seconds": {"total": 2.0, "compiling": 0.5},
    "exit_code": 0,
}


def _run_dir(tmp_path: Path, *, dp=True, suspects=True, watch=True, metrics=True) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    if metrics:
        lines = [
            {
                "epoch": e,
                "loss": 1.0 / e,
                "val_loss": 1.2 / e,
                "accuracy": 0.5 + e / 20,
                "val_accuracy": None if e == 2 else 0.45 + e / 20,
                "lr": 0.01,
                "seconds": 0.1,
            }
            for e in range(1, 6)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = {
        "schema": 1,
        "job": "train",
        "compiles": 1,
        "compile": {"compiled": 1, "loaded_from_cache": 0, "seconds": 1.5},
        "train_accuracy": 0.75,
        "val_accuracy": 0.7,
        "final_loss": 0.2,
        "timings": {"total_s": 3.0, "train_s": 1.0, "compile_s": 1.5},
        "checks": {
            "compiles_once": {"ok": True, "detail": "1×"},
            EVIL: {"ok": False, "detail": EVIL},
        },
        "classes": ["a", EVIL],
        "confusion_matrix": [[5, 1], [2, 7]],
    }
    if dp:
        summary["dp"] = {
            "epsilon": 2.5,
            "delta": 1e-5,
            "noise_multiplier": 1.1,
            "clip_norm": 1.0,
            "sample_rate": 0.1,
            "steps": 50,
            "epsilon_audit_lower_bound": 0.4,
            "confidence": 0.95,
            "canaries": 50,
        }
    if suspects:
        summary.update(
            method="oof",
            num_issues=3,
            suspects=[
                {
                    "row": 4,
                    "given_label": EVIL,
                    "suggested_label": "a",
                    "p_given": 0.01,
                    "grad_norm": 9.0,
                }
            ],
        )
    (run / "summary.json").write_text(json.dumps(summary))
    marker = {
        "format": 1,
        "job": "train",
        "run_id": "abc",
        "options": {"label": EVIL, "epochs": 5},
        "data": {"sha256": "ff"},
    }
    (run / ".jaxwise-run.json").write_text(json.dumps(marker))
    if watch:
        (run / "watch.json").write_text(json.dumps(WATCH))
    return run


SECTIONS = (
    "curves",
    "compilation",
    "guarantees",
    "privacy",
    "label-issues",
    "confusion",
    "configuration",
    "watch-functions",
    "watch-findings",
    "watch-transfers",
)


def _ids(page: str) -> set[str]:
    return set(re.findall(r'<section id="([^"]+)"', page))


def test_every_section_present_and_data_escaped(tmp_path):
    page = run_report_html(_run_dir(tmp_path))
    assert set(SECTIONS) <= _ids(page)
    assert "<script" not in page  # EVIL appears only escaped
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in page
    assert "2.5" in page and "0.4" in page  # ε and the audit bound
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert 'src="http' not in page and "<link" not in page


def test_optional_sections_absent(tmp_path):
    page = run_report_html(_run_dir(tmp_path, dp=False, suspects=False, watch=False))
    ids = _ids(page)
    assert {"curves", "guarantees", "configuration"} <= ids
    assert not ids & {"privacy", "label-issues", "watch-functions", "plots"}


def test_summary_only_run_has_no_curves(tmp_path):
    ids = _ids(run_report_html(_run_dir(tmp_path, metrics=False)))
    assert "curves" not in ids and "guarantees" in ids


def test_embedded_png_plot(tmp_path):
    run = _run_dir(tmp_path)
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
    (run / "loss.png").write_bytes(png)
    (run / "confusion.png").write_bytes(b"not a png")  # skipped: not a PNG
    page = run_report_html(run)
    assert "plots" in _ids(page) and page.count("data:image/png;base64,") == 1


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("metrics.jsonl", '{"epoch": 1, "loss": NaN}\n', r"metrics.jsonl line 1: NaN"),
        ("metrics.jsonl", '{"epoch": 1}\n[1]\n', r"line 2: expected a JSON object"),
        ("metrics.jsonl", "{oops\n", r"metrics.jsonl line 1"),
        ("summary.json", '{"final_loss": Infinity}', r"summary.json: Infinity"),
        ("watch.json", '{"schema": 2}', r'"schema": 1'),
        ("watch.json", '{"schema": 1, "functions": 3}', r"'functions' must be a list"),
    ],
)
def test_strict_json_input(tmp_path, name, content, match):
    run = _run_dir(tmp_path)
    (run / name).write_text(content)
    with pytest.raises(Exception, match=match) as info:
        run_report_html(run)
    assert type(info.value).__name__ == "UserError"


def test_watch_page_from_dict_and_bad_documents():
    page = watch_report_html(WATCH)
    assert {"watch-functions", "watch-findings", "watch-transfers"} <= _ids(page)
    assert "steady-state recompile" in page and "donation to" in page and "NaN in" in page
    assert "<script" not in page
    bad = dict(WATCH, nans=[{"function": "f"}])
    with pytest.raises(ValueError, match=r"nans\[0\] lacks primitive, phase"):
        watch_report_html(bad)
    with pytest.raises(ValueError, match="'seconds' must be an object"):
        watch_report_html(dict(WATCH, seconds=None))


def test_watch_page_from_a_watch_report():
    import jax
    import jax.numpy as jnp

    from jaxwise.watch import Watch

    with Watch() as w:
        jax.jit(lambda x: x + 1)(jnp.ones(2))
    page = watch_report_html(w.report().to_json())
    assert "watch-functions" in _ids(page) and "&lt;lambda&gt;" in page
    assert "watch-transfers" not in _ids(page)  # transfers were not counted


def test_svg_chart():
    assert nice_ticks(0.0, 1.0, 5) == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    svg = line_chart(
        [Series("a<b", [1, 2, 3], [1.0, None, 3.0])], title="t", x_label="x", y_label="y"
    )
    assert "a&lt;b" in svg and svg.count("<circle") == 2  # the gap splits it in two points
    assert line_chart([Series("a", [1], [float("nan")])], title="t", x_label="x", y_label="y") == ""
    with pytest.raises(ValueError, match="2 x values but 1 y values"):
        line_chart([Series("a", [1, 2], [1.0])], title="t", x_label="x", y_label="y")


def test_write_replaces_a_report_never_another_file(tmp_path):
    run = _run_dir(tmp_path)
    path = write_run_report(run)
    assert path == run / "report.html"
    assert write_run_report(run) == path  # an earlier report is replaced
    other = tmp_path / "notes.html"
    other.write_text("<p>mine</p>")
    with pytest.raises(Exception, match="is not a jaxwise report"):
        write_run_report(run, other)
    assert other.read_text() == "<p>mine</p>"
    with pytest.raises(Exception, match="does not exist"):
        write_watch_report(WATCH, tmp_path / "missing" / "w.html")


def test_cli_report_and_errors(tmp_path, capsys):
    run = _run_dir(tmp_path)
    assert main(["report", str(run), "--out", str(tmp_path / "r.html"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"report": str(tmp_path / "r.html")}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no metrics there" in err[0]
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_cli_watch_html(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text(
        "import jax, jax.numpy as jnp\nf = jax.jit(lambda x: x * 2)\nfor i in range(3):\n"
        "    f(jnp.ones(i + 1))\n"
    )
    html = tmp_path / "w.html"
    assert main(["watch", "--html", str(html), str(script)]) == 0
    page = html.read_text()
    assert {"watch-functions", "watch-findings"} <= _ids(page) and "&lt;lambda&gt;" in page
    capsys.readouterr()
    assert main(["watch", "--html", str(tmp_path / "no" / "w.html"), str(script)]) == 2
    assert "--html" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# in a real browser
# ---------------------------------------------------------------------------


def _chromium(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(
            f"headless browser tests need Debian's chromium at {CHROMIUM} (apt-get "
            "install chromium); it is absent here"
        )
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


def _png_colours(path: Path) -> int:
    """Distinct RGB(A) pixel values of a non-interlaced 8-bit PNG (zlib only)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, ihdr = 8, [], b""
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        ihdr = body if kind == b"IHDR" else ihdr
        chunks += [body] if kind == b"IDAT" else []
        pos += 12 + length
    width, height = int.from_bytes(ihdr[:4], "big"), int.from_bytes(ihdr[4:8], "big")
    depth, colour = ihdr[8], ihdr[9]
    assert depth == 8 and colour in (2, 6)
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride, prev, seen = width * bpp, bytearray(width * bpp), set()
    for y in range(height):
        f, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % 4 == 0:
            seen.update(bytes(line[i : i + 3]) for i in range(0, stride, bpp * 2))
        prev = line
    return len(seen)


@pytest.mark.slow
def test_report_in_headless_chromium(tmp_path):
    run = _run_dir(tmp_path)
    page = write_run_report(run)
    url = page.resolve().as_uri()
    dom = _chromium(tmp_path, url, "--dump-dom")
    for ident in SECTIONS:
        assert f'id="{ident}"' in dom.stdout, ident
    assert dom.stdout.count("<svg") >= 3  # the loss, accuracy and lr charts
    console = [
        line
        for line in dom.stderr.splitlines()
        if "Uncaught" in line or "CONSOLE" in line or ":ERROR:CONSOLE" in line
    ]
    assert not console, console
    shot = tmp_path / "shot.png"
    _chromium(tmp_path, url, f"--screenshot={shot}", "--window-size=1366,900", "--hide-scrollbars")
    assert _png_colours(shot) > 20  # not blank: text, charts, badges


@pytest.mark.slow
def test_watch_page_in_headless_chromium(tmp_path):
    page = write_watch_report(WATCH, tmp_path / "watch.html")
    dom = _chromium(tmp_path, page.resolve().as_uri(), "--dump-dom")
    assert 'id="watch-functions"' in dom.stdout and "Uncaught" not in dom.stderr


def test_option_names_are_escaped(tmp_path):
    run = _run_dir(tmp_path, watch=False)
    marker = json.loads((run / ".jaxwise-run.json").read_text())
    marker["options"] = {"<script>alert(1)</script>": 1, "epochs": 5}
    (run / ".jaxwise-run.json").write_text(json.dumps(marker))
    page = run_report_html(run)
    assert "<script" not in page and "--&lt;script&gt;alert(1)&lt;/script&gt;" in page


def _polyline_xs(page: str) -> list[list[float]]:
    return [
        [float(p.split(",")[0]) for p in pts.split()]
        for pts in re.findall(r'<polyline class="line" stroke="[^"]+" points="([^"]+)"', page)
    ]


def test_repeated_and_out_of_order_epochs_are_sorted_last_wins(tmp_path):
    run = _run_dir(tmp_path, watch=False)
    lines = [{"epoch": e, "loss": float(e)} for e in (1, 2, 3, 4)]
    lines += [{"epoch": 3, "loss": 30.0}, {"epoch": 4, "loss": 40.0}, {"epoch": 5, "loss": 5.0}]
    lines.insert(0, lines.pop(2))  # epoch 3 first: out of order as well
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = json.loads((run / "summary.json").read_text())
    del summary["final_loss"]
    (run / "summary.json").write_text(json.dumps(summary))
    page = run_report_html(run)
    (xs,) = _polyline_xs(page)
    assert xs == sorted(xs) and len(xs) == 5  # one point per epoch, left to right
    assert "epoch 3 appears 2 times, epoch 4 appears 2 times" in page
    assert "last record is plotted" in page and "sorted by epoch" in page
    assert ">5<" in page.split("final loss")[1][:80]  # the last epoch's loss, not the file's
    from jaxwise.report._html import ordered_metrics

    ordered, _ = ordered_metrics(lines)
    assert [(r["epoch"], r["loss"]) for r in ordered] == [
        (1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 5.0)
    ]  # fmt: skip


def test_losses_near_float_max_are_plotted(tmp_path, capsys):
    run = _run_dir(tmp_path, watch=False)
    lines = [{"epoch": 1, "loss": 1e308}, {"epoch": 2, "loss": -1e308}, {"epoch": 3, "loss": 0.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    coords = re.findall(r'(?:points|cx|cy|x|y|x1|y1|x2|y2)="([^"]+)"', page.split("<svg")[1])
    numbers = [float(v) for c in coords for pair in c.split() for v in pair.split(",")]
    assert len(numbers) > 10 and all(map(math.isfinite, numbers))
    ticks = nice_ticks(-1e308, 1e308, 5)
    assert ticks[0] <= -1e308 and ticks[-1] >= 1e308 and all(map(math.isfinite, ticks))
    assert nice_ticks(-1.7e308, 1.7e308, 5)[-1] >= 1.7e308


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory that refuses new files (a read-only one; /sys/kernel when run as root)."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        path = Path("/sys/kernel")
        if not path.is_dir() or os.access(path, os.W_OK) and _creates(path):
            pytest.skip("no unwritable directory for root here")
        yield path
        return
    path = tmp_path / "read-only"
    path.mkdir()
    path.chmod(0o555)
    yield path
    path.chmod(0o755)


def _creates(path: Path) -> bool:
    try:
        (path / ".jaxwise-probe").touch()
    except OSError:
        return False
    (path / ".jaxwise-probe").unlink()
    return True


def _marking_script(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "ran.txt"
    script = tmp_path / "s.py"
    script.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    return script, marker


def test_watch_json_never_overwrites_the_script_or_another_file(tmp_path, capsys):
    script, marker = _marking_script(tmp_path)
    source = script.read_text()
    assert main(["watch", "--json", str(script), str(script)]) == 2
    assert "is the script itself" in capsys.readouterr().err
    assert script.read_text() == source and not marker.exists()  # refused before running
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}\n')
    assert main(["watch", "--json", str(notes), str(script)]) == 2
    assert "not a jaxwise watch report" in capsys.readouterr().err
    assert notes.read_text() == '{"mine": 1}\n'
    report = tmp_path / "w.json"
    assert main(["watch", "--json", str(report), str(script)]) == 0
    assert main(["watch", "--json", str(report), str(script)]) == 0  # its own report: replaced
    assert json.loads(report.read_text())["schema"] == 1


@pytest.mark.parametrize("option", ["--html", "--json"])
def test_watch_unwritable_output_refused_before_the_script_runs(
    tmp_path, capsys, unwritable_dir, option
):
    script, marker = _marking_script(tmp_path)
    target = unwritable_dir / "w.out"
    assert main(["watch", option, str(target), str(script)]) == 2
    err = capsys.readouterr().err
    assert f"{option} {target}: not writable" in err and ".tmp" not in err
    assert not marker.exists()


def test_report_unwritable_out_named_by_its_option(tmp_path, capsys, unwritable_dir):
    run = _run_dir(tmp_path, watch=False)
    target = unwritable_dir / "r.html"
    assert main(["report", str(run), "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"--out {target}: not writable" in err and ".tmp" not in err


def test_a_long_run_is_downsampled_keeping_first_last_and_extremes(tmp_path):
    """10,000 steps x 40 metrics: each curve drawn from at most 2 x 500 + 2 points (min-max
    buckets), every spike kept, and the page says so; the page stays small (it was ~120 bytes
    per point and metric: 10,000 x 200 metrics made 24 MB)."""
    run = tmp_path / "run"
    run.mkdir()
    steps, names = 10_000, [f"m{i:02d}" for i in range(40)]
    values = np.cumsum(np.random.default_rng(0).normal(size=(steps, len(names))), axis=0)
    values[4321, 7] = 1e4  # one spike, one dip
    values[8765, 7] = -1e4
    with (run / "metrics.jsonl").open("w") as f:
        for s in range(steps):
            f.write(json.dumps({"step": s + 1, **dict(zip(names, values[s].tolist()))}) + "\n")
    page = run_report_html(run)
    assert len(page.encode()) < 2 * 2**20  # 10 MB for 200 metrics
    assert "downsampled, as TensorBoard does" in page and "each of 500 runs of" in page
    charts = page.split("<figure>")[1:]
    assert len(charts) == len(names)
    for chart in charts:
        (points,) = re.findall(r'points="([^"]+)"', chart)
        pairs = [tuple(map(float, p.split(","))) for p in points.split()]
        assert len(pairs) <= 2 * 500 + 2
        xs = [x for x, _ in pairs]
        assert xs == sorted(xs) and xs[0] < xs[-1]  # in step order, first to last
    (spiky,) = re.findall(r'points="([^"]+)"', charts[7])
    ys = [float(p.split(",")[1]) for p in spiky.split()]
    assert min(ys) < 40 and max(ys) > 200  # the spike at the top, the dip at the bottom


def test_downsample_keeps_every_buckets_extremes():
    from jaxwise.report._svg import downsample

    rng = np.random.default_rng(1)
    ys = rng.normal(size=12_345)
    xs = np.arange(12_345, dtype=np.float64)
    kx, ky = downsample(xs, ys, buckets=100)
    width = -(-12_345 // 100)
    for b in range(100):  # float64 referee: each bucket's min and max are among the kept
        part = ys[b * width : (b + 1) * width]
        kept = ky[(kx >= b * width) & (kx < (b + 1) * width)]
        assert part.min() in kept and part.max() in kept
    assert (kx[0], kx[-1]) == (0.0, 12_344.0) and len(kx) <= 202
    short = np.arange(200.0)
    assert downsample(short, short, buckets=100)[0] is short  # short runs as they are
