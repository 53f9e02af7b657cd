"""Synthetic vertical data sets generated from a seed (issue 9's shapes). Not part of the package.

- :func:`sparse_binary`: N rows x parties of (100, 200, 300) binary columns at 5 % density
  (the "1M sparse set" at N = 1,000,000), CSR blocks.
- :func:`wide_dense`: gisette-like, N = 6000 rows, 2 parties of 2000 dense columns (13 % of the
  entries nonzero, as in gisette), standardized scale.
- :func:`text_like`: N rows, parties of 200k columns, 10 nonzeros per row (Zipf-like columns).

Labels come from a planted linear model plus logistic noise, so the problems are genuine
classification problems (about 75-90 % training accuracy), in {-1, +1}.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def _labels(rng, blocks, scale=1.0):
    f = sum(D @ rng.normal(size=D.shape[1]) for D in blocks)
    f = (f - f.mean()) / (f.std() + 1e-12) * 2.0 * scale
    return np.where(rng.random(f.shape[0]) < 1.0 / (1.0 + np.exp(-f)), 1.0, -1.0)


def sparse_binary(n_rows=1_000_000, widths=(100, 200, 300), density=0.05, seed=0):
    """(blocks, y): binary CSR blocks, ``density`` of each column set, from ``seed``."""
    rng = np.random.default_rng(seed)
    blocks = []
    for d in widths:
        nnz_row = rng.binomial(d, density, size=n_rows)
        indptr = np.concatenate([[0], np.cumsum(nnz_row)])
        # columns per row drawn with replacement then de-duplicated by CSR summation
        idx = rng.integers(0, d, size=int(indptr[-1]), dtype=np.int32)
        D = sp.csr_matrix((np.ones(idx.size), idx, indptr), shape=(n_rows, d))
        D.sum_duplicates()
        D.data[:] = 1.0
        blocks.append(D)
    return blocks, _labels(rng, blocks, scale=0.5)


def wide_dense(n_rows=6000, widths=(2000, 2000), density=0.13, seed=0):
    """(blocks, y): dense blocks, ``density`` of the entries nonzero (gisette-like)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for d in widths:
        X = rng.normal(size=(n_rows, d)) * (rng.random((n_rows, d)) < density)
        blocks.append(X / np.sqrt(density * d))       # rows of unit expected norm
    return blocks, _labels(rng, blocks)


def text_like(n_rows=50_000, widths=(200_000, 200_000), nnz_per_row=10, seed=0):
    """(blocks, y): tf-like sparse blocks, ``nnz_per_row`` per row and block, Zipf columns."""
    rng = np.random.default_rng(seed)
    blocks = []
    for d in widths:
        p = 1.0 / np.arange(1, d + 1) ** 0.8
        cols = rng.choice(d, size=n_rows * nnz_per_row, p=p / p.sum()).astype(np.int32)
        indptr = np.arange(0, n_rows * nnz_per_row + 1, nnz_per_row)
        D = sp.csr_matrix((rng.random(cols.size) + 0.5, cols, indptr), shape=(n_rows, d))
        D.sum_duplicates()
        blocks.append(D)
    return blocks, _labels(rng, blocks)


# --- sets the engine's defaults were NOT tuned on (benchmarks/bench_vs_sklearn.py's "untuned"
# rows): other distributions than the ones above. Do not tune defaults on these.

def dense_skewed(n_rows=200_000, widths=(40, 60), seed=11):
    """(blocks, y): real-valued, heavy-tailed and skewed columns (log-normal with per-column
    scales over three decades, unstandardized), correlated across the parties through 5 shared
    latent factors; binary labels from a planted model with logistic noise."""
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n_rows, 5))
    blocks = []
    for d in widths:
        mix = rng.normal(size=(5, d)) * 0.6
        X = np.exp(latent @ mix + rng.normal(size=(n_rows, d)) * 0.8)       # log-normal, skewed
        X *= 10.0 ** rng.uniform(-1.5, 1.5, size=d)                          # column scales
        blocks.append(np.ascontiguousarray(X))
    # labels on the standardized columns (else the largest column decides alone)
    std = [(B - B.mean(axis=0)) / B.std(axis=0) for B in blocks]
    return blocks, _labels(rng, std, scale=0.7)


def multiclass_mixture(n_rows=20_000, widths=(30, 30), n_classes=5, seed=12):
    """(blocks, y): K-class mixture with Student-t (3 degrees of freedom) noise around class
    means that differ in both parties' columns, unequal class sizes; labels 0..K-1."""
    rng = np.random.default_rng(seed)
    d = int(sum(widths))
    prior = rng.dirichlet(np.full(n_classes, 2.0))
    y = rng.choice(n_classes, size=n_rows, p=prior)
    means = rng.normal(size=(n_classes, d)) * 0.5
    X = means[y] + rng.standard_t(3, size=(n_rows, d)) * rng.uniform(0.5, 2.0, size=d)
    cut = np.cumsum(widths)[:-1]
    return [np.ascontiguousarray(B) for B in np.split(X, cut, axis=1)], y


def sparse_counts(n_rows=300_000, widths=(500, 1500), nnz_per_row=(8, 25), seed=13):
    """(blocks, y): bag-of-words-like counts, log1p-scaled: per row a Poisson number of
    distinct Zipf-popular columns (exponent 1.1) with geometric counts; binary labels."""
    rng = np.random.default_rng(seed)
    blocks = []
    for d, k in zip(widths, nnz_per_row):
        nnz = rng.poisson(k, size=n_rows)
        indptr = np.concatenate([[0], np.cumsum(nnz)])
        p = 1.0 / np.arange(1, d + 1) ** 1.1
        cols = rng.choice(d, size=int(indptr[-1]), p=p / p.sum()).astype(np.int32)
        vals = np.log1p(rng.geometric(0.5, size=cols.size).astype(float))
        D = sp.csr_matrix((vals, cols, indptr), shape=(n_rows, d))
        D.sum_duplicates()
        blocks.append(D)
    return blocks, _labels(rng, blocks, scale=0.8)
