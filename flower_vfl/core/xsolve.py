"""The party's x-update solvers (paper eq. 6), chosen by the shape of D_m. No Flower imports.

Every party solves, in completed-square form,

    x_m = argmin_{x in X_m}  lam R(x) + (rho_x / 2) || D_m x - v ||^2.

Methods (``method=``; 'auto' picks one from the shape and logs the choice):

- ``'gram'``: keep the rho-independent Gram G = D^T D (d x d; sparse blocks: :func:`sparse_gram`,
  counting the pairs of nonzeros within rows) and, for d <= ``EIG_MAX``, its
  eigendecomposition G = V diag(e) V^T. A new rho then costs O(d^2) (eig) or one O(d^3/3)
  Cholesky of lam I + rho G (d > EIG_MAX), never a pass over the N rows. L2:
  x = V (V^T rho D^T v) / (rho e + lam), one D^T v per round. L1 / elastic net: an active-set
  Newton on the support, with FISTA in d-space (gradient rho (G x - D^T v), O(d^2) per step)
  until the support is found; box / ball: FISTA in d-space; L2 on a ball: the exact secular
  equation on the eigendecomposition.
- ``'cg'``: no Gram at all; warm-started preconditioned conjugate gradients on
  (lam I + rho D^T D) x = rho D^T v (2 mat-vecs per iteration) for sparse blocks with d > N or
  very large N and many nonzeros per row (``GRAM_PAIRS_PER_NNZ``); the preconditioner is
  Jacobi plus the rank-one term of the column means (``XSolver._preconditioner``). Inexact:
  relative residual <= max(inner_tol, min(0.1, 1e-3 ||theta q|| / ||v||)), i.e. tied to the
  ADMM residual the party received (docs/math.md, Section 6). Non-smooth
  penalties use FISTA on D with the same tolerance rule.
- ``'dual'``: the N x N form (lam I + rho D D^T) w = rho v, x = D^T w, through the
  eigendecomposition of D D^T (N <= EIG_MAX, dense blocks only), L2 without constraints.
- ``'chol'``: the previous direct solver (Cholesky / splu of lam I + rho D^T D per rho).
"""

from __future__ import annotations

import logging

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from .penalties import Ball

__all__ = ["XSolver", "choose_method", "sparse_gram", "METHODS", "EIG_MAX", "GRAM_MAX"]

LOG = logging.getLogger("flower_vfl.core")
METHODS = ("auto", "gram", "cg", "dual", "chol")
#: largest d (or N for 'dual') whose eigendecomposition is kept (eigh ~ 9 d^3 flops)
EIG_MAX = 1500
#: largest d for which the dense d x d Gram is formed
GRAM_MAX = 4000
#: sparse blocks with more rows than this use CG unless their Gram is cheap (below)
CG_ROWS = 200_000
#: ... i.e. unless the pairs of nonzeros within rows, sum_i nnz_i (nnz_i - 1) / 2, are at most
#: this many per stored entry. The pair-counting Gram (:func:`sparse_gram`) costs ~5-9 ns a
#: pair and CG ~3 more mat-vecs a round than 'gram' (~1.3 ns per entry each), so the Gram
#: pays for itself within ~1.3-2 x this many rounds (1M x 300 binary at 5 %: 7.5 pairs per
#: entry, ~10 rounds; measured in benchmarks/bench_scale.py)
GRAM_PAIRS_PER_NNZ = 16
#: inner relative tolerance = FORCING * ||theta q|| / ||v|| (floored at inner_tol): Anderson
#: extrapolates the round map, so it needs T evaluated well beyond the ADMM residual
FORCING = 1e-3


def _gram_pairs(D) -> float:
    """sum over rows of nnz_i (nnz_i - 1) / 2: the pairs :func:`sparse_gram` counts."""
    nz = np.diff(D.tocsr().indptr).astype(float)
    return float(np.einsum("i,i->", nz, nz - 1.0)) / 2.0


def choose_method(D, penalty, constraint) -> str:
    """The x-update method for a block: see the module docstring. Pure function of the shape."""
    n, d = D.shape
    if sp.issparse(D):
        if d > GRAM_MAX or d > n:
            return "cg"
        if n > CG_ROWS and _gram_pairs(D) > GRAM_PAIRS_PER_NNZ * max(D.nnz, 1):
            return "cg"
        return "gram"
    if d <= GRAM_MAX:
        return "gram"
    if n <= EIG_MAX and penalty.smooth_quadratic and constraint is None:
        return "dual"
    return "cg"


