"""The CLI's plots (jaxwise.cli._plotting): valid PNGs, written atomically, pyplot untouched."""

import matplotlib
import matplotlib.image
import numpy as np

from jaxwise.cli._plotting import plot_confusion, plot_decision_boundary, plot_training


def _is_png(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    return image.ndim == 3 and min(image.shape[:2]) > 100


def test_three_plots_are_valid_pngs_and_leave_no_temporaries(tmp_path):
    backend = matplotlib.get_backend()
    losses = np.exp(-np.linspace(0, 5, 110)) + 0.01
    assert _is_png(plot_training(tmp_path / "loss.png", losses, 11, np.linspace(0, 1e-2, 110)))
    x = np.random.default_rng(0).normal(size=(60, 2)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)

    def proba(points):
        p = 1 / (1 + np.exp(-5 * points[:, 0]))
        return np.stack([1 - p, p], axis=1)

    assert _is_png(plot_decision_boundary(tmp_path / "b.png", proba, x, y, highlight=[0, 1]))
    assert _is_png(plot_confusion(tmp_path / "c.png", np.asarray([[5, 1], [2, 7]]), ("a", "b")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.png", "c.png", "loss.png"]
    assert matplotlib.get_backend() == backend


def test_confusion_plot_shows_the_most_confused_classes(tmp_path):
    from jaxwise.cli._plotting import confusion_focus, plot_confusion

    k = 300
    matrix = np.diag(np.full(k, 5))
    matrix[7, 250] = 4
    matrix[120, 3] = 2
    keep = confusion_focus(matrix, 20)
    assert len(keep) == 20 and {3, 7, 120, 250} <= set(keep.tolist())
    assert confusion_focus(matrix[:5, :5], 20).tolist() == [0, 1, 2, 3, 4]
    path = plot_confusion(tmp_path / "c.png", matrix, [f"class {i}" for i in range(k)])
    image = matplotlib.image.imread(path)
    assert max(image.shape[:2]) < 2000  # 20 classes drawn, not 300


def test_curves_plot_with_gaps_and_best_epoch(tmp_path):
    from jaxwise.cli._plotting import plot_curves

    history = [
        {
            "epoch": e,
            "loss": 1 / e,
            "accuracy": 0.5 + e / 20,
            "val_loss": None if e == 3 else 1.2 / e,
            "val_accuracy": 0.5 + e / 25,
        }
        for e in range(1, 8)
    ]
    assert _is_png(plot_curves(tmp_path / "curves.png", history, best_epoch=6))
