"""The multinomial central update (eq. 7 with the intercept) in O(N K) per Newton iteration.

Minimizes, over w (N x K) and the intercepts b (K),

    F(w, b) = (1/N) sum_i [lse(w_i) - t_i . w_i] - <y, w> + b . sum_i y_i + rho/2 ||a + 1 b^T - w||^2

(w = z + 1 b^T; ``fit_b=False`` fixes b). Per sample the w-Hessian is
H_i = (diag(p_i) - p_i p_i^T)/N + rho I, and N H_i = diag(p_i + N rho) - p_i p_i^T, so
(N H_i)^-1 x = D_i^-1 x + u_i (u_i . x)/(1 - u_i . p_i) with D_i = diag(p_i + N rho),
u_i = D_i^-1 p_i (Sherman-Morrison): O(K) per sample instead of a K x K solve. The b-block is
eliminated through its K x K Schur complement S = rho N I - rho^2 sum_i H_i^-1, singular along
the all-ones direction (softmax is shift invariant), so db is its minimum-norm least-squares
solution. No Flower imports.

Globalization: a step that fails to halve the previous one, or longer than :data:`SEARCH_ABOVE`
in the logits, is searched (backtracking on F; the trial point's softmax is the next iteration's
when it is accepted). Full steps that halve from one to the next converge (the step is H^-1 g with
H >= rho I: a vanishing step is a vanishing gradient). Before, every step above 0.1 was searched,
an F evaluation (and a rejected point's exp) in most of digits' first ~20 rounds. Once the Newton
decrement is at round-off level (1e-10 (1 + |F|)) F differences
are noise and the full step is taken: before, the search stayed on for the rest of the solve
and, at round-off, halved the step down to 1e-10 and stopped there, up to ~1e-6 away from the
solution (Fashion-MNIST: 20-70 softmax evaluations a round).

Stopping: after a full Newton step dw (exact softmax at its start) the new w-gradient is
R_i / N with R_i = p(w_i + dw_i) - p(w_i) - J(w_i) dw_i and the b-gradient is 0; along a
direction v, d^2 p[v, v] = p o (u o u - sigma^2) with u = v - p.v, sigma^2 = Var_p(v) <= range(v)^2/4,
so ||R_i||_1 <= range(dw_i)^2 / 4 <= m^2 (m = max |dw|). Through the bordered system the
error in z = w - b is then at most (m^2 / rho)(1/N + 2/s) per sample (Euclidean), s the
smallest eigenvalue of S / rho off the all-ones direction; with a factor 2 for the Hessian moving
along the step the solve stops when that bound is <= tol (1 + max|w|): no confirming
iteration. It also stops, as before, when a full step is that small. The K x K Schur solve is
S's minimum-norm one (eigenvalues below 1e-10 of the largest cut, as lstsq's rcond did; one
Cholesky solve, below), and s its smallest eigenvalue off the all-ones direction.

Inexact solves (``rtol``, the central node's :data:`CENTRAL_RTOL`): the certificate's bound may
instead be at most ``rtol`` times the first step's length m0 (for the central node, the round's
move of w). ADMM keeps its fixed point under summable subproblem errors (Eckstein and Bertsekas
1992), and errors proportional to the rounds' steps are summable where those shrink linearly, as
measured: on digits (K = 10) the rounds to a gap of 1e-4 / 1e-6 / 1e-8 are the same for rtol
from 0 to 1e-1 (51 / 79 / 106 with Anderson from round 1; 48 / 72 / 99 with its stall gate), and
at 1e-3 a solve takes 2.8 softmax evaluations instead of 3.8 (2.35 with the globalization above).
Binary losses never come here (``core/central.py``'s joint Newton).

Predictor: the central node's previous solve left p(w_prev) = t + N y_plus to its tolerance
(y_plus: the dual that solve computed), so ``p0`` gives the first iteration's softmax at the warm
start without an exp (:meth:`~flower_vfl.core.central.CentralUpdate._z_and_intercept`). That
step only chooses the start (searched like any other when longer than SEARCH_ABOVE, F at the warm
start costing one exp); only a step from an exact softmax certifies. Measured on Fashion-MNIST
(60000 x 10, rounds 20-235): 2-4 softmax evaluations a round instead of 11-78.

Softmax: rows are shifted by their mean, not their max (:func:`_softmax_into`); a softmax after
the first one in a solve reuses the last shift while w moved by at most :data:`SHIFT_DRIFT`
since (no pass at all).

Layout and per-iteration calls (what a solve costs where N K is small, e.g. digits' 1797 x 10:
there a pass over an N x K array takes a few microseconds and a solve is numpy calls): the solve
runs class-major, every N x K array transposed to K x N, so a per-sample quantity broadcasts
along contiguous rows of length N and a per-sample sum over the K classes adds K contiguous rows
(sample-major, numpy's inner loops ran over K = 10 entries: those broadcasts and sums cost 2-4x
a plain pass). The K x K Schur system is one Cholesky solve (LAPACK posv) of S + (tr S / K^2)
1 1^T, whose solution off the all-ones direction is S's minimum-norm one (:func:`_schur_solve`;
numpy's eigh took ~20 us, posv ~1); the certificate's eigenvalue is computed only when the
step's length already passes. dF/db is 0
after a full step (F is quadratic in b, the step solves the bordered system's b-row, and its
all-ones part is F's shift invariance): it is formed at the start and after a damped step only.
The central node's :func:`central_solve` takes z, b and T(u)'s dual and returns z, building the
transposed start and predictor in the passes that form them.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.lapack import dposv as _posv, dsyevd as _syevd

__all__ = ["CENTRAL_RTOL", "central_solve", "multinomial_newton", "softmax_lse"]

#: the central node's solve stops once its error bound is below this fraction of the round's
#: first step (the module docstring, "Stopping"), or below ``tol``
CENTRAL_RTOL = 1e-3
#: a Newton step is searched (backtracking on F) when it fails to halve the previous one, or is
#: longer than this in the logits (max |dw|). Full steps of up to 30 that halve from one to the
#: next converge (their lengths sum to at most twice the first; a zero step is the solution).
#: Digits (K = 10, 79 rounds): 2.35 softmax evaluations a solve instead of 2.78 with the former 0.1
SEARCH_ABOVE = 30.0
#: a softmax in a solve reuses the last exact one's row shift while |w| moved by at most this
#: since (exp(w - shift) then never underflows a whole row; an overflow takes the row max)
SHIFT_DRIFT = 30.0


def _rowmax(w):
    # a loop over the K columns: numpy's max(axis=1) on an (N, K) array with small K was
    # ~50x slower (26 ms vs 0.5 ms at 60000 x 10)
    m = w[:, 0].copy()
    for j in range(1, w.shape[1]):
        np.maximum(m, w[:, j], out=m)
    return m


def softmax_lse(w):
    """(softmax(w) row-wise, logsumexp(w) row-wise) from one exp, without axis-1 max/sum.

    An (N, K) ``w`` is worked on class-major (one transposing copy, then contiguous passes: the
    module docstring, "Layout"); the softmax returned is then the transpose of a K x N array."""
    w = np.asarray(w, dtype=float)
    if w.ndim != 2:
        E = np.empty_like(w)
        m, s = _softmax_into(w, E)
        return E, np.log(s) + m
    W = np.ascontiguousarray(w.T)
    E = np.empty_like(W)
    m, s = _softmax_into_T(W, E)
    lse = np.log(s)
    lse += m
    return E.T, lse


def _softmax_into(w, E, shift=None):
    """softmax(w) row-wise into ``E``; returns (row shift m, row sum s of exp(w - m)):
    logsumexp = log(s) + m. The shift is ``shift`` when given, else the row mean: any m with
    max_k w_ik - m_i below exp's overflow (~709) gives the same relative precision, and the
    mean (one contiguous pass) is >= 8x cheaper than a row max over K strided columns
    (60000 x 10: 0.5 ms against 7.7 ms); a row whose range exceeds that falls back to the row
    max (a row max above the shift never underflows the whole row)."""
    m = np.einsum("ij->i", w) / w.shape[1] if shift is None else shift
    np.subtract(w, m[:, None], out=E)
    with np.errstate(over="ignore"):
        np.exp(E, out=E)
    s = np.einsum("ij->i", E)
    if not float(s.max()) < np.inf:        # overflow (a row range above ~709): the row max
        m = _rowmax(w)
        np.subtract(w, m[:, None], out=E)
        np.exp(E, out=E)
        s = np.einsum("ij->i", E)
    E /= s[:, None]
    return m, s


def _F(W, b, Fc, rho, n, lse, scratch):
    """F(w, b) of the module docstring in the class-major layout (``W``: w^T, K x N; ``Fc``:
    :func:`_F_terms`; ``lse``: the rows' logsumexp; ``scratch``: a K x N buffer)."""
    aT, tyT, sy = Fc
    r = np.subtract(aT, W, out=scratch)
    r += b[:, None]
    val = float(lse.sum()) / n - float(np.vdot(tyT, W))
    return val + float(b @ sy) + 0.5 * rho * float(np.vdot(r, r))


def _F_terms(a, y, t, n, sy):
    """(a^T, (t / N + y)^T, sum_i y_i) for :func:`_F`: formed only when a step is searched."""
    tyT = np.divide(t.T, n, order="C")
    tyT += y.T
    return np.ascontiguousarray(a.T), tyT, sy


def _work(work, shape, names):
    """Named buffers kept in ``work`` (a dict the caller keeps between calls: a fresh
    N x K array per temporary is page-faulted in again every round)."""
    for k in names:
        if k not in work or work[k].shape != shape:
            work[k] = np.empty(shape)
    return [work[k] for k in names]


_NAMES = ("W", "P", "P2", "NG", "Dinv", "U", "UC", "X", "C1", "WT")


def multinomial_newton(a, y, t, rho, n, w0, b0, fit_b=True, max_iter=50, tol=1e-13, p0=None, work=None, rtol=0.0):
    """Joint Newton for (w, b); returns (w, b). ``a``, ``y``, ``t``, ``w0``: (N, K); ``b0``: (K,).

    ``p0``: softmax(w0) when the caller knows it (the predictor of the module docstring), else
    None. ``work``: a dict for the buffers, kept by the caller between calls (or None).
    ``rtol``: the relative stop of the module docstring (0: the certificate at ``tol`` only).
    """
    N, K = a.shape
    work = {} if work is None else work
    W, P = _work(work, (K, N), _NAMES)[:2]
    np.copyto(W, w0.T)
    if p0 is not None:
        np.copyto(P, p0.T)
    b = np.array(b0, dtype=float) if fit_b else np.zeros(K)
    W, b = _newton(a, y, t, rho, n, W, b, p0 is not None, fit_b, max_iter, tol, work, rtol)
    return np.ascontiguousarray(W.T), b


def central_solve(a, y, t, rho, n, z, b, y_plus=None, work=None, rtol=0.0):
    """The central node's z-update with its intercept: (z, b) minimizing F at w = z + 1 b^T from
    the warm start (``z``, ``b``), for :class:`~flower_vfl.core.central.CentralUpdate`. ``y_plus``:
    the dual the previous solve left (p(z + b) = t + N y_plus to its tolerance: the predictor),
    or None. Returns a new (N, K) z and b; ``work`` as in :func:`multinomial_newton`."""
    N, K = a.shape
    work = {} if work is None else work
    W, P = _work(work, (K, N), _NAMES)[:2]
    np.add(z.T, b[:, None], out=W)
    if y_plus is not None:
        tT = work.get("tT")
        if tT is None or work.get("t_src") is not t or tT.shape != (K, N):
            tT = work["tT"] = np.ascontiguousarray(t.T, dtype=float)      # the labels: once a run
            work["t_src"] = t
        np.multiply(y_plus.T, n, out=P)
        P += tT
    W, b = _newton(a, y, t, rho, n, W, np.array(b, dtype=float), y_plus is not None, True, 50, 1e-13, work, rtol)
    return np.subtract(W.T, b, out=np.empty((N, K))), b


def _newton(a, y, t, rho, n, W, b, predictor, fit_b, max_iter, tol, work, rtol):
    """The solve, class-major: ``W`` (w^T, K x N, a ``work`` buffer) holds the start and is
    updated in place; ``predictor``: ``work['P']`` holds p0^T. Returns (W, b)."""
    N, K = a.shape
    _, P, P2, NG, Dinv, U, UC, X, C1, WT = _work(work, (K, N), _NAMES)
    ones = work.get("ones")
    if ones is None or ones.shape != (N,):
        ones = work["ones"] = np.ones(N)
    nrho = n * rho
    # N dF/dw = p + N rho (w - b) - (t + N y + N rho a): the last term once per call, formed
    # sample-major (contiguous) and transposed once
    c1 = work.get("c1")
    if c1 is None or c1.shape != a.shape:
        c1 = work["c1"] = np.empty(a.shape)
    np.multiply(y, n, out=c1)
    c1 += t
    c1 += np.multiply(a, nrho, out=X.reshape(a.shape))
    np.copyto(C1, c1.T)
    sy = ones @ y
    sa = ones @ a if fit_b else None
    diag = slice(None, None, K + 1)            # the diagonal of a K x K array's .flat
    zeros = np.zeros(K)
    gb = None if fit_b else zeros
    P_cur, lse = (P, None) if predictor else (None, None)
    Fc = None
    f, m_prev, m0 = None, np.inf, None
    shift, drift = None, 0.0        # the row shift of the last exact softmax, |w| moved since
    for _ in range(max_iter):
        if P_cur is None:
            reuse = shift is not None and drift <= SHIFT_DRIFT
            mx, s = _softmax_into_T(W, P, shift if reuse else None)
            P_cur, lse, drift = P, (mx, s), drift if reuse and mx is shift else 0.0
            shift = mx
        np.multiply(W, nrho, out=NG)
        NG += P_cur
        NG -= C1
        if fit_b:
            NG -= (nrho * b)[:, None]
            if gb is None:                                  # dF/db (0 after a full step)
                gb = sy + rho * (sa + N * b - W @ ones)
        np.add(P_cur, nrho, out=Dinv)
        np.divide(1.0, Dinv, out=Dinv)                      # D^-1
        np.multiply(Dinv, P_cur, out=U)                     # u = D^-1 p
        # 1 - u.p = sum_k p_k (1 - p_k / (p_k + N rho)) = N rho sum_k u_k > 0 (sum_k p_k = 1):
        # a sum of K contiguous rows, without 1 - u.p's cancellation where p is one-hot
        den = U.sum(axis=0)
        den *= nrho
        np.multiply(U, 1.0 / den, out=UC)
        v = np.einsum("ki,ki->i", U, NG)                    # u . (N g)
        if fit_b:
            hg = np.einsum("ki,ki->k", Dinv, NG) + UC @ v   # N sum_i H_i^-1 g_i
            S = UC @ U.T                                    # S = rho N I - rho^2 sum_i H_i^-1
            S.flat[diag] += Dinv @ ones
            S *= -rho * rho * n
            S.flat[diag] += nrho
            db = _schur_solve(S, -gb - rho * hg, n == N)
            # dw = (N H)^-1 (N rho db - N g)
            np.subtract((nrho * db)[:, None], NG, out=X)
            r = nrho * (db @ U) - v
        else:
            db = zeros
            np.negative(NG, out=X)
            r = -v
        X *= Dinv
        X += np.multiply(UC, r, out=WT)
        dw = X
        m = max(float(dw.max()), -float(dw.min()), float(db.max()), -float(db.min()))
        exact = not predictor
        if predictor:           # softmax from the dual: a short step is taken, a long one searched
            predictor = False
            if m > SEARCH_ABOVE:    # F(w0) needs its logsumexp: one exp (the step is kept)
                mx, s = _softmax_into_T(W, P2)
                lse, shift, drift = (mx, s), mx, 0.0
        # far from the optimum (a step not halving the last, or above SEARCH_ABOVE in the logits)
        # backtracking on F keeps Newton globally convergent
        step, trial = 1.0, False
        if m > SEARCH_ABOVE or m > 0.5 * m_prev:
            dec = -(float(np.vdot(NG, dw)) / n + float(gb @ db))    # Newton decrement^2
            if Fc is None:
                Fc = _F_terms(a, y, t, n, sy)
            if f is None:
                f = _F(W, b, Fc, rho, n, np.log(lse[1]) + lse[0], WT)
            trial = dec > 1e-10 * (1.0 + abs(f))        # else F differences are round-off
            while trial:
                np.multiply(dw, step, out=WT)
                WT += W
                mx2, s2 = _softmax_into_T(WT, P2, shift if drift + step * m <= SHIFT_DRIFT else None)
                f_new = _F(WT, b + step * db, Fc, rho, n, np.log(s2) + mx2, NG)
                if f_new <= f - 1e-4 * step * dec or step < 1e-10:
                    break
                step *= 0.5
        if trial:                                   # the accepted point, with its softmax
            np.copyto(W, WT)
            P, P2 = P2, P
            b = b + step * db
            f, P_cur, lse = f_new, P, (mx2, s2)
            drift = drift + step * m if mx2 is shift else 0.0
            shift = mx2
            if step != 1.0 and fit_b:
                gb = None
        else:
            W += dw
            b = b + db
            f, P_cur, lse = None, None, None
            drift += m
        if step == 1.0:
            gb = zeros                                  # the module docstring, "Layout"
        thr = tol * (1.0 + max(float(W.max()), -float(W.min())))
        if step == 1.0 and m <= thr:                # (a damped step's length proves nothing)
            break
        if m0 is None:
            m0 = m
        thr_c = max(thr, rtol * m0)
        if exact and step == 1.0 and 2.0 * m * m / (rho * n) <= thr_c:    # certificate (module docstring)
            if not fit_b:
                break
            ev1 = _schur_eig1(S) / rho               # S's smallest off the all-ones direction
            if ev1 > 0.0 and 2.0 * m * m / rho * (1.0 / n + 2.0 / ev1) <= thr_c:
                break
        m_prev = step * m
    # the buffers may have been swapped: keep the names pointing at the arrays in use
    work["P"], work["P2"] = P, P2
    return W, b


def _softmax_into_T(W, E, shift=None):
    """:func:`_softmax_into` class-major (``W``, ``E``: K x N; the shift and the row sums are
    N-vectors, sums of K contiguous rows)."""
    m = W.sum(axis=0) / W.shape[0] if shift is None else shift
    np.subtract(W, m, out=E)
    with np.errstate(over="ignore"):
        np.exp(E, out=E)
    s = E.sum(axis=0)
    if not float(s.max()) < np.inf:        # overflow (a row range above ~709): the row max
        m = W.max(axis=0)
        np.subtract(W, m, out=E)
        np.exp(E, out=E)
        s = E.sum(axis=0)
    E *= 1.0 / s
    return m, s


def _schur_solve(S, rhs, singular_ones):
    """The minimum-norm solution of S db = rhs, S the K x K Schur complement (symmetric positive
    semidefinite; with n = N singular along the all-ones direction, softmax being shift
    invariant). Then S + (tr S / K^2) 1 1^T is positive definite and maps the all-ones
    direction to itself, so one Cholesky solve (LAPACK posv: ~1 us at K = 10, numpy's eigh ~20
    us) with the all-ones part of the solution removed is the minimum-norm solution.
    Otherwise, or where Cholesky fails or leans on an eigenvalue below 1e-10 tr S (another
    direction numerically singular): the eigendecomposition, eigenvalues below 1e-10 of the
    largest cut (lstsq's rcond)."""
    K = S.shape[0]
    if singular_ones:
        # (S + c 1 1^T) x = rhs: S x's all-ones part is 0, so x's part off it is S^+ rhs. A
        # solution longer than |rhs| / (1e-10 tr S) used an eigenvalue below that cut (a class
        # with p ~ 0 in every row): the eigendecomposition cuts it, as lstsq's rcond did
        tr = S.trace()
        _, x, info = _posv(S + tr / (K * K), rhs)
        if info == 0:
            x -= float(sum(x.tolist())) / K
            if 1e-20 * tr * tr * float(np.dot(x, x)) <= float(np.dot(rhs, rhs)):
                return x
    lam_s, V = np.linalg.eigh(S)
    inv = np.divide(1.0, lam_s, out=np.zeros(K), where=lam_s > 1e-10 * lam_s[-1])
    return V @ (inv * (V.T @ rhs))


def _schur_eig1(S) -> float:
    """S's second-smallest eigenvalue (the smallest is ~0: the all-ones direction)."""
    return float(_syevd(S, compute_v=0)[0][1])