#: d x d products up to this many entries run in einsum's own loop, not BLAS: with 2 OpenBLAS
#: threads on a loaded 2-core machine a 300 x 300 gemv stalled a round for ~30 ms
#: (benchmarks/bench_scale.py); above it the BLAS threads pay off
SMALL_MM = 1_000_000


_CONTROLLER = []


class _OneBlasThread:
    """Context: every loaded BLAS at one thread, restored on exit (see :func:`one_blas_thread`)."""

    __slots__ = ("libs", "old")

    def __init__(self, libs):
        self.libs, self.old = libs, None

    def __enter__(self):
        self.old = [lc.num_threads for lc in self.libs]
        for lc, n in zip(self.libs, self.old):
            if n != 1:
                lc.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        for lc, n in zip(self.libs, self.old):
            if n != 1:
                lc.set_num_threads(n)
        return False


def one_blas_thread():
    """Context limiting BLAS/LAPACK to one thread (setup: Gram, eigh, Cholesky; the central
    node's N-vector kernels and Anderson's products over its history, every round).

    Measured on this 2-core machine under load (1-min load 15): eigh of a 300 x 300 Gram took
    1.4-10.8 s with OpenBLAS's 2 threads and 72-108 ms with 1; 1000 x 1000: 7-25 s vs 1.0-1.3 s;
    a 5 x 4M gemv (Anderson at 1M rows) 15.9 ms with 2 threads and 12.0 ms with 1 (it is memory
    bound). With the other core busy (1-min load 1.4) a dot of two a9a-sized N-vectors took
    855 us with 2 threads, 5.7 us with 1 (15.7 us in einsum's own loop). On a quiet machine
    1 thread costs at most the 2x of the second core. The ``threadpoolctl`` controller is built
    once per process and its BLAS library controllers are set directly (``threadpool_limits(1)``
    rescans the loaded libraries every time: 0.7-0.85 ms a call; ``limit`` on the cached
    controller ~10-26 us; this ~4 us), so the context is cheap enough for a per-round kernel."""
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController
            ctl = ThreadpoolController()
            _CONTROLLER.append([lc for lc in ctl.lib_controllers if lc.user_api == "blas"])
        except ImportError:                  # pragma: no cover - shipped with scikit-learn
            _CONTROLLER.append([])
    return _OneBlasThread(_CONTROLLER[0])


def mm(A, B, trans=False):
    """A @ B (A^T @ B if ``trans``) for a small dense A without BLAS threads; B (d,) or (d, K)."""
    if A.size > SMALL_MM:
        return (A.T if trans else A) @ B
    spec = ("ji," if trans else "ij,") + ("j->i" if np.ndim(B) == 1 else "jk->ik")
    return np.einsum(spec, A, B)


def _norm(v) -> float:
    v = np.ravel(v)
    return float(np.sqrt(np.einsum("i,i->", v, v)))


