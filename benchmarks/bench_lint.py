"""``jaxwise lint``: throughput and precision on the installed jax and optax, precision/recall on
the corpus.

Throughput: files per second of ``lint_paths`` on each tree, next to the cost of what no linter
can avoid, reading and ``ast.parse`` of the same files in the same run (the peer here is Python's
own parser: ``lint / parse`` is what the analysis adds).

Precision: every finding on the trees is matched against ``LABELS``, findings read by hand and
judged true (the pitfall the rule names is there) or false. Rules with many findings are
sampled (``SAMPLE`` per rule and tree, fixed seed); a sampled finding without a label is listed
so that the labels are brought up to date when the rules change. Precision/recall on the corpus
(``tests/lint_cases``, each file's ``# expect: CODE@line``) is computed exactly.
"""

from __future__ import annotations

import ast
import collections
import gc
import random
import time
from pathlib import Path

import jax
import optax
from common import QUICK, main_guard, table, write_section

from jaxwise.lint import RULES, Finding, lint_paths, lint_source, read_source

SAMPLE = 10
CORPUS = Path(__file__).resolve().parents[1] / "tests" / "lint_cases"
_T, _F = True, False
# (path under site-packages, line, code) -> (true positive?, why). Read by hand, 2026-11-29,
# jax 0.12.0.1, optax 0.2.8.
LABELS: dict[tuple[str, int, str], tuple[bool, str]] = {
    # jax: Pallas GPU examples jit a nested function and call it: a recompile per call of the
    # example (run once there).
    ("jax/experimental/pallas/ops/gpu/reduce_scatter_mgpu.py", 203, "JW001"): (_T, "example"),
    ("jax/experimental/pallas/ops/gpu/reduce_scatter_mgpu.py", 226, "JW001"): (_T, "example"),
    ("jax/experimental/pallas/ops/gpu/all_gather_mgpu.py", 188, "JW001"): (_T, "example"),
    ("jax/example_libraries/optimizers.py", 318, "JW007"): (_T, "where(g_sq > 0, 1/sqrt(g_sq))"),
    ("jax/example_libraries/optimizers.py", 499, "JW007"): (_T, "where(accum > 0, 1/sqrt(accum))"),
    ("jax/example_libraries/optimizers.py", 572, "JW007"): (_T, "clip_grads: g * (max / norm)"),
    ("jax/experimental/ode.py", 82, "JW007"): (_T, "step-size heuristic d0 / d1, d1 tested"),
    ("jax/experimental/pallas/ops/tpu/flash_attention.py", 467, "JW007"): (_T, "1 / l_next"),
    ("jax/experimental/rnn.py", 354, "JW005"): (_T, "range(num_layers), num_layers static"),
    # optax
    ("optax/_src/linear_algebra.py", 122, "JW004"): (_T, "PRNGKey (legacy)"),
    ("optax/contrib/_sophia.py", 57, "JW004"): (_T, "PRNGKey (legacy)"),
    ("optax/losses/_segmentation_test.py", 29, "JW004"): (_T, "PRNGKey (legacy)"),
    ("optax/_src/transform.py", 1513, "JW007"): (_F, "denominator grad_sq_norm + eps > 0"),
    ("optax/_src/transform.py", 1747, "JW007"): (_T, "1 / vdot, vdot == 0 tested"),
    ("optax/_src/transform.py", 1773, "JW007"): (_T, "numerator / denominator, tested > 0"),
    ("optax/losses/_classification.py", 561, "JW007"): (_F, "log(targets): no gradient flows"),
    **{
        ("optax/losses/_segmentation_test.py", line, "JW003"): (
            _T,
            "normal and bernoulli/randint from one key (in a loop: also across iterations)",
        )
        for line in (44, 45, 65, 67, 134, 142, 143, 477, 486, 487, 494, 495, 508, 515)
    },
    # optax tests jit a local schedule/update/step (or a jax.vmap(...)) and call it: a recompile
    # for every run of the test (run once there).
    ("optax/schedules/_schedule_test.py", 265, "JW001"): (_T, "jit(schedule) in test"),
    ("optax/schedules/_schedule_test.py", 388, "JW001"): (_T, "jit(schedule) in test"),
    ("optax/schedules/_schedule_test.py", 600, "JW001"): (_T, "jit(schedule) in test"),
    ("optax/schedules/_schedule_test.py", 587, "JW001"): (_T, "jit(schedule) in test"),
    ("optax/schedules/_schedule_test.py", 344, "JW001"): (_T, "jit(schedule) in test"),
    ("optax/schedules/_schedule_test.py", 172, "JW001"): (_T, "jit(schedule) in test"),
    ("optax/schedules/_schedule_test.py", 524, "JW001"): (_T, "jit(schedule) in test"),
    ("optax/_src/alias_test.py", 402, "JW001"): (_T, "local step jitted in test"),
    ("optax/losses/_self_supervised_test.py", 121, "JW001"): (_T, "jit(vmap(loss)) in test"),
    ("optax/perturbations/_make_pert_test.py", 201, "JW001"): (_T, "jit(local fn) in test"),
}


def _relative(finding: Finding) -> tuple[str, int, str]:
    return finding.path.split("site-packages/")[-1], finding.line, finding.code


def _parse_only(files: list[Path]) -> float:
    """CPU seconds to read and ``ast.parse`` every file (the collector off, as in lint_paths)."""
    gc.disable()
    try:
        t0 = time.process_time()
        for path in files:
            ast.parse(read_source(path))
        return time.process_time() - t0
    finally:
        gc.enable()


