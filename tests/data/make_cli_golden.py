"""Writes tests/data/cli_golden-jax<version>.npz: the CLI jobs' parameters before `train.fit`.

Run once against jaxwise at commit 96af08f (the CLI's own epoch loop, ``jobs/_loop.py``):

    git archive 96af08f src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python tests/data/make_cli_golden.py

`tests/test_cli_fit.py` checks that the jobs, now run by `train.fit`, train the same models
for the same seed (the same programs on the same data: equal to float32 rounding).
"""

import csv
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

from jaxwise.cli._jobs import spiral, tabular


def blobs_csv(path: Path) -> Path:
    """120 rows, 4 features, 3 classes (string labels), from a fixed seed."""
    rng = np.random.default_rng(7)
    centres = rng.normal(scale=3.0, size=(3, 4))
    y = rng.integers(0, 3, size=120)
    x = centres[y] + rng.normal(size=(120, 4))
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["f0", "f1", "f2", "f3", "colour"])
        for row, label in zip(x, y):
            writer.writerow([f"{v:.6f}" for v in row] + [("red", "green", "blue")[label]])
    return path


CONFIGS = {  # name -> TabularConfig settings (besides path, label, out)
    "train": {"hidden": (8, 8), "epochs": 6, "batch_size": 16, "seed": 3},
    "early": {"hidden": (8,), "epochs": 40, "batch_size": 16, "lr": 0.2, "early_stopping": 2},
    "dp": {"hidden": (8,), "epochs": 3, "batch_size": 16, "dp": True, "seed": 1},
}


def train_params(csv_path: Path, out: Path, settings: dict) -> list[np.ndarray]:
    cfg = tabular.TabularConfig(
        str(csv_path),
        "colour",
        out=str(out),
        progress=False,
        plots=False,
        cache=False,
        **settings,
    )
    with tabular.run_dir(cfg, tabular.TRAIN_OUTPUTS, "train") as run:
        fitted = tabular.fit(tabular.prepare(cfg, run))
    return [np.asarray(leaf) for leaf in jax.tree.leaves(fitted.params)]


def spiral_params() -> list[np.ndarray]:
    cfg = spiral.SpiralConfig(
        epochs=3, n_per_class=40, batch_size=32, out=None, progress=False, cache=False
    )
    from jaxwise.cli._jobs._overlap import overlapped

    with overlapped() as background:
        run = spiral.prepare(cfg, background)
        spiral.fit(run)
    return [np.asarray(leaf) for leaf in jax.tree.leaves(run.state.params)]


def main() -> None:
    arrays = {}
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = blobs_csv(Path(tmp) / "blobs.csv")
        for name, settings in CONFIGS.items():
            for i, leaf in enumerate(train_params(csv_path, Path(tmp) / name, settings)):
                arrays[f"{name}/{i}"] = leaf
    for i, leaf in enumerate(spiral_params()):
        arrays[f"spiral/{i}"] = leaf
    name = f"cli_golden-jax{jax.__version__}.npz"  # one file per JAX: see tests/goldens.py
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name(name)
    np.savez(target, **arrays)
    print(f"wrote {len(arrays)} arrays to {target}")


if __name__ == "__main__":
    main()
