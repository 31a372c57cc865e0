"""Accuracy of jaxwise's diagnostics on its own corpus of real-code cases.

Four tables:

- recompile explanations: does ``jaxwise.watch`` give the exact (kind, argument, old, new)
  of the last compile, for static, shape, dtype, weak-type, structure, new-function, sharding,
  config and donation causes, through ``jax.jit``, ``nnx.jit``, ``filter_jit`` and jaxwise
  steps (tests/watch_corpus.py, ``RECOMPILES``);
- NaN location: does ``locate_nan`` name the exact primitive, phase and line of the user's
  code, through loops, branches, checkpoint, custom rules, Optax, Flax, Equinox and
  ``shard_map`` (``NANS``);
- donation: does a watch report exactly the failed donations of a block, with the user's name
  for the array and the right cause, and nothing for the look-alikes (``DONATIONS``);
- lint: precision and recall per rule on tests/lint_cases/ (positives and look-alike
  negatives; each file states its expected findings).

tests/test_watch_corpus.py and tests/test_lint.py assert every case; this script scores them.
"""

import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import jax
from common import main_guard, table, write_section

jax.config.update("jax_num_cpu_devices", 8)  # as the test suite: device and mesh cases
TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))


def score_cases(cases) -> tuple[int, list[str], float]:
    """(right, names of the wrong cases, seconds)."""
    right, wrong = 0, []
    start = time.perf_counter()
    for case in cases:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = case.run()
        except Exception as err:  # a crash is a wrong answer
            got = f"{type(err).__name__}: {err}"
        if got == case.expected:
            right += 1
        else:
            wrong.append(case.name)
    return right, wrong, time.perf_counter() - start


def _expected(path: Path) -> list[tuple[str, int]]:
    spec = path.read_text().splitlines()[0].split(":", 1)[1].split()
    return [] if spec == ["-"] else [(c.split("@")[0], int(c.split("@")[1])) for c in spec]


def lint_scores() -> tuple[list[list[str]], tuple[int, int, int, int, int]]:
    from jaxwise.lint import RULES, lint_source

    tp, fp, fn = Counter(), Counter(), Counter()
    positives = negatives = 0
    for path in sorted((TESTS / "lint_cases").glob("*.py")):
        want = Counter(_expected(path))
        positives += "_pos_" in path.name
        negatives += "_neg_" in path.name
        found = Counter((f.code, f.line) for f in lint_source(path.read_text(), str(path)))
        for (code, _), n in (found & want).items():
            tp[code] += n
        for (code, _), n in (found - want).items():
            fp[code] += n
        for (code, _), n in (want - found).items():
            fn[code] += n
    rows = []
    for code in RULES:
        found, wanted = tp[code] + fp[code], tp[code] + fn[code]
        precision = tp[code] / found if found else 1.0
        recall = tp[code] / wanted if wanted else 1.0
        rows.append([code, tp[code], fp[code], fn[code], f"{precision:.2f}", f"{recall:.2f}"])
    totals = (sum(tp.values()), sum(fp.values()), sum(fn.values()), positives, negatives)
    return rows, totals


def run() -> None:
    import watch_corpus

    rows = []
    for title, cases in watch_corpus.ALL.items():
        right, wrong, seconds = score_cases(cases)
        rows.append(
            [
                title,
                len(cases),
                right,
                f"{right / len(cases):.2f}",
                ", ".join(wrong) or "-",
                f"{seconds:.1f} s",
            ]
        )
    lint_rows, (tp, fp, fn, positives, negatives) = lint_scores()
    body = (
        table(["diagnostic", "cases", "right", "accuracy", "wrong", "time"], rows)
        + "\n\n### Lint, per rule\n\n"
        + table(
            ["rule", "true positives", "false positives", "missed", "precision", "recall"],
            lint_rows,
        )
        + f"\n\nAll rules: precision {tp / max(1, tp + fp):.2f}, recall {tp / max(1, tp + fn):.2f} "
        f"on {positives} positive and {negatives} look-alike negative files "
        "(tests/lint_cases/)."
    )
    write_section("diagnostics_corpus", "Diagnostics accuracy on the corpus", body)


if __name__ == "__main__":
    main_guard(run)