class XSolver:
    """Solves eq. (6) for one party: argmin_{x in X} lam R(x) + rho/2 ||D x - v||^2.

    Parameters
    ----------
    D : (N, d) array or sparse matrix
    penalty : Penalty
    lam : float
    constraint : None, Ball or Box
    inner_tol : float, default=1e-12
        Floor of the relative inner tolerance (iterative paths).
    inner_max_iter : int, default=5000
    method : {'auto', 'gram', 'cg', 'dual', 'chol'}, default='auto'
        See the module docstring; ``method_`` holds the one in use.

    ``v`` may be (N,) or (N, K) (multinomial). ``solve(v, rho, x0, outer)`` warm-starts the
    iterative paths from ``x0``; ``outer`` (the norm of the ADMM residual the party received)
    loosens the inner tolerance of the CG / FISTA-on-D paths while the outer iteration is far
    from converged. The solver keeps no iterate between calls (the warm start is the party's
    x), so one solver can serve several runs (the Flower client caches it).
    """

    def __init__(self, D, penalty, lam: float, constraint=None, inner_tol: float = 1e-12,
                 inner_max_iter: int = 5000, method: str = "auto"):
        if method not in METHODS:
            raise ValueError(f"x_solver={method!r} is not supported; choose one of {list(METHODS)}")
        self.D = D
        self.sparse = sp.issparse(D)
        self.penalty = penalty
        self.lam = float(lam)
        self.constraint = constraint
        self.inner_tol = inner_tol
        self.inner_max_iter = inner_max_iter
        n, d = D.shape
        auto = method == "auto"
        if auto:
            method = choose_method(D, penalty, constraint)
        if method == "dual" and not (self.direct and n <= EIG_MAX and not self.sparse):
            raise ValueError(f"x_solver='dual' needs a dense block with N <= {EIG_MAX} and penalty='l2' "
                             f"without a constraint; got N={n}, penalty={penalty.name!r}, "
                             f"constraint={constraint!r}. Use 'gram' or 'cg'")
        if method == "gram" and d > GRAM_MAX:
            raise ValueError(f"x_solver='gram' needs d <= {GRAM_MAX}; the block has d={d}. Use 'cg'")
        if method in ("cg", "chol") and self.direct and self.lam <= 0:
            raise ValueError(f"penalty='l2' with lam={lam!r} and x_solver={method!r} needs lam > 0")
        self.method_ = method
        LOG.info("x-update solver %s%s for a %s block N=%d, d=%d (penalty=%s, constraint=%s)",
                 method, " (auto)" if auto else "", "sparse" if self.sparse else "dense", n, d,
                 penalty.name, type(constraint).__name__ if constraint is not None else None)
        self._rho = None
        #: D^T built once (scipy builds a new CSC object on every ``D.T``: ~12-17 us a call at
        #: a9a's size, a tenth of the product itself); it shares D's arrays
        self.DT = D.T
        self._G = self._eig = self._chol = self._fac = None
        self._diag = None
        self.last_carry = None
        self.inner_iters_ = 0

    # ------------------------------------------------------------------ setup
    @property
    def direct(self) -> bool:
        return self.penalty.smooth_quadratic and self.constraint is None

    @property
    def inexact(self) -> bool:
        """True when the solve is iterative with a tolerance tied to the outer residual."""
        return self.method_ == "cg"

    @property
    def ball_l2(self) -> bool:
        return self.penalty.smooth_quadratic and isinstance(self.constraint, Ball)

    def gram(self):
        """G = D^T D, dense d x d, formed once (the only pass over the data)."""
        if self._G is None:
            if self.sparse:
                self._G = sparse_gram(self.D)
            else:
                with one_blas_thread():
                    self._G = np.asarray(self.D.T @ self.D)
        return self._G

    def _eigh(self):
        if self._eig is None:
            if self.method_ == "dual":
                K = self.D @ self.D.T
                self._eig = np.linalg.eigh(np.asarray(K))
            else:
                e, V = np.linalg.eigh(self.gram())
                self._eig = (np.maximum(e, 0.0), V)
        return self._eig

    def _factorize(self, rho):
        """Per-rho work: O(d^2) or less on the eigendecomposition; a d^3/3 Cholesky of the
        cached Gram when d > EIG_MAX; the old direct factorization for 'chol'. One BLAS thread."""
        with one_blas_thread():
            self._factorize_inner(rho)

    def _factorize_inner(self, rho):
        self._rho = rho
        m, n, d = self.method_, *self.D.shape
        if m == "dual" or (m == "gram" and d <= EIG_MAX):
            e = self._eigh()[0]
            if self.direct and self.lam <= 0 and not e.min() > 1e-12 * max(e.max(), 1e-300):
                raise ValueError("the x-update system lam*I + rho*D^T D is singular: use lam > 0 or a "
                                 "block with full column rank")
        elif m == "gram":
            A = rho * self.gram()
            A[np.diag_indices_from(A)] += self.lam
            self._chol = sla.cho_factor(A, lower=False, check_finite=False) if self.direct else None
        elif m == "chol":
            self._fac = _direct_factor(self.D, rho, self.lam) if self.direct else None
        elif m == "cg" and self._diag is None:    # column sums and norms^2: one pass, no copy of D
            self._diag, self._colsum = _column_stats(self.D)

    # ------------------------------------------------------------------ solve
    def solve(self, v, rho, x0=None, outer=None, carry=None):
        """argmin_{x in X} lam R(x) + rho/2 ||D x - v||^2 (warm start ``x0``).

        ``carry``: (D x0, D^T D x0) from the previous CG solve (else recomputed). After a CG
        solve ``last_carry`` holds (D x, D^T D x) of the result (else None)."""
        self.last_carry = None
        if self._rho != rho:
            self._factorize(rho)
        m = self.method_
        if m == "chol" and self.direct:
            return _direct_solve(self._fac, self.D, v, rho)
        if m == "dual":
            s, U = self._eig
            w = mm(U, mm(U, rho * v, trans=True) / _col(self.lam + rho * s, v))
            return self.DT @ w
        if m == "cg" or (m == "chol" and not self.direct):
            rtol = self._outer_rtol(v, outer, x0)
            if self.direct:
                return self._cg(v, rho, x0, rtol, carry)
            from .xsolve_prox import fista_on_D
            x, it = fista_on_D(self, v, rho, x0, rtol)
            self.inner_iters_ += it
            return x
        # 'gram'
        c = self.DT @ v
        if self.direct:
            if self._chol is not None:
                return sla.cho_solve(self._chol, rho * c, check_finite=False)
            e, V = self._eig
            return mm(V, mm(V, rho * c, trans=True) / _col(rho * e + self.lam, c))
        if self.ball_l2:
            from .xsolve_prox import ball_l2
            return ball_l2(self, c, rho)
        from .xsolve_prox import prox_on_gram
        x, it = prox_on_gram(self, c, rho, x0)
        self.inner_iters_ += it
        return x

    def _outer_rtol(self, v, outer, x0=None):
        if outer is None:
            return self.inner_tol
        if outer == 0.0 and (x0 is None or not np.any(x0)):
            # the very first round (q = 0, x = 0): nothing to be exact about yet; the floor
            # made it 10 CG iterations against ~4 later (sparse 300k x 600)
            return max(self.inner_tol, FORCING)
        return max(self.inner_tol, min(0.1, FORCING * outer / max(_norm(v), 1e-300)))

    def _cg(self, v, rho, x0, rtol, carry=None):
        """Preconditioned CG on (lam I + rho D^T D) x = rho D^T v, column-wise for (N, K).

        1 + 2k mat-vecs for k iterations: D x and D^T D x are carried along (D x += a D p,
        D^T D x += a D^T D p) from one round to the next (``carry``, kept by the party; D^T D x
        is updated in place, D x copied since it is returned as the release), so the start's
        residual rho D^T v - lam x0 - rho D^T D x0 costs one product and the party's release
        D x none (``last_carry``). rho-independent, so a new rho costs nothing. Work vectors:
        x, r, z, p and one scratch d-vector, updated in place together with the two products
        scipy allocates per iteration (A p is never formed: p^T A p from two dots, r -= a A p in
        two steps); on the text-like 50k x 200k blocks a d-vector is 1.6 MB, 14 % of the data."""
        D, DT, lam = self.D, self.DT, self.lam
        K = v.shape[1:] if np.ndim(v) == 2 else ()
        shape = (D.shape[1],) + K
        x = np.zeros(shape) if x0 is None else np.array(x0, dtype=float).reshape(shape)
        if carry is None or x0 is None:
            Dx = D @ x
            DtDx = DT @ Dx
        else:
            # D x becomes the party's release s (a fresh array each round); D^T D x is private
            Dx, DtDx = np.array(carry[0], dtype=float), _own(carry[1], shape)
        r = DT @ v
        r *= rho
        stop = rtol * np.maximum(np.sqrt(_cdot(r, r)), 1e-300)    # rtol * ||rho D^T v||
        tmp = np.multiply(DtDx, rho)
        r -= tmp
        r -= np.multiply(x, lam, out=tmp)
        precond = self._preconditioner(rho, r)
        zv = precond(r, np.empty(shape), tmp)
        p = zv.copy()
        rz = _cdot(r, zv)
        it = 0
        for it in range(1, self.inner_max_iter + 1):
            if np.all(np.sqrt(_cdot(r, r)) <= stop):
                it -= 1
                break
            Dp = D @ p
            DtDp = DT @ Dp
            pAp = rho * _cdot(p, DtDp) + lam * _cdot(p, p)       # p^T A p without forming A p
            a = np.where(pAp > 0, rz / np.where(pAp > 0, pAp, 1.0), 0.0)
            # in place, in the arrays scipy returned: a p, a D p, a D^T D p; then
            # r -= a A p = rho (a D^T D p) + lam (a p)
            p *= a
            Dp *= a
            DtDp *= a
            x += p
            Dx += Dp
            DtDx += DtDp
            DtDp *= rho
            r -= DtDp
            r -= np.multiply(p, lam, out=DtDp)
            del Dp, DtDp
            precond(r, zv, tmp)
            rz_new = _cdot(r, zv)
            beta = np.where(rz > 0, rz_new / np.where(rz > 0, rz, 1.0), 0.0)
            p *= np.where(a != 0, beta / np.where(a != 0, a, 1.0), 0.0)   # p holds a p
            p += zv
            rz = rz_new
        self.inner_iters_ += it
        self.last_carry = (Dx, DtDx)
        return x

    def _preconditioner(self, rho, like):
        """r -> M^-1 r for M = lam I + rho (Dc^T Dc restricted to its diagonal + N mu mu^T).

        D^T D = Dc^T Dc + N mu mu^T with Dc = D - 1 mu^T the column-centred block (mu = column
        means). M keeps the centred Gram's diagonal and the mean's rank-one term, so its
        diagonal is Jacobi's (lam + rho ||D_:j||^2) and it also captures the direction of the
        mean, the top eigenvector of a non-negative block (binary / count features): on the
        1M x 600 binary set CG needed ~3 iterations a round with Jacobi and ~1 with this.
        Applied in O(d) by Sherman-Morrison; rho-dependent but formed from the cached column
        statistics, so a new rho still costs no pass over the data."""
        n = self.D.shape[0]
        mu = self._colsum / n
        dg = self.lam + rho * np.maximum(self._diag - self._colsum * mu, 0.0)
        if not np.all(dg > 0):               # lam = 0 with a constant column: plain Jacobi
            Minv = 1.0 / _col(self.lam + rho * self._diag, like)
            return lambda r, out, tmp: np.multiply(Minv, r, out=out)
        w = np.divide(mu, dg, out=mu)        # Dg^-1 mu
        c = rho / (1.0 + rho * float(_cdot(self._colsum, w)))   # rho N / (1 + rho N mu^T w)
        Dinv = np.divide(1.0, dg, out=dg)
        Dinv, w, mu = _col(Dinv, like), _col(w, like), _col(self._colsum, like)   # N mu

        def apply(r, out, tmp):
            """M^-1 r into ``out`` (``tmp``: scratch of the same shape)."""
            np.multiply(Dinv, r, out=out)
            out -= np.multiply(w, c * _cdot(mu, out), out=tmp)
            return out
        return apply


