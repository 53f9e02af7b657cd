"""Proximal x-updates of :class:`flower_vfl.core.xsolve.XSolver` (non-L2 penalties, constraints).

All minimize lam R(x) + iota_X(x) + rho/2 ||D x - v||^2 = lam R(x) + iota_X(x) + f(x) with
f(x) = rho/2 x^T G x - rho c^T x + const, c = D^T v, G = D^T D. No Flower imports.

- :func:`prox_on_gram`: everything in d-space on the cached Gram (one D^T v per round, then
  O(d^2) per inner step). For L1 / elastic net without a constraint it finishes with an
  active-set Newton step: on the support S with signs sigma of the current iterate,
  x_S = (rho G_SS + lam (1 - a) I)^-1 (rho c_S - lam a sigma), accepted when the signs agree and
  |rho c_j - (Q x)_j| <= lam a off S (the exact KKT conditions of the lasso / elastic net); it
  is exact to round-off, so the FISTA iterations only need to find the support.
- :func:`fista_on_D`: the old FISTA on D (2 mat-vecs per step) for blocks without a Gram (CG).
- :func:`ball_l2`: L2 on a ball, exact through the eigendecomposition and the secular equation.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg as sla
from scipy.linalg.lapack import dpotrf, dpotri, dpotrs, dpstrf

from flower_vfl.core.blas import mm, one_blas_thread

__all__ = ["prox_on_gram", "fista_on_D", "ball_l2"]


def _prox(solver, u, t):
    x = solver.penalty.prox(u, t * solver.lam)
    if solver.constraint is not None:
        # prox of (lam R + indicator) = project(prox_R) holds for our R (separable or radial)
        # with boxes and origin-centred balls
        x = solver.constraint.project(x)
    return x


def _lmax_gram(solver) -> float:
    """Largest eigenvalue of G (rho-independent: computed once per solver)."""
    if solver._eig is not None and solver.method_ == "gram":
        return float(solver._eig[0][-1])
    if getattr(solver, "_lmax", None) is None:
        G = solver.gram()
        d = G.shape[0]
        with one_blas_thread():
            solver._lmax = float(sla.eigh(G, eigvals_only=True, subset_by_index=[d - 1, d - 1])[0])
    return solver._lmax


def _fista(grad, prox, x, step, tol, scale, max_iter):
    """FISTA with gradient restart (O'Donoghue & Candes); stops on the gradient-mapping norm.
    (Array methods and ``math.sqrt`` where numpy's wrappers were: the same reductions and the
    same correctly rounded square roots, a few us less an iteration on a9a's ~60 columns.)"""
    w, th = x.copy(), 1.0
    k = 0
    stop = tol * scale
    for k in range(1, max_iter + 1):
        x_new = prox(w - step * grad(w), step)
        diff = x_new - w
        if math.sqrt(float((diff * diff).sum())) / step <= stop:
            return x_new, k
        th_new = 0.5 * (1 + math.sqrt(1 + 4 * th * th))
        dx = x_new - x
        if (dx * diff).sum() < 0:
            th_new, w = 1.0, x_new
        else:
            w = x_new + ((th - 1) / th_new) * dx
        x, th = x_new, th_new
    return x, k


def _active_set_newton(G, rc, rho, mu1, mu2, x, max_swaps=10, cache=None):
    """Exact lasso / elastic-net minimizer by a primal-dual active-set iteration started from the
    support and signs of ``x`` (one column), or None if it does not certify within ``max_swaps``.

    On the support S with signs sigma: x_S = (rho G_SS + mu2 I)^+ (rho c_S - mu1 sigma) (minimum
    norm least squares: one-hot groups make G singular, a9a: eigenvalues ~1e-12 of 7e4). Entries
    whose sign disagrees leave S; off-S entries with |rho c_j - (Q x)_j| > mu1 enter with the sign of
    that gradient. It returns only a point satisfying the exact KKT conditions. ``cache`` (a dict
    kept by the solver) holds the pseudo-inverse of the last supports (:func:`_support_factor`)."""
    d = x.shape[0]
    S = np.flatnonzero(x)
    sig = np.sign(x[S])
    thresh = mu1 * (1.0 + 1e-12) + 1e-15 * (1.0 + np.abs(rc))     # the KKT test's, per column
    for _ in range(max_swaps):
        if S.size:
            solve, GS = _support_factor(G, S, rho, mu2, cache)
            xs = solve(rc[S] - mu1 * sig)
            bad = np.sign(xs) != sig
            if bad.any():
                S, sig = S[~bad], sig[~bad]
                continue
            g = rc - rho * mm(GS, xs)
        else:
            g = rc
        viol = np.abs(g) > thresh
        viol[S] = False
        if not viol.any():
            cand = np.zeros_like(x)
            if S.size:
                cand[S] = xs
            return cand
        new = np.flatnonzero(viol)
        S = np.concatenate([S, new])
        sig = np.concatenate([sig, np.sign(g[new])])
        order = np.argsort(S)
        S, sig = S[order], sig[order]
    return None


#: pseudo-inverse threshold of :func:`_support_factor` (numpy lstsq's rcond, as used before)
_RCOND = 1e-12
#: the inverse from Cholesky is used when ||A||_F ||A^-1||_F (>= cond_2(A)) is below this,
#: i.e. well below 1 / _RCOND: lstsq would have dropped nothing, so A^+ = A^-1. (LAPACK's
#: condition estimate dpocon was tried: on a9a's one-hot supports it returned 8e-5 for a
#: matrix with eigenvalue 9e-19 / 0.05.)
_CHOL_COND = 1e10


def _support_factor(G, S, rho, mu2, cache=None):
    """(solve, G[:, S]) for A = rho G_SS + mu2 I, ``solve(r)`` = the minimum-norm least-squares
    solution that ``np.linalg.lstsq(A, r, rcond=1e-12)`` gave: A^-1 from Cholesky when A is
    provably well conditioned (``_CHOL_COND``; ~20 us for d = 48 against lstsq's ~230 us), else
    the pseudo-inverse of the rank-revealing pivoted Cholesky (:func:`_pinv_pivoted`) or, when
    that cannot certify the same numerical rank, of a symmetric eigendecomposition (eigenvalues
    <= 1e-12 max|e| dropped, as lstsq); one BLAS thread. The last few supports are cached by
    (S, rho, mu2): once ADMM has found the support a round's active-set step is two small
    mat-vecs (a9a L1: lstsq was 0.7 ms a round)."""
    key = (S.tobytes(), float(rho), float(mu2))
    if cache is not None and key in cache:
        return cache[key]
    A = G[S[:, None], S]
    A *= rho
    n = S.size
    A.flat[::n + 1] += mu2
    Pinv = None
    with one_blas_thread():
        c, info = dpotrf(A, lower=1, clean=1)
        if info == 0 and _chol_cond_bound(c, A) >= _CHOL_COND_SKIP:
            info = 1        # provably too ill-conditioned for the inverse: the pivoted path
        if info == 0:
            Ai, info = dpotri(c, lower=1)
            if info == 0:
                Ai = np.tril(Ai)
                Ai += np.tril(Ai, -1).T
                if np.all(np.isfinite(Ai)) and \
                        np.linalg.norm(A) * np.linalg.norm(Ai) < _CHOL_COND:
                    Pinv = Ai
        if Pinv is None:
            Pinv = _pinv_pivoted(A)
        if Pinv is None:
            Pinv = _pinv_eigh(A)

    def solve(r, Pinv=Pinv):
        return mm(Pinv, r)
    out = (solve, np.ascontiguousarray(G[:, S]))
    if cache is not None:
        # at most 8 supports and ~32 MB (a wide block's supports are large: d = 2000, |S| = 1000
        # is 24 MB an entry)
        size = 8 * S.size * (S.size + G.shape[0])
        if len(cache) >= min(8, max(1, (32 << 20) // max(size, 1))):
            cache.clear()
        cache[key] = out
    return out


#: the Cholesky inverse is not even formed when a lower bound on cond_2(A) from the factor alone
#: is at least this (100x the threshold of the test it would then fail: the test's Frobenius
#: norms are >= the 2-norms, and the margin covers the inverse's round-off)
_CHOL_COND_SKIP = 100.0 * _CHOL_COND


def _chol_cond_bound(c, A) -> float:
    """A lower bound on cond_2(A) from its Cholesky factor ``c`` (A = c c^T): lambda_max(A) >=
    max A_ii and lambda_min(A) = sigma_min(c)^2 <= min c_ii^2 (a triangular matrix's smallest
    singular value is at most its smallest |eigenvalue|, a diagonal entry). A singular support
    (a9a: a centred one-hot group) has a pivot at round-off, so the bound is ~1e16 and the
    inverse, the symmetrization and the two norms that would reject it are skipped."""
    dmin = float(np.min(np.abs(c.diagonal())))
    return np.inf if dmin == 0.0 else float(A.diagonal().max()) / (dmin * dmin)


def _pinv_eigh(A):
    """A^+ of a symmetric PSD A from its eigendecomposition, eigenvalues <= 1e-12 max|e|
    dropped (``np.linalg.lstsq``'s rcond=1e-12 on a symmetric matrix)."""
    e, V = np.linalg.eigh(A)
    keep = e > _RCOND * max(float(np.max(np.abs(e))), 1e-300)
    Vk = V[:, keep]
    return (Vk / e[keep]) @ Vk.T if keep.any() else np.zeros_like(A)


#: :func:`_pinv_pivoted` certifies its rank only when the kept part's smallest eigenvalue is at
#: least this times trace(A) (far above the 1e-12 max|e| cut: both methods keep it) and the
#: dropped Schur complement moves the pseudo-inverse by at most _PIV_PERTURB relative
_PIV_KEEP = 1e-10
_PIV_PERTURB = 1e-9


_BELOW: dict = {}


def _below_diagonal(r, n):
    """The mask np.triu zeroes in an r x n array (entries below the diagonal), kept by shape."""
    m = _BELOW.get((r, n))
    if m is None:
        if len(_BELOW) > 256:
            _BELOW.clear()
        m = _BELOW[(r, n)] = np.tri(r, n, -1, dtype=bool)
    return m


def _pinv_pivoted(A):
    """A^+ of a rank-deficient symmetric PSD A (a support with a centred one-hot group: a9a's
    columns of a category sum to 1) without an eigendecomposition, or None when it cannot
    certify that it keeps the same eigenvalues as :func:`_pinv_eigh` (then that one runs).

    Pivoted Cholesky (LAPACK dpstrf) gives P^T A P = U^T U with decreasing pivots; the first r
    rows, those with pivot U_kk^2 > 1e-12 max diag(A) / n, give A ~ C^T C, C = U_r P^T (r x n,
    full row rank), so A^+ = Y^T Y with Y = (C C^T)^-1 C (one r x r Cholesky). What is dropped
    is the Schur complement E after r steps, PSD with ||E|| <= trace(E) <= (n - r) U_rr^2 =: delta
    (the pivot is the largest remaining diagonal), so A's eigenvalues beyond the r-th are <= delta
    (< 1e-12 max|e|: lstsq drops them too); the r kept ones are >= 1 / trace(A^+) - delta,
    required >= _PIV_KEEP trace(A) (lstsq keeps them), and the pseudo-inverse moves by about
    delta ||A^+||, required <= _PIV_PERTURB. About half eigh's time (n = 40: 111 against 243 us)
    and equal to it on the 330 singular supports of a9a's L1 and elastic-net fits (33 rounds) to
    <= 2e-11 relative (tests/test_central_kernels.py)."""
    n = A.shape[0]
    md = float(A.diagonal().max())
    if not md > 0.0:
        return None
    U, piv, rank, info = dpstrf(A, tol=1e-300, lower=0)
    if info < 0:
        return None
    dg = np.square(U.diagonal()[:rank])
    small = np.flatnonzero(dg <= 1e-12 * md / n)
    r = int(small[0]) if small.size else int(rank)
    if r == 0 or r == n:
        return None
    # the largest remaining diagonal at step r (dpstrf pivots on it); a stop at rank means
    # it was <= 0 in floating point: round-off, counted as eps max diag(A)
    delta = (n - r) * max(float(dg[r]) if r < rank else 0.0, np.finfo(float).eps * md)
    C = np.zeros((r, n))
    C[:, piv - 1] = np.where(_below_diagonal(r, n), 0.0, U[:r])     # np.triu(U[:r])
    L, info = dpotrf(C @ C.T, lower=1, clean=1)
    if info != 0:
        return None
    Y, info = dpotrs(L, C, lower=1)
    if info != 0:
        return None
    Pinv = Y.T @ Y
    tr = float(Pinv.trace())
    if not (np.isfinite(tr) and tr > 0.0):
        return None
    if 1.0 / tr - delta < _PIV_KEEP * float(A.trace()) or delta * tr > _PIV_PERTURB:
        return None
    return Pinv


#: FISTA steps after the first active-set attempt that does not certify (doubled after each
#: further one). A failed attempt costs up to 10 support factorizations, a FISTA step one
#: product with G. a9a's L1 fit (33 rounds): with 8 steps the next attempt often failed as
#: well (459 factorizations a fit, 299 of them in 30 failed attempts); 32 steps: 320, 64: 265
#: and ~20 % less CPU a fit, the same gap at round 33 to 3 digits. The gisette-like L1 set (d =
#: 2000, 120 rounds): 11 -> 5 failed attempts, 296 -> 448 FISTA steps, CPU 13.2 -> 12.9-13.1 s;
#: breast cancer: no failed attempt (docs/benchmarks.md, session 37)
FIRST_BURST = 64


def prox_on_gram(solver, c, rho, x0):
    """argmin lam R(x) + iota_X(x) + rho/2 x^T G x - rho c^T x; returns (x, inner iterations).

    All of it is d-sized work on one BLAS thread: the context is entered once here, so the
    factorizations' own (nested) contexts find one thread and set nothing (a9a L1: ~460
    support factorizations a fit, each of which set both loaded BLAS libraries' threads twice,
    ~15 us a call)."""
    with one_blas_thread():
        return _prox_on_gram(solver, c, rho, x0)


def _prox_on_gram(solver, c, rho, x0):
    G = solver.gram()
    rc = rho * c
    x = np.zeros_like(c) if x0 is None else np.array(x0, dtype=float).reshape(c.shape)
    if solver.constraint is not None:
        x = solver.constraint.project(x)
    step = 1.0 / (rho * _lmax_gram(solver))
    scale = max(1.0, float(np.sqrt(np.sum(rc * rc))))
    grad = lambda w: rho * mm(G, w) - rc                                 # noqa: E731
    prox = lambda u, t: _prox(solver, u, t)                              # noqa: E731
    pen = solver.penalty
    newton = solver.constraint is None and pen.name in ("l1", "elasticnet")
    if not newton:
        return _fista(grad, prox, x, step, solver.inner_tol, scale, solver.inner_max_iter)
    a = getattr(pen, "l1_ratio", 1.0)
    mu1, mu2 = solver.lam * a, solver.lam * (1.0 - a)
    total, burst = 0, FIRST_BURST
    while True:
        cols = [x] if x.ndim == 1 else [x[:, j] for j in range(x.shape[1])]
        rcs = [rc] if x.ndim == 1 else [rc[:, j] for j in range(x.shape[1])]
        cache = solver.__dict__.setdefault("_support_cache", {})
        cands = [_active_set_newton(G, r, rho, mu1, mu2, xc, cache=cache) for r, xc in zip(rcs, cols)]
        if all(cd is not None for cd in cands):
            return (cands[0] if x.ndim == 1 else np.column_stack(cands)), total
        if total >= solver.inner_max_iter:
            return x, total
        x, k = _fista(grad, prox, x, step, solver.inner_tol, scale,
                      min(burst, solver.inner_max_iter - total))
        total += k
        if k < burst:           # FISTA met the tolerance by itself
            return x, total
        burst *= 2


def fista_on_D(solver, v, rho, x0, tol):
    """FISTA on D itself (no Gram): 2 mat-vecs per step; returns (x, inner iterations)."""
    D = solver.D
    if getattr(solver, "_L", None) is None or solver._L_rho != rho:
        from flower_vfl.core.penalties import spectral_norm_sq     # no circle: penalties imports no solver
        solver._L, solver._L_rho = rho * spectral_norm_sq(D), rho
    d = D.shape[1]
    shape = (d,) if v.ndim == 1 else (d, v.shape[1])
    x = np.zeros(shape) if x0 is None else np.array(x0, dtype=float).reshape(shape)
    if solver.constraint is not None:
        x = solver.constraint.project(x)
    scale = max(1.0, float(np.linalg.norm(rho * solver._rhs(v))))
    # centred (solver.center_): Dc^T P (D w - v) = D^T u - mu 1^T u, u = D w - v; ||Dc|| <= ||D||
    return _fista(lambda w: rho * solver._rhs(D @ w - v), lambda u, t: _prox(solver, u, t), x,
                  1.0 / solver._L, tol, scale, solver.inner_max_iter)


def ball_l2(solver, c, rho):
    """argmin lam/2||x||^2 + rho/2||Dx - v||^2 s.t. ||x|| <= r: x(mu) = V c'/(rho e + lam + mu),
    c' = V^T rho D^T v, with mu >= 0 the root of ||x(mu)|| = r when the unconstrained solution
    is outside (bisection on a monotone scalar function: exact to round-off)."""
    e, V = solver._eigh()
    e = rho * e
    cc = mm(V, rho * c, trans=True)
    r, lam = solver.constraint.radius, solver.lam

    def norm_at(mu):
        den = e + lam + mu
        return np.linalg.norm(cc / (den[:, None] if cc.ndim == 2 else den))

    mu = 0.0
    if lam + e.min() <= 0 or norm_at(0.0) > r:
        lo, hi = 0.0, max(1.0, np.linalg.norm(cc) / r)
        while norm_at(hi) > r:
            hi *= 2.0
        for _ in range(200):
            mu = 0.5 * (lo + hi)
            if norm_at(mu) > r:
                lo = mu
            else:
                hi = mu
            if hi - lo <= 1e-15 * hi:
                break
        mu = hi
    den = e + lam + mu
    return mm(V, cc / (den[:, None] if cc.ndim == 2 else den))
