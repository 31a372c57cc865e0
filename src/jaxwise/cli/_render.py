"""Rich tables for a job's summary on the terminal (``--json`` prints the summary instead)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxwise._shared._extras import require

__all__ = ["render"]


_FEATURE = "jaxwise's summary tables (or --json)"


def _console() -> Any:
    rich_console = require("rich.console", extra="cli", feature=_FEATURE)
    return rich_console.Console(highlight=False)


def _table(title: str, columns: Sequence[str] = (), show_header: bool = True) -> Any:
    rich_table = require("rich.table", extra="cli", feature=_FEATURE)
    table = rich_table.Table(title=title, show_header=show_header)
    for col in columns:
        table.add_column(col)
    return table


def _fmt(value: Any, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    compile_info = summary.get("compile", {})
    fresh, loaded = (
        compile_info.get("compiled", summary["compiles"]),
        compile_info.get("loaded_from_cache"),
    )
    parts = [f"compiled {fresh}×"] if fresh or not loaded else []
    if loaded:
        parts.append(f"loaded from the compilation cache {loaded}×")
    compiled = ", ".join(parts)
    rows = []
    if "train_accuracy" in summary:
        rows.append(("train accuracy", _fmt(summary["train_accuracy"], ".4f")))
        held_out = "test accuracy" if summary["job"] == "spiral" else "validation accuracy"
        rows.append((held_out, _fmt(summary["val_accuracy"], ".4f")))
        rows.append(("final loss", _fmt(summary.get("final_loss"), ".5f")))
        rows.append(("skipped steps (non-finite)", f"{summary['skipped']} of {summary['steps']}"))
    if summary.get("best_epoch") is not None:
        rows.append(
            (
                "best epoch (validation loss)",
                f"{summary['best_epoch']}"
                + (" — stopped early" if summary.get("stopped_early") else ""),
            )
        )
    if "accuracy" in summary:
        rows.append(("accuracy", _fmt(summary["accuracy"], ".4f")))
    if "rows" in summary and summary["job"] == "predict":
        rows.append(("rows predicted", str(summary["rows"])))
    rows.append(("compilations of the program", compiled))
    if "backend" in summary:
        rows.append(("device", f"{summary['backend']} ({summary['device_kind']})"))
    rows += _phase_rows(summary)
    t = summary["timings"]
    if "train_s" in t:
        rows.append(
            (
                "time (total / training / compiling)",
                f"{t['total_s']:.1f} s / {t['train_s']:.1f} s / {t['compile_s']:.1f} s",
            )
        )
    if "dp" in summary:
        dp = summary["dp"]
        rows.append(
            (
                "privacy",
                f"ε = {_fmt(dp['epsilon'], '.2f')} at δ = {dp['delta']:g} "
                f"(σ = {dp['noise_multiplier']}, C = {dp['clip_norm']}, "
                f"q = {dp['sample_rate']:.4f}, {dp['steps']} steps)",
            )
        )
        if dp.get("mechanism", "dpsgd") != "dpsgd" or "adaptive_clip" in dp:
            rows.append(("privacy noise", _noise_line(dp)))
        if "epsilon_audit_lower_bound" in dp:
            rows.append(
                (
                    "privacy audit",
                    f"ε (theory) {_fmt(dp['epsilon'], '.2f')} vs ε lower bound (audit) "
                    f"{_fmt(dp['epsilon_audit_lower_bound'], '.2f')} at "
                    f"{dp['confidence']:.0%} confidence ({dp['canaries']} canaries)",
                )
            )
    rows += [(key.replace("_", " "), str(path)) for key, path in summary.get("outputs", {}).items()]
    return rows


def _noise_line(dp: dict[str, Any]) -> str:
    """``BandMF, 4 bands (cyclic Poisson, 4 groups): expected error 0.84x DP-SGD's at this ε``."""
    mechanism = dp.get("mechanism", "dpsgd")
    if mechanism == "bandmf":
        what = f"BandMF, {dp['bands']} bands (cyclic Poisson, {dp['groups']} groups)"
    elif mechanism == "blt":
        what = f"BLT, {dp['buffers']} buffers (cyclic Poisson, {dp['groups']} groups)"
    else:
        what = "DP-SGD (independent noise)"
    line = f"{what}: expected error {dp['expected_error_vs_dpsgd']:.2f}x DP-SGD's at this ε"
    if dp.get("mechanism_option") == "auto":
        line += " (chosen by --mechanism auto)"
    if "adaptive_clip" in dp:
        line += f"; adaptive clip at the {dp['adaptive_clip']['target_quantile']:g} quantile"
    return line


