"""Data generated in code (spiral, blobs, label noise) and a seeded train/test split.

NumPy's seeded ``Generator`` only: no JAX, identical on every machine for a given seed.
"""

from __future__ import annotations

import numpy as np

from jaxwise._shared._checks import check_array, check_float, check_int

__all__ = ["flip_labels", "make_blobs", "make_spiral", "train_test_split"]


def _check_positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}")
    return int(value)


def make_spiral(
    n_per_class: int = 600, n_classes: int = 3, noise: float = 0.15, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Interleaved spiral arms: the classic non-linearly-separable toy problem.

    Arm ``j`` has points at radius ``r ∈ [0, 1]`` (evenly spaced) and angle
    ``4j + 4r + ε``, ``ε ~ N(0, noise²)``; ``x = r (sin θ, cos θ)``.

    Args:
        n_per_class: points per arm, >= 1.
        n_classes: arms (classes), >= 1.
        noise: standard deviation of the angle noise, finite and >= 0.
        seed: NumPy seed, >= 0.

    Returns:
        ``(x, y)``: float32 ``(n_classes · n_per_class, 2)`` and int32 labels, arm by arm.

    Raises:
        ValueError: a count is not a positive int, ``noise`` is negative or not finite, or
            ``seed`` is negative.
        TypeError: ``noise`` or ``seed`` has the wrong type.

    Examples:
        >>> x, y = make_spiral(10, 3, seed=1)
        >>> x.shape, int(y.max())
        ((30, 2), 2)
    """
    n_per_class = _check_positive_int(n_per_class, "n_per_class")
    n_classes = _check_positive_int(n_classes, "n_classes")
    check_float(noise, "noise", min_value=0.0)
    seed = check_int(seed, "seed", min_value=0)
    if not np.isfinite(noise) or noise < 0:
        raise ValueError(f"`noise` must be a finite number >= 0, got {noise!r}")
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for j in range(n_classes):
        r = np.linspace(0.0, 1.0, n_per_class)
        theta = 4.0 * j + 4.0 * r + rng.normal(0.0, noise, n_per_class)
        xs.append(np.stack([r * np.sin(theta), r * np.cos(theta)], axis=1))
        ys.append(np.full(n_per_class, j))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int32)


def make_blobs(
    n: int = 2000,
    n_features: int = 20,
    n_classes: int = 10,
    std: float = 1.0,
    separation: float = 3.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs: class centres ``~ N(0, separation²)``, points ``~ N(centre, std²)``.

    Args:
        n: number of points, >= 1 (classes get ``n // n_classes`` or one more each).
        n_features: dimensions, >= 1.
        n_classes: classes, >= 1.
        std: spread of each blob, >= 0.
        separation: spread of the centres, >= 0.
        seed: NumPy seed, >= 0.

    Returns:
        ``(x, y)``: float32 ``(n, n_features)`` and shuffled int32 labels ``(n,)``.

    Raises:
        ValueError: a count is not a positive int, or a spread or ``seed`` is negative.
        TypeError: a spread or ``seed`` has the wrong type.

    Examples:
        >>> x, y = make_blobs(100, 5, 4, seed=0)
        >>> x.shape, np.bincount(y).tolist()
        ((100, 5), [25, 25, 25, 25])
    """
    n = _check_positive_int(n, "n")
    n_features = _check_positive_int(n_features, "n_features")
    n_classes = _check_positive_int(n_classes, "n_classes")
    check_float(std, "std", min_value=0.0)
    check_float(separation, "separation", min_value=0.0)
    seed = check_int(seed, "seed", min_value=0)
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, separation, (n_classes, n_features))
    y = np.arange(n) % n_classes
    rng.shuffle(y)
    x = centres[y] + rng.normal(0.0, std, (n, n_features))
    return x.astype(np.float32), y.astype(np.int32)


def flip_labels(
    y: np.ndarray, n_flip: int, n_classes: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Flip ``n_flip`` labels to a *different* class chosen uniformly.

    Args:
        y: integer labels ``(N,)`` in ``[0, n_classes)``.
        n_flip: how many to flip, in ``[0, N]``.
        n_classes: number of classes, >= 2.
        seed: NumPy seed, >= 0.

    Returns:
        ``(noisy_labels, flipped_indices)``: ``y``'s dtype and shape, and the sorted int64
            indices of the flipped rows.

    Raises:
        TypeError: ``y`` is not a 1-D integer array, or a count is not an int.
        ValueError: a label is out of range, ``n_flip`` is outside ``[0, N]``, or
            ``n_classes < 2``.

    Examples:
        >>> noisy, idx = flip_labels(np.zeros(10, np.int32), 3, 4, seed=0)
        >>> len(idx), bool((noisy[idx] != 0).all()), int((noisy != 0).sum())
        (3, True, 3)
    """
    y = np.asarray(check_array(y, "y", ndim=1, dtype_kind="iu"))
    n_flip = check_int(n_flip, "n_flip")
    n_classes = check_int(n_classes, "n_classes")
    seed = check_int(seed, "seed", min_value=0)
    if y.size and n_classes >= 2 and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(f"`y` must be in [0, {n_classes}), got values in [{y.min()}, {y.max()}]")
    if not 0 <= n_flip <= len(y):
        raise ValueError(f"`n_flip` must be in [0, {len(y)}], got {n_flip}")
    if n_classes < 2:
        raise ValueError(f"`n_classes` must be >= 2 to flip labels, got {n_classes}")
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(len(y), size=n_flip, replace=False))
    noisy = y.copy()
    noisy[idx] = (y[idx] + rng.integers(1, n_classes, size=n_flip)) % n_classes
    return noisy.astype(y.dtype), idx


def train_test_split(
    *arrays: np.ndarray, test_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, ...]:
    """Split same-length arrays by one seeded permutation: ``(a_train, a_test, b_train, …)``.

    Args:
        *arrays: arrays sharing their leading (example) axis.
        test_fraction: the share of rows in the test part, in (0, 1) (rounded to rows).
        seed: NumPy seed, >= 0.

    Returns:
        Two NumPy arrays per input, train then test, rows in permuted order.

    Raises:
        ValueError: no arrays, a scalar, different lengths, or ``test_fraction`` outside
            (0, 1).
        TypeError: an argument has the wrong type.

    Examples:
        >>> a_tr, a_te = train_test_split(np.arange(10), test_fraction=0.3)
        >>> len(a_tr), len(a_te), sorted(np.concatenate([a_tr, a_te]).tolist()) == list(range(10))
        (7, 3, True)
    """
    if not arrays:
        raise ValueError("give at least one array to split")
    for i, a in enumerate(arrays):
        if np.ndim(check_array(a, f"arrays[{i}]")) == 0:
            raise ValueError(f"`arrays[{i}]` must have a leading (example) axis, got a scalar")
    check_float(test_fraction, "test_fraction")
    seed = check_int(seed, "seed", min_value=0)
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError(f"arrays must have the same length, got {[len(a) for a in arrays]}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"`test_fraction` must be in (0, 1), got {test_fraction}")
    order = np.random.default_rng(seed).permutation(n)
    n_test = int(round(n * test_fraction))
    test, train = order[:n_test], order[n_test:]
    out: list[np.ndarray] = []
    for a in arrays:
        a = np.asarray(a)
        out += [a[train], a[test]]
    return tuple(out)
