"""The multinomial central Newton's softmax (core/multinomial.py: rows shifted by their mean,
the row max only where a row's range would overflow exp) against scipy.special, and its
relative stop (``rtol``) against the exact solve."""

import numpy as np
import pytest
from scipy.special import logsumexp, softmax

from flower_vfl.core.blas import one_blas_thread
from flower_vfl.core.multinomial import multinomial_newton, softmax_lse


@pytest.mark.parametrize("scale", [1.0, 30.0, 400.0])
def test_softmax_lse_matches_scipy_with_any_row_range(scale):
    """Ordinary rows, rows of range ~100 and rows of range > 709 (the mean shift overflows exp
    there and the row max is taken): softmax and logsumexp equal scipy's to round-off."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(500, 7)) * scale
    w[0] = [-1000.0, 0.0, 1000.0, 3.0, -2.0, 1.0, 0.5]     # range 2000
    E, lse = softmax_lse(w)
    assert np.max(np.abs(E - softmax(w, axis=1))) <= 1e-15
    ref = logsumexp(w, axis=1)
    assert np.max(np.abs(lse - ref) / (1.0 + np.abs(ref))) <= 1e-15
    assert np.all(np.isfinite(E)) and np.all(np.isfinite(lse))


def test_relative_stop_is_within_its_bound_of_the_exact_solve():
    """A warm-started solve with rtol = 1e-3 (the central node's setting) ends within the stated
    error bound of the exact one: z = w - b within rtol times the first step's length (here
    within twice the distance the exact solve moved)."""
    rng = np.random.default_rng(4)
    n, K = 400, 5
    t = np.eye(K)[rng.integers(0, K, n)]
    a = rng.normal(size=(n, K)) * 2.0
    y = rng.normal(size=(n, K)) / n
    y -= y.mean(axis=1, keepdims=True)
    rho = 0.2 / n
    with one_blas_thread():
        w0, b0 = multinomial_newton(a, y, t, rho, n, np.zeros_like(a), np.zeros(K))
        a2 = a + rng.normal(size=a.shape) * 0.05                   # the next round's a_hat
        w_x, b_x = multinomial_newton(a2, y, t, rho, n, w0, b0)
        w_r, b_r = multinomial_newton(a2, y, t, rho, n, w0, b0, rtol=1e-3)
    z_x, z_r = w_x - b_x, w_r - b_r
    move = np.max(np.abs(w_x - w0)) + np.max(np.abs(b_x - b0))
    err = np.max(np.abs(z_r - z_x))
    assert err <= 1e-3 * 2.0 * move            # the first step is within 2x of the move here
    assert err > 1e-9                          # an inexact solve (measured 2.7e-7): not vacuous


def test_schur_solve_is_the_minimum_norm_solution():
    """The K x K Schur system's Cholesky solve (S + c 1 1^T on a matrix singular along the
    all-ones direction) equals numpy's minimum-norm lstsq to round-off, and the eigenvalue the
    certificate reads is numpy's second-smallest; a second singular direction takes the
    eigendecomposition path, again lstsq's answer."""
    from flower_vfl.core.multinomial import _schur_eig1, _schur_solve
    rng = np.random.default_rng(11)
    K = 10
    A = rng.normal(size=(K, 40))
    A -= A.mean(axis=0)                      # columns orthogonal to the all-ones direction
    S = A @ A.T
    rhs = rng.normal(size=K)                 # with an all-ones part: lstsq drops it too
    ref = np.linalg.lstsq(S, rhs, rcond=1e-10)[0]
    got = _schur_solve(S, rhs, True)
    assert np.max(np.abs(got - ref)) <= 1e-12 * np.max(np.abs(ref))
    assert _schur_eig1(S) == pytest.approx(np.linalg.eigvalsh(S)[1], rel=1e-12)
    B = A[:, :K - 3]                         # rank K - 3: Cholesky fails, eigh's cut applies
    S2 = B @ B.T
    ref2 = np.linalg.lstsq(S2, rhs, rcond=1e-10)[0]
    assert np.max(np.abs(_schur_solve(S2, rhs, True) - ref2)) <= 1e-9 * np.max(np.abs(ref2))