def _phase_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """``label-errors``: the final model and the out-of-fold phase, each timed and counted."""
    rows = []
    final = summary.get("final_model")
    if final is not None:
        rows.append(
            ("final model", f"{final['compiles']} compilation(s), {final['seconds']:.2f} s")
        )
    oof = summary.get("oof")
    if oof is not None:
        loaded = f" ({oof['loaded_from_cache']} from the cache)" if oof["loaded_from_cache"] else ""
        rows.append(
            (
                "out-of-fold phase",
                f"{oof['compiles']} compilation(s){loaded}, {oof['seconds']:.2f} s",
            )
        )
    if summary.get("num_issues") is not None:
        rows.append(("labels estimated wrong (confident learning)", str(summary["num_issues"])))
    return rows


def _print_examples(
    console: Any, title: str, rows: list[dict[str, Any]], columns: list[str]
) -> None:
    table = _table(title, columns)
    for row in rows:
        cells = []
        for col in columns:
            value = row.get(col)
            if isinstance(value, float):
                cells.append(f"{value:.4g}")
            elif isinstance(value, list):
                cells.append("(" + ", ".join(f"{v:.3f}" for v in value) + ")")
            else:
                cells.append(str(value))
        table.add_row(*cells)
    console.print(table)


def _print_confusion(console: Any, summary: dict[str, Any]) -> None:
    import numpy as np

    from jaxwise.cli._plotting import confusion_focus

    matrix = np.asarray(summary["confusion_matrix"])
    keep = confusion_focus(matrix)
    title = "confusion matrix (rows: true, columns: predicted)"
    if len(keep) < len(matrix):
        title += f": the {len(keep)} most confused of {len(matrix)} classes"
    classes = [str(summary["classes"][i]) for i in keep]
    table = _table(title, ["", *classes])
    for c, row in zip(classes, matrix[np.ix_(keep, keep)]):
        table.add_row(c, *map(str, row.tolist()))
    console.print(table)


def render(summary: dict[str, Any]) -> None:
    """Print a job's summary as rich tables on stdout."""
    console = _console()
    table = _table(f"jaxwise {summary['job']}", ["", ""], show_header=False)
    for key, value in _summary_rows(summary):
        table.add_row(key, value)
    console.print(table)
    if "checks" in summary:
        checks = _table("guarantees checked at run time", ["check", "result", "detail"])
        for name, check in summary["checks"].items():
            checks.add_row(
                name, "[green]PASS[/]" if check["ok"] else "[red]FAIL[/]", check["detail"]
            )
        console.print(checks)
    if summary.get("hard_examples"):
        _print_examples(
            console,
            "hardest training examples (largest per-example gradient norm)",
            summary["hard_examples"],
            ["index", "x", "true", "predicted", "p_true", "grad_norm", "loss"],
        )
    if summary.get("confusion_matrix") is not None:
        _print_confusion(console, summary)
    if summary.get("suspects"):
        _print_examples(
            console,
            f"suspected label errors (--method {summary.get('method', 'oof')})",
            summary["suspects"],
            ["row", "given_label", "suggested_label", "p_given", "grad_norm"],
        )


# --------------------------------------------------------------------------