def sparse_gram(D, chunk=1 << 20):
    """D^T D (dense d x d) of a sparse block by counting the pairs of each row's nonzeros.

    scipy's sparse product costs ~15 ns per sum_i nnz_i^2 term (6.9 s for the 1M x 300 binary
    block). Here the rows are grouped by their number k of nonzeros; for each group the codes
    j * d + j' of the k (k - 1) / 2 pairs j < j' are formed in a reused buffer and counted by
    ``np.bincount`` (weighted by the products of the values unless the block is binary), the
    diagonal from the column sums of squares: ~2-3 ns per pair, i.e. per half term (the 1M x 300
    binary block in 0.32 s). Exact for a binary block (integer counts); otherwise a sum of the
    same products in another order."""
    D = D.tocsr()
    n, d = D.shape
    if D.nnz and not D.has_canonical_format:      # sorted and no duplicates (one O(nnz) check)
        D = D.copy()
        D.sum_duplicates()                         # also sorts the indices
    ptr, idx, val = D.indptr, D.indices, D.data
    binary = bool(np.all(val == 1.0))
    nnz = np.diff(ptr)
    counts = np.bincount(nnz)
    # rows grouped by their count: a stable sort of small integers is numpy's radix sort
    order = np.argsort(nnz.astype(np.uint16) if counts.size <= 1 << 16 else nnz, kind="stable")
    acc = np.zeros(d * d)
    buf = np.empty(chunk, dtype=np.intp)
    wbuf = None if binary else np.empty(chunk)
    start = 0
    for k, n_k in enumerate(counts):
        rows = order[start:start + n_k]
        start += n_k
        if k < 2 or n_k == 0:
            continue
        npair = k * (k - 1) // 2
        if npair > chunk:                    # a row too long for the buffer: grow it
            buf = np.empty(npair, dtype=np.intp)
            wbuf = None if binary else np.empty(npair)
            chunk = npair
        step = max(1, chunk // npair)
        ar = np.arange(k)[:, None]
        for a0 in range(0, n_k, step):
            r = rows[a0:a0 + step]
            # k x m: position a of every row of the chunk contiguous, so the code of the pairs
            # (a, b > a) of all m rows is one broadcast add whose inner loop runs over m (the
            # m x k layout ran it over k - a - 1 <= k entries: 4 ns a pair, now ~1)
            pos = ptr[r][None, :] + ar
            J = idx[pos].astype(np.intp)
            J0 = J[:-1] * d
            V = None if binary else val[pos]
            m, o = r.size, 0
            for a in range(k - 1):
                w = k - a - 1
                np.add(J0[a], J[a + 1:], out=buf[o:o + m * w].reshape(w, m))
                if V is not None:
                    np.multiply(V[a], V[a + 1:], out=wbuf[o:o + m * w].reshape(w, m))
                o += m * w
            acc += np.bincount(buf[:o], weights=None if binary else wbuf[:o], minlength=d * d)
    G = acc.reshape(d, d)
    G += G.T.copy()                          # pairs j < j' were counted once; sorted rows: upper
    G[np.diag_indices(d)] = _column_stats(D, sums=False)[0]
    return G


def _column_stats(D, chunk=1 << 18, sums=True):
    """(sum_i D_ij^2, sum_i D_ij) per column, one pass and no copy of D.

    Sparse: bincount over the stored entries in chunks with the indices cast to intp (numpy's
    bincount on int32 indices took ~20 ns an entry, 0.3 s for the 15M entries of the 1M x 300
    block; ~2.5 ns cast)."""
    n, d = D.shape
    if not sp.issparse(D):
        return np.einsum("ij,ij->j", D, D), np.asarray(D.sum(axis=0)).ravel()
    D = D.tocsr()
    sq, s1 = np.zeros(d), np.zeros(d)
    idx, val = D.indices, D.data
    for p in range(0, idx.size, chunk):
        i = idx[p:p + chunk].astype(np.intp)
        v = val[p:p + chunk]
        if sums:
            s1 += np.bincount(i, weights=v, minlength=d)
        sq += np.bincount(i, weights=v * v, minlength=d)
    return sq, s1


def _cdot(a, b):
    """Column-wise inner products of (d,) or (d, K) arrays without a temporary (no BLAS)."""
    return np.einsum("i,i->", a, b) if a.ndim == 1 else np.einsum("ij,ij->j", a, b)


def _own(a, shape):
    """A float64 array of ``shape`` to update in place: ``a`` itself when it is one (the carry
    the solver produced last round), else a copy."""
    if isinstance(a, np.ndarray) and a.dtype == np.float64 and a.flags.writeable and \
            a.flags.c_contiguous and a.shape == tuple(shape):
        return a
    return np.array(a, dtype=float).reshape(shape)


def _col(a, like):
    """Broadcast a d-vector against x of shape (d,) or (d, K)."""
    return a[:, None] if np.ndim(like) == 2 else a


def _direct_factor(D, rho, lam):
    n, d = D.shape
    dual = d > n
    if sp.issparse(D):
        A = (rho * (D @ D.T) if dual else rho * (D.T @ D)).tocsc()
        return ("splu", spla.splu(A + lam * sp.identity(A.shape[0], format="csc")), dual)
    A = rho * (D @ D.T if dual else D.T @ D)
    A[np.diag_indices_from(A)] += lam
    try:
        return ("chol", sla.cho_factor(A, lower=False, check_finite=False), dual)
    except np.linalg.LinAlgError:
        raise ValueError("the x-update system lam*I + rho*D^T D is singular: use lam > 0 or a block "
                         "with full column rank") from None


def _direct_solve(fac, D, v, rho):
    kind, f, dual = fac
    solve = f.solve if kind == "splu" else (lambda b: sla.cho_solve(f, b, check_finite=False))
    if dual:
        return D.T @ solve(rho * v)
    return solve(rho * (D.T @ v))
