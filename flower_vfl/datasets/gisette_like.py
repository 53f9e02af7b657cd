"""A gisette-like wide data set built from two Fashion-MNIST classes.

gisette (Guyon et al., NIPS 2003 feature selection challenge; 6000 train / 1000 validation
rows, 5000 columns) is MNIST 4-vs-9: pixels sampled at random in the part of the image that
separates the two digits, products of pixel pairs added "to plunge the problem in a higher
dimensional feature space", and "probe" features with no predictive power drawn from the
empirical distribution of the real ones; values quantized to integers 0..999, features and
patterns in random order. LIBSVM's ``gisette_scale`` (the paper's copy) scales every column
to [-1, 1]. MNIST and gisette are not obtainable here, so :func:`load_gisette_like` applies
the same recipe to two Fashion-MNIST classes (default 7 = sneaker vs 9 = ankle boot):

1. rows: ``n_train / 2`` images of each class from Fashion-MNIST's training split and
   ``n_test / 2`` of each from its test split, drawn without replacement (seeded);
   label -1 for ``classes[0]``, +1 for ``classes[1]``;
2. pixels: ``n_pixels`` (500) pixels drawn at random among those whose standard deviation
   over the training rows is > 0.1 (the informative part of the image);
3. products: ``n_products`` (2000) products x_i * x_j of random pairs i < j of those pixels;
4. probes: ``n_probes`` (2500) columns, each a randomly chosen real column (pixel or product)
   whose values are permuted across the rows (train and test separately): the real
   features' marginal distribution, independent of the label;
5. quantization to integers 0..999 per column (``floor(999 * v / max_train)``, clipped),
   as gisette's files hold, then LIBSVM-style scaling of each column to [-1, 1] by its
   training min / max (constant columns become 0);
6. a random order of the columns and of the rows.

Everything is drawn from ``numpy.random.default_rng(seed)``: the same seed gives the same
matrices bit for bit. 500 + 2000 + 2500 = 5000 columns, 2500 of them probes, as in gisette.
With the paper's 3-party split (2000 / 2000 / 1000 columns) every party holds a mix of
pixels, products and probes.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from flower_vfl.datasets.fashion_mnist import load_fashion_mnist

__all__ = ["load_gisette_like", "GISETTE_SPLIT", "FASHION_MNIST_CLASSES"]

#: the paper's gisette split: party 1 = columns 1-2000, party 2 = 2001-4000, party 3 = 4001-5000
GISETTE_SPLIT = [(0, 2000), (2000, 4000), (4000, 5000)]
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")


def _check(name, v, lo):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}; got {name}={v!r}")


def _quantize_scale(train, test):
    """Integers 0..999 per column (gisette's files), then [-1, 1] by the training min/max."""
    top = train.max(axis=0)
    top[top <= 0] = 1.0
    q_tr = np.clip(np.floor(999.0 * train / top), 0, 999)
    q_te = np.clip(np.floor(999.0 * test / top), 0, 999)
    lo, hi = q_tr.min(axis=0), q_tr.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    scale = lambda q: np.where(hi > lo, 2.0 * (q - lo) / span - 1.0, 0.0)  # noqa: E731
    return scale(q_tr), scale(q_te)


@lru_cache(maxsize=2)
def load_gisette_like(seed=0, classes=(7, 9), n_train=6000, n_test=1000, n_pixels=500, n_products=2000,
                      n_probes=2500, data_dir=None):
    """(X_train, y_train, X_test, y_test) built by the recipe in the module docstring.

    Parameters
    ----------
    seed : int, default=0
    classes : (int, int), default=(7, 9)
        Fashion-MNIST classes (7 sneaker, 9 ankle boot); labels -1 / +1.
    n_train, n_test : int, default=6000, 1000
        Even numbers (half from each class), at most 12000 / 2000.
    n_pixels, n_products, n_probes : int, default=500, 2000, 2500
    data_dir : str or None
        Folder with the Fashion-MNIST IDX files (default: the Debian package's).

    Returns
    -------
    X_train (n_train, d), y_train (n_train,), X_test (n_test, d), y_test (n_test,), float64,
    labels in {-1, +1}, d = n_pixels + n_products + n_probes. Cached: do not modify in place.
    """
    _check("seed", seed, 0)
    for name, v, lo in (("n_train", n_train, 2), ("n_test", n_test, 2), ("n_pixels", n_pixels, 2),
                        ("n_products", n_products, 0), ("n_probes", n_probes, 0)):
        _check(name, v, lo)
    a, b = (int(c) for c in classes)
    if not (0 <= a <= 9 and 0 <= b <= 9 and a != b):
        raise ValueError(f"classes={classes!r} must be two distinct Fashion-MNIST labels in 0..9")
    if n_train % 2 or n_test % 2 or n_train > 12000 or n_test > 2000:
        raise ValueError(f"n_train={n_train}, n_test={n_test} must be even and at most 12000 / 2000 "
                         "(half of the rows from each class)")
    rng = np.random.default_rng(seed)
    Xf, yf, Xft, yft = load_fashion_mnist(data_dir)

    def rows(X, y, n):   # step 1
        idx = np.concatenate([rng.choice(np.flatnonzero(y == c), n // 2, replace=False) for c in (a, b)])
        return X[idx], np.repeat([-1.0, 1.0], n // 2)

    P_tr, y_tr = rows(Xf, yf, n_train)
    P_te, y_te = rows(Xft, yft, n_test)
    informative = np.flatnonzero(P_tr.std(axis=0) > 0.1)            # step 2
    if n_pixels > informative.size:
        raise ValueError(f"n_pixels={n_pixels} exceeds the {informative.size} informative pixels of "
                         f"classes {classes}")
    pix = rng.choice(informative, n_pixels, replace=False)
    i, j = np.triu_indices(n_pixels, k=1)                            # step 3
    if n_products > i.size:
        raise ValueError(f"n_products={n_products} exceeds the {i.size} pixel pairs")
    pairs = rng.choice(i.size, n_products, replace=False)
    pi, pj = pix[i[pairs]], pix[j[pairs]]
    real_tr = np.hstack([P_tr[:, pix], P_tr[:, pi] * P_tr[:, pj]])
    real_te = np.hstack([P_te[:, pix], P_te[:, pi] * P_te[:, pj]])
    src = rng.integers(0, real_tr.shape[1], n_probes)                # step 4
    probe_tr = np.column_stack([rng.permutation(real_tr[:, s]) for s in src]) if n_probes else \
        np.empty((n_train, 0))
    probe_te = np.column_stack([rng.permutation(real_te[:, s]) for s in src]) if n_probes else \
        np.empty((n_test, 0))
    X_tr, X_te = _quantize_scale(np.hstack([real_tr, probe_tr]), np.hstack([real_te, probe_te]))  # step 5
    cols = rng.permutation(X_tr.shape[1])                            # step 6
    r_tr, r_te = rng.permutation(n_train), rng.permutation(n_test)
    X_tr, X_te = np.ascontiguousarray(X_tr[r_tr][:, cols]), np.ascontiguousarray(X_te[r_te][:, cols])
    y_tr, y_te = y_tr[r_tr], y_te[r_te]
    for arr in (X_tr, y_tr, X_te, y_te):
        arr.setflags(write=False)
    return X_tr, y_tr, X_te, y_te
