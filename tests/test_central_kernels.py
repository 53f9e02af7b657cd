"""The multinomial central Newton (core/multinomial.py) and the pseudo-inverse of a singular
lasso support (core/xsolve_prox.py) against straightforward references: dense K x K Hessians
and a dense bordered solve, numpy's eigh / lstsq."""

import numpy as np
import pytest

from flower_vfl.core import xsolve_prox
from flower_vfl.core.blas import one_blas_thread
from flower_vfl.core.multinomial import multinomial_newton, softmax_lse


def _problem(n=400, K=5, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    t = np.eye(K)[rng.integers(0, K, n)]
    a = rng.normal(size=(n, K)) * scale
    y = rng.normal(size=(n, K)) / n
    return a, y, t


def _dense_step(a, y, t, rho, n, w, b, fit_b=True):
    """One Newton step of F(w, b) from dense per-sample K x K Hessians and the full bordered
    (N K + K) system, solved by lstsq (minimum norm: the all-ones direction is singular)."""
    N, K = a.shape
    P = np.exp(w - w.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    g = (P - t) / n - y - rho * (a + b - w)
    H = np.zeros((N * K + K, N * K + K))
    for i in range(N):
        s = slice(i * K, (i + 1) * K)
        H[s, s] = (np.diag(P[i]) - np.outer(P[i], P[i])) / n + rho * np.eye(K)
        H[s, N * K:] = H[N * K:, s] = -rho * np.eye(K)
    H[N * K:, N * K:] = rho * N * np.eye(K)
    gb = y.sum(0) + rho * (a + b - w).sum(0)
    if not fit_b:
        return np.linalg.solve(H[:N * K, :N * K], -g.ravel()).reshape(N, K), np.zeros(K)
    d = np.linalg.lstsq(H, -np.concatenate([g.ravel(), gb]), rcond=1e-12)[0]
    return d[:N * K].reshape(N, K), d[N * K:]


@pytest.mark.parametrize("fit_b", [True, False])
def test_one_newton_step_is_the_dense_bordered_solve(fit_b):
    """A short first step (no search) is the exact Newton step: Sherman-Morrison per sample and
    the K x K Schur complement equal the dense bordered system to round-off (z = w - b: the
    step is defined up to the all-ones direction shared by w and b)."""
    a, y, t = _problem(n=60, K=4, seed=1, scale=1.0)
    n, rho = 60, 0.1 / 60
    rng = np.random.default_rng(2)
    w_star, b0 = multinomial_newton(a, y, t, rho, n, np.zeros_like(a), np.zeros(4), fit_b=fit_b)
    w0 = w_star + rng.normal(size=a.shape) * 1e-3
    dw_ref, db_ref = _dense_step(a, y, t, rho, n, w0, b0, fit_b)
    w1, b1 = multinomial_newton(a, y, t, rho, n, w0, b0, fit_b=fit_b, max_iter=1)
    assert np.max(np.abs(dw_ref)) <= 0.1          # the unsearched regime
    dz, dz_ref = (w1 - w0) - (b1 - b0), dw_ref - db_ref
    assert np.max(np.abs(dz - dz_ref)) <= 1e-10 * np.max(np.abs(dz_ref))


@pytest.mark.parametrize("rho_n", [0.05, 0.1, 1.0, 10.0])
def test_newton_reaches_the_stationary_point_from_far(rho_n):
    """From a far start (searched steps) the solve ends at the stationary point to round-off:
    w-gradient and b-gradient ~ 0 (the former sticky search stopped up to ~1e-6 away)."""
    n = 400
    a, y, t = _problem(n=n, seed=3)
    rho = rho_n / n
    with one_blas_thread():
        w, b = multinomial_newton(a, y, t, rho, n, np.zeros_like(a), np.zeros(a.shape[1]))
    P = softmax_lse(w)[0]
    g = (P - t) / n - y - rho * (a + b - w)
    scale = np.max(np.abs(y)) + 1.0 / n
    assert np.max(np.abs(g)) <= 1e-12 * scale
    assert np.max(np.abs(y.sum(0) + rho * (a + b - w).sum(0))) <= 1e-12 * n * scale
    # the dense Newton iteration (backtracking on F) reaches the same z = w - b
    m = 40
    a, y, t = a[:m], y[:m], t[:m]

    def F(w, b):
        lse = np.log(np.exp(w - w.max(1, keepdims=True)).sum(1)) + w.max(1)
        r = a + b - w
        return (lse.sum() - np.sum(t * w)) / m - np.sum(y * w) + b @ y.sum(0) + 0.5 * rho * np.sum(r * r)

    wr, br = np.zeros_like(a), np.zeros(a.shape[1])
    for _ in range(200):
        dw, db = _dense_step(a, y, t, rho, m, wr, br)
        step, f0 = 1.0, F(wr, br)
        while np.max(np.abs(dw)) > 1e-3 and F(wr + step * dw, br + step * db) > f0 and step > 1e-12:
            step *= 0.5                            # short steps in full: F differences are round-off
        wr, br = wr + step * dw, br + step * db
        if np.max(np.abs(dw)) <= 1e-14 * (1 + np.max(np.abs(wr))):
            break
    w40, b40 = multinomial_newton(a, y, t, rho, m, np.zeros_like(a), np.zeros(a.shape[1]))
    assert np.max(np.abs((w40 - b40) - (wr - br))) <= 1e-9 * (1 + np.max(np.abs(wr - br)))


def test_predictor_from_the_dual_gives_the_same_solution():
    """p0 = t + N y_plus (the central node's predictor) moves only the start: the solution is
    the one without it to the tolerance, including an accelerator's changed y."""
    n = 500
    a, y, t = _problem(n=n, seed=5)
    rho = 0.1 / n
    work = {}
    with one_blas_thread():
        w, b = multinomial_newton(a, y, t, rho, n, np.zeros_like(a), np.zeros(5), work=work)
        z = w - b
        y_plus = y + rho * (a - z)
        rng = np.random.default_rng(6)
        a2 = a + rng.normal(size=a.shape) * 0.05          # the next round's a_hat
        y2 = y_plus + rng.normal(size=a.shape) * 1e-3 / n  # an accelerator's y
        p0 = t + n * y_plus
        assert np.max(np.abs(p0 - softmax_lse(w)[0])) <= 1e-11
        w_p, b_p = multinomial_newton(a2, y2, t, rho, n, z + b, b, p0=p0, work=work)
        w_n, b_n = multinomial_newton(a2, y2, t, rho, n, z + b, b)
    assert np.max(np.abs((w_p - b_p) - (w_n - b_n))) <= 1e-11


@pytest.mark.parametrize("rtol", [0.0, "default"])
def test_central_multinomial_step_is_stationary_each_round(rtol, monkeypatch):
    """CentralUpdate with the predictor (rounds 2+): every z-update leaves l'(z + b) = N y (eq. 11
    of the round), with the buffers reused across rounds: to round-off with rtol = 0, and with the
    central node's relative stop (CENTRAL_RTOL) to within its error bound, rtol times the round's
    move of w = z + b, through the gradient's Lipschitz constant (1/2 + N rho)/N."""
    import flower_vfl.core.central as central
    from flower_vfl.core.central import CentralUpdate
    from flower_vfl.core.losses import get_loss
    from flower_vfl.core.multinomial import CENTRAL_RTOL
    rtol = CENTRAL_RTOL if rtol == "default" else rtol
    monkeypatch.setattr(central, "CENTRAL_RTOL", rtol)
    n, K = 300, 4
    rng = np.random.default_rng(8)
    loss = get_loss("multinomial")
    t = loss.encode_labels(rng.integers(0, K, n))
    c = CentralUpdate(loss, t, 0.1 / n, theta=0.5)
    s = rng.normal(size=(n, K))
    for k in range(6):
        s = s + rng.normal(size=(n, K)) * 0.3 / (k + 1)
        w_old = c.z + c.b
        c.step(s)
        P = softmax_lse(c.z + c.b)[0]
        move = np.max(np.abs(c.z + c.b - w_old))
        bound = 2.0 * (0.5 / n + c.rho) * rtol * move + 1e-12 / n * 10
        assert np.max(np.abs((P - t) / n - c.y)) <= bound
        assert abs(c.y.sum(axis=0)).max() <= 1e-12


def _one_hot_gram(seed, d=24, n=300):
    rng = np.random.default_rng(seed)
    X = (rng.random((n, d)) < 0.3).astype(float)
    X[:, 5] = 1.0 - X[:, 4]                        # one-hot pairs: X4 + X5 = 1 = X6 + X7
    X[:, 7] = 1.0 - X[:, 6]
    g = rng.integers(0, 3, n)                      # a one-hot group of three
    X[:, 9:12] = np.eye(3)[g]
    X -= X.mean(axis=0)                            # centred: each group sums to 0
    return X.T @ X


@pytest.mark.parametrize("seed", range(4))
def test_pivoted_pseudo_inverse_is_the_eigh_one(seed):
    G = _one_hot_gram(seed)
    d = G.shape[0]
    rng = np.random.default_rng(seed + 10)
    checked = 0
    for S in (np.arange(d), np.array([4, 5, 6, 7, 0, 1]), np.array([9, 10, 11, 2, 3]),
              np.sort(rng.choice(d, 15, replace=False))):
        A = 0.7 * G[np.ix_(S, S)]
        ref = xsolve_prox._pinv_eigh(A)
        got = xsolve_prox._pinv_pivoted(A)
        rank = np.linalg.matrix_rank(A, tol=1e-12 * np.linalg.norm(A, 2))
        if rank == S.size:
            assert got is None                     # full rank: the Cholesky path's case
            continue
        assert got is not None
        checked += 1
        assert np.max(np.abs(got - ref)) <= 1e-10 * np.max(np.abs(ref))
        r = rng.normal(size=S.size)
        lst = np.linalg.lstsq(A, r, rcond=1e-12)[0]
        assert np.max(np.abs(got @ r - lst)) <= 1e-9 * max(1.0, np.max(np.abs(lst)))
    assert checked >= 2


def test_pivoted_pseudo_inverse_declines_an_ambiguous_rank():
    """An eigenvalue near the 1e-12 cut: the pivoted factor does not certify, eigh decides."""
    rng = np.random.default_rng(0)
    Q = np.linalg.qr(rng.normal(size=(8, 8)))[0]
    e = np.array([1e-11, 1e-3, 0.1, 1, 2, 3, 4, 5.0])
    A = (Q * e) @ Q.T
    assert xsolve_prox._pinv_pivoted(A) is None
    e[0] = 0.0
    A = (Q * e) @ Q.T
    got = xsolve_prox._pinv_pivoted(A)
    ref = xsolve_prox._pinv_eigh(A)
    assert got is None or np.max(np.abs(got - ref)) <= 1e-10 * np.max(np.abs(ref))


def _old_cholesky_inverse(A):
    """What _support_factor did before the skip: the Cholesky inverse when it passed the
    conditioning test, else None (then the pivoted / eigh pseudo-inverse)."""
    from scipy.linalg.lapack import dpotrf, dpotri
    c, info = dpotrf(A, lower=1, clean=1)
    if info != 0:
        return None
    Ai, info = dpotri(c, lower=1)
    if info != 0:
        return None
    Ai = np.tril(Ai)
    Ai += np.tril(Ai, -1).T
    ok = np.all(np.isfinite(Ai)) and np.linalg.norm(A) * np.linalg.norm(Ai) < xsolve_prox._CHOL_COND
    return Ai if ok else None


def test_the_skipped_cholesky_inverse_is_one_the_old_test_rejected():
    """_support_factor no longer forms the Cholesky inverse when the factor's diagonal alone
    bounds cond_2(A) above 100 x _CHOL_COND. On singular one-hot supports and on random matrices
    of condition numbers 1e2..1e18, every skipped one is one the old Frobenius-norm test
    rejected, and the factor returned is bitwise the one the old flow returned."""
    from scipy.linalg.lapack import dpotrf
    rng = np.random.default_rng(3)
    mats = []
    for seed in range(4):
        G = _one_hot_gram(seed)
        d = G.shape[0]
        for S in (np.arange(d), np.array([9, 10, 11, 2, 3]), np.sort(rng.choice(d, 12, replace=False))):
            mats.append(0.7 * G[np.ix_(S, S)] + (0.0 if seed % 2 else 1e-3) * np.eye(S.size))
    for k in range(2, 19):
        Q = np.linalg.qr(rng.normal(size=(20, 20)))[0]
        mats.append((Q * np.logspace(0, -k, 20)) @ Q.T)
    skipped = 0
    with one_blas_thread():
        for A in mats:
            c, info = dpotrf(A, lower=1, clean=1)
            if info == 0 and xsolve_prox._chol_cond_bound(c, A) >= xsolve_prox._CHOL_COND_SKIP:
                skipped += 1
                assert _old_cholesky_inverse(A) is None
            S = np.arange(A.shape[0])
            solve, _ = xsolve_prox._support_factor(A, S, 1.0, 0.0)
            old = _old_cholesky_inverse(A)
            if old is None:
                old = xsolve_prox._pinv_pivoted(A)
            if old is None:
                old = xsolve_prox._pinv_eigh(A)
            r = rng.normal(size=A.shape[0])
            assert np.array_equal(solve(r), xsolve_prox.mm(old, r))
    assert skipped >= 3                  # the skip is exercised (4 here)


def test_nested_one_blas_thread_contexts_restore_the_outer_count():
    """Inside a one_blas_thread context a nested one touches no library; leaving the outer one
    restores every library's thread count."""
    from threadpoolctl import threadpool_info
    from flower_vfl.core import blas
    with one_blas_thread():
        pass
    libs = blas._CONTROLLER[0]
    if not libs:
        pytest.skip("no BLAS library that threadpoolctl controls")
    before = [lc.num_threads for lc in libs]
    calls = []
    for lc in libs:
        orig = lc.set_num_threads
        lc.set_num_threads = lambda n, orig=orig: (calls.append(n), orig(n))[1]
    try:
        with one_blas_thread():
            inside = [lc.num_threads for lc in libs]
            n_outer = len(calls)
            with one_blas_thread():
                with one_blas_thread():
                    assert [lc.num_threads for lc in libs] == [1] * len(libs)
            assert len(calls) == n_outer                  # the nested ones set nothing
            assert [lc.num_threads for lc in libs] == inside == [1] * len(libs)
        assert [lc.num_threads for lc in libs] == before
    finally:
        for lc in libs:
            del lc.set_num_threads
    assert threadpool_info() is not None
