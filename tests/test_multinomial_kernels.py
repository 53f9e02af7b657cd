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