def _throughput(name: str, root: Path, rounds: int = 2) -> tuple[list, list[Finding]]:
    """Parse-only and lint, alternated ``rounds`` times; the minimum CPU time of each (the
    least disturbed run on a shared machine)."""
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    parse_s, lint_s, wall_s = [], [], []
    for _ in range(rounds):
        parse_s.append(_parse_only(files))
        t0, w0 = time.process_time(), time.perf_counter()
        findings, errors, count = lint_paths([root])
        lint_s.append(time.process_time() - t0)
        wall_s.append(time.perf_counter() - w0)
    per_rule = collections.Counter(f.code for f in findings)
    best_lint, best_parse = min(lint_s), min(parse_s)
    row = [
        name,
        count,
        f"{best_lint:.1f} s",
        f"{count / best_lint:.0f}",
        f"{len(files) / best_parse:.0f}",
        f"{best_lint / best_parse:.2f}",
        f"{min(wall_s):.1f} s",
        len(errors),
    ]
    return row + [per_rule.get(code, 0) for code in RULES], findings


def _precision(name: str, findings: list[Finding]) -> tuple[list[list], list[str]]:
    rows, unlabeled = [], []
    by_rule: dict[str, list[Finding]] = collections.defaultdict(list)
    for f in sorted(findings, key=_relative):
        by_rule[f.code].append(f)
    for code, items in sorted(by_rule.items()):
        sample = items if len(items) <= SAMPLE else random.Random(0).sample(items, SAMPLE)
        verdicts = [LABELS.get(_relative(f)) for f in sample]
        unlabeled += [
            f"`{':'.join(map(str, _relative(f)))}` {f.message[:100]}"
            for f, v in zip(sample, verdicts)
            if v is None
        ]
        true = sum(1 for v in verdicts if v and v[0])
        false = sum(1 for v in verdicts if v and not v[0])
        judged = true + false
        rows.append(
            [name, code, len(items), judged, true, false, f"{true / judged:.2f}" if judged else "–"]
        )
    return rows, unlabeled


def _corpus() -> list[list]:
    counts = {code: collections.Counter() for code in RULES}
    for path in sorted(CORPUS.glob("*.py")):
        text = path.read_text()
        spec = text.splitlines()[0].split(":", 1)[1].split()
        want = collections.Counter(tuple(s.split("@")) for s in spec if s != "-")
        found = collections.Counter((f.code, str(f.line)) for f in lint_source(text, str(path)))
        for (code, _), n in (found & want).items():
            counts[code]["tp"] += n
        for (code, _), n in (found - want).items():
            counts[code]["fp"] += n
        for (code, _), n in (want - found).items():
            counts[code]["fn"] += n
        case = path.name[:5].upper()
        counts[case]["pos" if "_pos_" in path.name else "neg"] += 1
    rows = []
    for code, c in counts.items():
        precision = c["tp"] / (c["tp"] + c["fp"]) if c["tp"] + c["fp"] else float("nan")
        recall = c["tp"] / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] else float("nan")
        rows.append(
            [
                code,
                RULES[code],
                c["pos"],
                c["neg"],
                c["tp"],
                c["fp"],
                c["fn"],
                f"{precision:.2f}",
                f"{recall:.2f}",
            ]
        )
    return rows


_SPEED_HEADER = [
    "tree",
    "files",
    "lint CPU",
    "lint files/s",
    "parse-only files/s",
    "lint / parse",
    "lint wall",
    "unparsable",
    *RULES,
]
_SPEED_NOTE = (
    "Rates are files per CPU second (`time.process_time`, the best of 2 alternated runs): this "
    "2-core machine is shared by several processes, so wall time (given for context) mostly "
    "measures the queue. "
    "`parse-only`: reading and `ast.parse` of the same files in the same run, the floor for any "
    "AST linter; `lint / parse` is what the analysis adds."
)
_FALSE_NOTE = (
    "False positives judged: `optax/_src/transform.py:1513` (the denominator "
    "`grad_sq_norm + eps` cannot be 0) and `optax/losses/_classification.py:561` "
    "(`log(targets)` where no gradient flows through `targets`). JW002, JW006, JW008-JW011 find "
    "nothing in these trees (hashable configs, `lax` loops, arrays passed as arguments, no "
    "prints in jitted code); their recall is measured on the corpus."
)


def run() -> None:
    trees = [("optax", Path(optax.__file__).parent)]
    if not QUICK:
        trees.insert(0, ("jax", Path(jax.__file__).parent))
    speed, precision, unlabeled = [], [], []
    for name, root in trees:
        row, findings = _throughput(name, root)
        speed.append(row)
        rows, missing = _precision(name, findings)
        precision += rows
        unlabeled += missing
    corpus_header = [
        "rule",
        "what",
        "positive files",
        "near misses",
        "TP",
        "FP",
        "FN",
        "precision",
        "recall",
    ]
    parts = [
        table(_SPEED_HEADER, speed),
        _SPEED_NOTE,
        f"**Precision on the trees** (findings read by hand; up to {SAMPLE} per rule and tree, "
        "fixed seed):",
        table(["tree", "rule", "findings", "judged", "true", "false", "precision"], precision),
        "**Precision and recall on the corpus** (`tests/lint_cases`, exact code and line):",
        table(corpus_header, _corpus()),
        _FALSE_NOTE,
    ]
    if unlabeled:
        parts.append(
            "Sampled findings without a label (update `LABELS`):\n\n"
            + "\n".join(f"- {u}" for u in unlabeled)
        )
    write_section(
        "lint", "jaxwise lint: throughput and precision (jax, optax, corpus)", "\n\n".join(parts)
    )


if __name__ == "__main__":
    main_guard(run)