def test_central_solve_is_the_stationary_point_and_matches_the_newton():
    """The central node's entry point (z and b in, z out, the predictor from T(u)'s dual) ends at
    the stationary point of F: N dF/dw = p - t - N y - N rho (a + b - w) ~ 0 and dF/db ~ 0 at
    w = z + b, to round-off with rtol = 0, and it is multinomial_newton's z = w - b."""
    from flower_vfl.core.multinomial import central_solve
    rng = np.random.default_rng(12)
    n, K = 300, 6
    t = np.eye(K)[rng.integers(0, K, n)]
    a = rng.normal(size=(n, K)) * 2.0
    y = rng.normal(size=(n, K)) / n
    rho = 0.05 / n
    work = {}
    with one_blas_thread():
        w0, b0 = multinomial_newton(a, y, t, rho, n, np.zeros_like(a), np.zeros(K))
        z0 = w0 - b0
        y_plus = y + rho * (a - z0)              # the dual that solve leaves: p(w0) = t + N y_plus
        a2 = a + rng.normal(size=a.shape) * 0.1
        y2 = y_plus + rng.normal(size=a.shape) * 1e-3 / n
        z, b = central_solve(a2, y2, t, rho, n, z0, b0, y_plus=y_plus, work=work)
        z_n, b_n = central_solve(a2, y2, t, rho, n, z0, b0, work={})          # no predictor
        w_r, b_r = multinomial_newton(a2, y2, t, rho, n, w0, b0)
    w = z + b
    P = softmax_lse(w)[0]
    g = P - t - n * y2 - n * rho * (a2 + b - w)
    assert np.max(np.abs(g)) <= 1e-11
    assert np.max(np.abs(y2.sum(0) + rho * (a2 + b - w).sum(0))) <= 1e-12
    assert np.max(np.abs(z - (w_r - b_r))) <= 1e-10
    assert np.max(np.abs(z - z_n)) <= 1e-10
    assert z.flags.c_contiguous and z.shape == (n, K)


@pytest.mark.parametrize("center", [True, False])
def test_party_multiclass_solve_is_the_ridge_solution(center):
    """A party's K > 1 'gram' x-update (the kept d x d map for its rho, 1^T v as a product)
    against the dense ridge solution argmin lam/2 ||x||^2 + rho/2 ||P (D x - v)||^2 (P the
    centring projection when centred) by lstsq on the stacked system, column by column, and
    against the same solver's K = 1 path per column; a new rho gives the new solution."""
    from flower_vfl.core.penalties import get_penalty
    from flower_vfl.core.xsolve import XSolver
    rng = np.random.default_rng(13)
    n, d, K, lam = 200, 12, 5, 1e-3
    D = rng.normal(size=(n, d)) + 0.5
    v = rng.normal(size=(n, K))
    s = XSolver(D, get_penalty("l2"), lam, method="gram", center=center)
    Pc = np.eye(n) - 1.0 / n if center else np.eye(n)
    for rho in (0.3, 2.0):
        x = s.solve(v, rho)
        A = np.vstack([np.sqrt(rho) * Pc @ D, np.sqrt(lam) * np.eye(d)])
        ref = np.linalg.lstsq(A, np.vstack([np.sqrt(rho) * Pc @ v, np.zeros((d, K))]), rcond=None)[0]
        assert np.max(np.abs(x - ref)) <= 1e-10 * np.max(np.abs(ref))
        cols = np.column_stack([s.solve(v[:, k].copy(), rho) for k in range(K)])
        assert np.max(np.abs(x - cols)) <= 1e-12 * np.max(np.abs(ref))


def test_schur_solve_cuts_a_class_nobody_is_predicted_as_lstsq_does():
    """A class with p ~ 1e-13 in every row puts an eigenvalue ~1e-13 in S beside the all-ones
    zero: below the 1e-10 cut but positive, so Cholesky succeeds and solves along it (a step of
    ~1e12); the solve falls back to the eigendecomposition and returns lstsq's cut
    minimum-norm solution."""
    from scipy.linalg.lapack import dposv

    from flower_vfl.core.multinomial import _schur_solve
    rng = np.random.default_rng(14)
    K = 5
    V = np.linalg.qr(np.column_stack([np.ones(K), rng.normal(size=(K, K - 1))]))[0]
    S = (V * np.array([0.0, 1e-13, 1.0, 2.0, 3.0])) @ V.T
    rhs = rng.normal(size=K)
    assert dposv(S + S.trace() / K ** 2, rhs)[2] == 0          # Cholesky alone would not refuse
    ref = np.linalg.lstsq(S, rhs, rcond=1e-10)[0]
    got = _schur_solve(S, rhs, True)
    assert np.max(np.abs(ref)) < 10.0                          # the cut solution is short
    assert np.max(np.abs(got - ref)) <= 1e-9 * np.max(np.abs(ref))
