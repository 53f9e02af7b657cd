"""The party's x-update solvers (paper eq. 6), chosen by the shape of D_m. No Flower imports.

Every party solves, in completed-square form,

    x_m = argmin_{x in X_m}  lam R(x) + (rho_x / 2) || D_m x - v ||^2.

Methods (``method=``; 'auto' picks one from the shape and logs the choice):

- ``'gram'``: keep the rho-independent Gram G = D^T D (d x d) and, for d <= ``EIG_MAX``, its
  eigendecomposition G = V diag(e) V^T. A new rho then costs O(d^2) (eig) or one O(d^3/3)
  Cholesky of lam I + rho G (d > EIG_MAX), never a pass over the N rows. L2:
  x = V (V^T rho D^T v) / (rho e + lam), one D^T v per round. L1 / elastic net: an active-set
  Newton on the support, with FISTA in d-space (gradient rho (G x - D^T v), O(d^2) per step)
  until the support is found; box / ball: FISTA in d-space; L2 on a ball: the exact secular
  equation on the eigendecomposition.
- ``'cg'``: no Gram at all; warm-started Jacobi-preconditioned conjugate gradients on
  (lam I + rho D^T D) x = rho D^T v (2 mat-vecs per iteration) for sparse blocks with d > N or
  very large N. Inexact: relative residual <= max(inner_tol, min(0.1, 1e-3 ||theta q|| / ||v||)),
  i.e. tied to the ADMM residual the party received (docs/math.md, Section 6). Non-smooth
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

__all__ = ["XSolver", "choose_method", "METHODS", "EIG_MAX", "GRAM_MAX"]

LOG = logging.getLogger("flower_vfl.core")
METHODS = ("auto", "gram", "cg", "dual", "chol")
#: largest d (or N for 'dual') whose eigendecomposition is kept (eigh ~ 9 d^3 flops)
EIG_MAX = 1500
#: largest d for which the dense d x d Gram is formed
GRAM_MAX = 4000
#: sparse blocks with more rows than this use CG (the sparse Gram costs ~15 ns per
#: sum_i nnz_i^2 term, hundreds of mat-vecs at 1M rows: benchmarks/bench_scale.py)
CG_ROWS = 200_000
#: inner relative tolerance = FORCING * ||theta q|| / ||v|| (floored at inner_tol): Anderson
#: extrapolates the round map, so it needs T evaluated well beyond the ADMM residual
FORCING = 1e-3


def _gram_terms(D) -> float:
    """sum over rows of nnz_i^2: the multiply-adds of a sparse D^T D."""
    if sp.issparse(D):
        nz = np.diff(D.tocsr().indptr).astype(float)
        return float(nz @ nz)
    return float(D.shape[0]) * D.shape[1] ** 2


def choose_method(D, penalty, constraint) -> str:
    """The x-update method for a block: see the module docstring. Pure function of the shape."""
    n, d = D.shape
    if sp.issparse(D):
        if d > GRAM_MAX or d > n or n > CG_ROWS:
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


def one_blas_thread():
    """Context limiting BLAS/LAPACK to one thread for the one-off setup (Gram, eigh, Cholesky).

    Measured on this 2-core machine under load (1-min load 15): eigh of a 300 x 300 Gram took
    1.4-10.8 s with OpenBLAS's 2 threads and 72-108 ms with 1; 1000 x 1000: 7-25 s vs 1.0-1.3 s.
    On a quiet machine 1 thread costs at most the 2x of the second core; the context itself
    costs ~0.1-8 ms, once per block and rho."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:                      # pragma: no cover - shipped with scikit-learn
        import contextlib
        return contextlib.nullcontext()
    return threadpool_limits(1)


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
            G = self.D.T @ self.D
            self._G = G.toarray() if sp.issparse(G) else np.asarray(G)
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
        elif m == "cg" and self._diag is None:    # column norms^2, one pass and no copy of D
            D = self.D
            if self.sparse:
                D = D.tocsr()
                self._diag = np.bincount(D.indices, weights=D.data * D.data, minlength=D.shape[1])
            else:
                self._diag = np.einsum("ij,ij->j", D, D)

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
            return self.D.T @ w
        if m == "cg" or (m == "chol" and not self.direct):
            rtol = self._outer_rtol(v, outer, x0)
            if self.direct:
                return self._cg(v, rho, x0, rtol, carry)
            from .xsolve_prox import fista_on_D
            x, it = fista_on_D(self, v, rho, x0, rtol)
            self.inner_iters_ += it
            return x
        # 'gram'
        c = self.D.T @ v
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
        """Jacobi-preconditioned CG on (lam I + rho D^T D) x = rho D^T v, column-wise for (N, K).

        1 + 2k mat-vecs for k iterations: D x and D^T D x are carried along (D x += a D p,
        D^T D x += a D^T D p) from one round to the next (``carry``, kept by the party), so the
        start's residual rho D^T v - lam x0 - rho D^T D x0 costs one product and the party's
        release D x none (``last_carry``). rho-independent, so a new rho costs nothing."""
        D, lam = self.D, self.lam
        K = v.shape[1:] if np.ndim(v) == 2 else ()
        shape = (D.shape[1],) + K
        x = np.zeros(shape) if x0 is None else np.array(x0, dtype=float).reshape(shape)
        if carry is None or x0 is None:
            Dx = D @ x
            DtDx = D.T @ Dx
        else:
            Dx, DtDx = np.array(carry[0], dtype=float), np.array(carry[1], dtype=float).reshape(shape)
        b = rho * (D.T @ v)
        r = b - lam * x - rho * DtDx
        Minv = 1.0 / _col(lam + rho * self._diag, b)
        stop = rtol * np.maximum(np.sqrt(np.sum(b * b, axis=0)), 1e-300)
        zv = Minv * r
        p = zv.copy()
        rz = np.sum(r * zv, axis=0)
        it = 0
        for it in range(1, self.inner_max_iter + 1):
            if np.all(np.sqrt(np.sum(r * r, axis=0)) <= stop):
                it -= 1
                break
            Dp = D @ p
            DtDp = D.T @ Dp
            Ap = lam * p + rho * DtDp
            pAp = np.sum(p * Ap, axis=0)
            a = np.where(pAp > 0, rz / np.where(pAp > 0, pAp, 1.0), 0.0)
            x += a * p
            Dx += a * Dp
            DtDx += a * DtDp
            r -= a * Ap
            zv = Minv * r
            rz_new = np.sum(r * zv, axis=0)
            beta = np.where(rz > 0, rz_new / np.where(rz > 0, rz, 1.0), 0.0)
            p = zv + beta * p
            rz = rz_new
        self.inner_iters_ += it
        self.last_carry = (Dx, DtDx)
        return x


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
