"""Scale paths of the x-update (core/xsolve.py) and of Anderson (core/accel.py), against references.

- ``sparse_gram`` (pair counting) against the dense D^T D: exact for binary blocks, 1e-12
  relative otherwise (a sum of the same products in another order);
- the auto rule for large sparse blocks (Gram when its pairs are few per entry, else CG);
- CG with the mean-corrected Jacobi preconditioner against the normal equations (1e-10);
- every changed path inside ADMM against the centralized optimum (tests/reference.py): relative
  objective gap <= 1e-8 and coefficients within 1e-5, as tests/test_solvers.py;
- Anderson with a float32 history reaches the same optimum.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from flower_vfl import VerticalADMM
from flower_vfl.core import xsolve
from flower_vfl.core.accel import Anderson
from flower_vfl.core.penalties import get_penalty
from flower_vfl.core.xsolve import XSolver, choose_method, sparse_gram
from reference import centralized


def _binary(n, d, density, seed):
    rng = np.random.default_rng(seed)
    D = sp.random(n, d, density=density, format="csr", random_state=seed)
    D.data[:] = 1.0
    return D, rng


@pytest.mark.parametrize("binary", [True, False])
def test_sparse_gram_matches_the_dense_product(binary):
    D, _ = _binary(3000, 40, 0.2, 1)
    if not binary:
        D = sp.random(3000, 40, density=0.2, format="csr", random_state=2)
        D.data -= 0.5                              # signed values
    G, ref = sparse_gram(D), D.toarray().T @ D.toarray()
    if binary:
        assert np.array_equal(G, ref)              # integer counts
    else:
        assert np.max(np.abs(G - ref)) <= 1e-12 * np.max(np.abs(ref))


def test_sparse_gram_with_unsorted_duplicates_empty_and_long_rows():
    # row 0: unsorted with a duplicate (3 + 1 at column 1); row 1 empty; row 2 longer than the
    # pair buffer of chunk=4 (5 entries: 10 pairs)
    data = np.array([1.0, 2.0, 3.0, 4.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    idx = np.array([3, 1, 1, 0, 0, 1, 2, 3, 4])
    D = sp.csr_matrix((data, idx, np.array([0, 4, 4, 9])), shape=(3, 5))
    Dd = D.toarray()
    assert np.max(np.abs(sparse_gram(D, chunk=4) - Dd.T @ Dd)) <= 1e-13


@pytest.mark.parametrize("duplicates", [False, True])
def test_gram_takes_its_diagonal_from_the_centring_pass(duplicates, monkeypatch):
    """A centred sparse solver's Gram takes its diagonal from the centring's column pass (no
    second pass): bitwise the Gram of sparse_gram alone (then centred). A block with duplicate
    entries (non-canonical) computes it again: a duplicate's squares do not sum to its square."""
    D, _ = _binary(2000, 30, 0.15, 4)
    D = D.multiply(np.random.default_rng(5).normal(size=30)).tocsr()   # non-binary values
    if duplicates:
        D = sp.csr_matrix((np.r_[D.data, 0.5], np.r_[D.indices, D.indices[0]],
                           np.r_[D.indptr[:2] + [0, 1], D.indptr[2:] + 1]), shape=D.shape)
        assert not D.has_canonical_format
    passes = []
    real = xsolve._column_stats
    monkeypatch.setattr(xsolve, "_column_stats", lambda *a, **k: passes.append(k) or real(*a, **k))
    s = XSolver(D, get_penalty("l2"), 1e-3, method="gram", center=True)
    G = s.gram()
    assert len(passes) == (2 if duplicates else 1)
    Dd = D.toarray()
    mu = Dd.mean(axis=0)
    ref = sparse_gram(D) - np.outer(mu, mu * D.shape[0])
    if not duplicates:
        assert np.array_equal(G, sparse_gram(D) - np.outer(s.mu(), s.mu() * D.shape[0]))
    Dc = Dd - mu
    assert np.max(np.abs(G - Dc.T @ Dc)) <= 1e-10 * np.max(np.abs(Dc.T @ Dc))
    assert np.max(np.abs(G - ref)) <= 1e-10 * np.max(np.abs(ref))


def test_auto_rule_for_large_sparse_blocks(monkeypatch):
    """Above CG_ROWS a sparse block gets the Gram when sum_i nnz_i (nnz_i - 1)/2 is at most
    GRAM_PAIRS_PER_NNZ per stored entry (~5 nnz a row here: 2 pairs per entry), else CG
    (~50 a row: 24.5 per entry)."""
    monkeypatch.setattr(xsolve, "CG_ROWS", 1000)
    l2 = get_penalty("l2")
    few, _ = _binary(2000, 100, 0.05, 3)
    many, _ = _binary(2000, 100, 0.5, 4)
    assert choose_method(few, l2, None) == "gram"
    assert choose_method(many, l2, None) == "cg"
    assert choose_method(many[:900], l2, None) == "gram"    # below CG_ROWS: always the Gram


@pytest.mark.parametrize("k", [None, 3])
def test_cg_with_the_mean_preconditioner_matches_the_normal_equations(k):
    """Non-negative binary columns (the case the rank-one mean term is for), one or K columns,
    plus a constant column (its centred variance is 0: the diagonal is lam alone)."""
    D, rng = _binary(400, 30, 0.1, 5)
    D = sp.hstack([D, sp.csr_matrix(np.ones((400, 1)))]).tocsr()
    Dd = D.toarray()
    v = rng.normal(size=(400,) if k is None else (400, k))
    s = XSolver(D, get_penalty("l2"), 0.05, method="cg", inner_tol=1e-14)
    for rho in (0.3, 4.0):
        x = s.solve(v, rho)
        ref = np.linalg.solve(0.05 * np.eye(31) + rho * Dd.T @ Dd, rho * Dd.T @ v)
        assert np.max(np.abs(x - ref)) <= 1e-10 * max(1.0, np.max(np.abs(ref)))
        # the carried products are those of the result
        Dx, DtDx = s.last_carry
        assert np.max(np.abs(Dx - Dd @ x)) <= 1e-11 * max(1.0, np.max(np.abs(Dx)))
        assert np.max(np.abs(DtDx - Dd.T @ (Dd @ x))) <= 1e-11 * max(1.0, np.max(np.abs(DtDx)))


def test_cg_warm_start_with_carry_matches_a_cold_solve():
    D, rng = _binary(300, 20, 0.15, 6)
    s = XSolver(D, get_penalty("l2"), 0.1, method="cg", inner_tol=1e-14)
    v1, v2 = rng.normal(size=300), rng.normal(size=300)
    x1 = s.solve(v1, 1.0)
    carry = s.last_carry
    Dx_before = carry[0].copy()
    x2 = s.solve(v2, 1.0, x0=x1, carry=carry)
    assert np.array_equal(carry[0], Dx_before)        # the release D x1 is never overwritten
    cold = XSolver(D, get_penalty("l2"), 0.1, method="cg", inner_tol=1e-14).solve(v2, 1.0)
    assert np.max(np.abs(x2 - cold)) <= 1e-10 * max(1.0, np.max(np.abs(cold)))


def _sparse_problem():
    rng = np.random.default_rng(7)
    blocks = [_binary(600, d, 0.08, 10 + i)[0] for i, d in enumerate((8, 12, 16))]
    f = sum(B @ rng.normal(size=B.shape[1]) for B in blocks)
    y = np.where(rng.random(600) < 1 / (1 + np.exp(-(f - f.mean()))), 1.0, -1.0)
    return blocks, y


@pytest.mark.parametrize("method", ["gram", "cg"])
def test_binary_sparse_paths_reach_the_centralized_optimum(method):
    blocks, y = _sparse_problem()
    lam = 1e-2
    m = VerticalADMM(lam=lam, max_rounds=600, tol=0, x_solver=method).fit(blocks, y)
    assert all(p.solver.method_ == method for p in m._parties)
    X = sp.hstack(blocks).toarray()
    w, b, obj = centralized(X, y, "logistic", lam)
    assert abs(m.objective(blocks, y) - obj) / abs(obj) <= 1e-8
    assert np.max(np.abs(np.concatenate(m.coef_) - w)) <= 1e-5


def test_anderson_with_a_float32_history_reaches_the_same_optimum(monkeypatch):
    blocks, y = _sparse_problem()
    lam = 1e-2
    ref = VerticalADMM(lam=lam, max_rounds=400, tol=0, acceleration="anderson").fit(blocks, y)
    monkeypatch.setattr(Anderson, "F32_MIN", 1)
    m = VerticalADMM(lam=lam, max_rounds=400, tol=0, acceleration="anderson").fit(blocks, y)
    X = sp.hstack(blocks).toarray()
    w, b, obj = centralized(X, y, "logistic", lam)
    for fit in (ref, m):
        assert abs(fit.objective(blocks, y) - obj) / abs(obj) <= 1e-8
        assert np.max(np.abs(np.concatenate(fit.coef_) - w)) <= 1e-5
    acc = Anderson()                 # the history is float32 once F32_MIN is reached
    rng = np.random.default_rng(0)
    for _ in range(3):
        acc.targets([rng.normal(size=40)], rng.normal(size=40), rng.normal(size=40), 1.0, 1.0)
    assert acc.S.dtype == np.float32 and acc.Y.dtype == np.float32
