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
  relative residual <= max(inner_tol, min(0.1, f ||theta q|| / ||v||)), i.e. tied to the
  ADMM residual the party received (docs/math.md, Section 6), f = :data:`FORCING` (1e-3), or
  :data:`FORCING_PLAIN` (0.1) after :meth:`XSolver.plain_rounds` (no accelerator). Non-smooth
  penalties use FISTA on D with the same tolerance rule. An 'auto' CG solve predicts its last
  iteration from the residual reduction it measured (``predict_last``): that iteration skips
  D^T D p (2 mat-vecs a round once warm, as the Gram path), re-measured every
  :data:`CG_RECHECK` solves. With plain rounds a tall sparse L2 block (N > ``CG_ROWS``) gets
  CG instead of the Gram unless the Gram is very cheap (:data:`GRAM_PAIRS_PER_NNZ_L2`).
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

from flower_vfl.core.blas import SMALL_MM, mm, one_blas_thread  # noqa: F401  (re-exported)
from flower_vfl.core.penalties import Ball

__all__ = ["XSolver", "choose_method", "sparse_gram", "METHODS", "EIG_MAX", "GRAM_MAX", "FORCING",
           "FORCING_PLAIN"]

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
#: ... and for an L2 penalty without a constraint (the CG path's direct solve): with the
#: predicted last iteration (``XSolver._cg``) CG costs ~2 mat-vecs a round once warm, as the
#: Gram path does, plus ~1 more in the first round and in every ``CG_RECHECK``-th; the Gram
#: (~5-9 ns a pair, ~1.3 ns an entry per mat-vec) then pays only past ~(pairs / nnz) x 10
#: rounds. At 1M x (100, 200, 300) binary at 5 % (2.5 / 5 / 7.5 pairs an entry) the three
#: Grams were 0.9 s of a 3.1 s fit to a gap of 1e-4 (8 rounds; benchmarks/bench_vs_sklearn.py)
GRAM_PAIRS_PER_NNZ_L2 = 2
#: CG's predicted last iteration: the measured residual reduction of an iteration, times this
#: margin, must reach the tolerance; after this many solves without a checked iteration (which
#: re-measures the rate) a solve runs checked throughout
CG_PREDICT_MARGIN = 1.25
CG_RECHECK = 6
#: inner relative tolerance = FORCING * ||theta q|| / ||v|| (floored at inner_tol): Anderson
#: extrapolates the round map, so it needs T evaluated well beyond the ADMM residual
FORCING = 1e-3
#: ... the same constant when no accelerator extrapolates the rounds
#: (``PartyUpdate.plain_rounds`` calls :meth:`XSolver.plain_rounds` then, in the engine and in a
#: non-private Flower party): plain ADMM rounds tolerate a much looser inner solve. On
#: the sparse 200k x (100, 200, 300) set (CG forced, 12 plain rounds) the objective gaps were the
#: exact solve's to 2 digits at 0.01, 0.03 and 0.1 (70 / 59 / 45 CG iterations in 36 solves);
#: at 0.2 (with the predicted last iteration) round 8 moved from 9.3e-5 to 1.2e-4, at 0.3
#: (checked) to 1.8e-4
FORCING_PLAIN = 0.1
#: K > 1 (multinomial) 'gram' L2 solves with d up to this keep the d x d map from D^T v to x
#: for the current rho (``XSolver._x_map``): one product a round instead of two and a division
X_MAP_MAX = 512
#: the CG path's elementwise kernels that need a temporary run in slices of this many entries
#: (128 KB buffers) instead of through d-vector temporaries (``XSolver._preconditioner``)
_CHUNK = 16384


def _gram_pairs(D) -> float:
    """sum over rows of nnz_i (nnz_i - 1) / 2: the pairs :func:`sparse_gram` counts (from the
    histogram of the row counts: no N-vector of floats)."""
    c = np.bincount(np.diff(D.tocsr().indptr))
    k = np.arange(c.size, dtype=float)
    return float(np.dot(c, k * (k - 1.0))) / 2.0


def choose_method(D, penalty, constraint, plain=False) -> str:
    """The x-update method for a block: see the module docstring. Pure function of the shape
    (and of ``plain``: the rounds are not extrapolated, :meth:`XSolver.plain_rounds`)."""
    n, d = D.shape
    if sp.issparse(D):
        if d > GRAM_MAX or d > n:
            return "cg"
        if n > CG_ROWS:
            # plain rounds, L2 without a constraint: CG's round costs ~2 mat-vecs once warm (the
            # loose forcing and the predicted last iteration, ``XSolver._cg``), as the Gram
            # path's does, so the Gram's build buys little
            limit = GRAM_PAIRS_PER_NNZ_L2 if plain and penalty.smooth_quadratic and constraint is None \
                else GRAM_PAIRS_PER_NNZ
            if _gram_pairs(D) > limit * max(D.nnz, 1):
                return "cg"
        return "gram"
    if d <= GRAM_MAX:
        return "gram"
    if n <= EIG_MAX and penalty.smooth_quadratic and constraint is None:
        return "dual"
    return "cg"


def vector_norm(v) -> float:
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
    low_memory : bool, default=False
        'cg' with an L2 penalty: keep one d-vector between solves instead of three (the party
        uses it; 2 of them per party while the other parties solve). D^T D x is not carried
        (``last_carry`` is (D x, None)): the next solve forms D^T (D x0) from the carried D x0;
        the column sums of the preconditioner are formed per solve, D^T 1. Two sparse
        mat-vecs more a solve (1 + 2k -> 3 + 2k for k iterations); the iterates agree with
        the default to round-off (not bitwise: the sums are added in another order).

    predict_last : bool or None, default=None
        'cg' with an L2 penalty and no constraint: an iteration predicted (from the largest
        residual reduction per iteration measured in the last checked solve, times
        :data:`CG_PREDICT_MARGIN`) to reach the tolerance skips D^T D p: its step length needs
        ||Dc p||^2 only, and the next solve starts from the carried D x with r = rho Dc^T (v - D x)
        - lam x (one product) and the last solve's ||Dc^T v|| as the tolerance's scale; every
        :data:`CG_RECHECK`-th solve runs checked iterations. None: on when 'auto' chose CG
        (never with ``low_memory``).

    center : bool, default=False
        Solve with the block's columns centred, argmin lam R(x) + rho/2 ||P (D x - v)||^2 with
        P = I - 1 1^T / N (the party still releases D x). Valid only when the central node fits
        an unpenalized intercept: its (z, b) step is then equivariant to a constant added to
        sum_m s_m (z and b shift, q and y do not), so the constant mu^T x_m of a release never
        reaches the next round, and the rounds are those of ADMM on the centred problem, whose
        x-optimum is the original one (the intercept absorbs sum_m mu_m^T x_m; the central
        node's b is the uncentred intercept). The flat direction along which a constant moved
        between the parties and the intercept (a9a's one-hot groups: 66 rounds to a gap of
        1e-6, now 17) is gone. Never for
        a private party (its release map is what its privacy analysis bounds). Implicit (the
        Gram is G - N mu mu^T, D^T v becomes D^T v - mu 1^T v; nothing dense is formed), for
        the 'gram' and 'cg' methods; 'dual' and 'chol' ignore it (``center_`` says which).

    ``v`` may be (N,) or (N, K) (multinomial). ``solve(v, rho, x0, outer)`` warm-starts the
    iterative paths from ``x0``; ``outer`` (the norm of the ADMM residual the party received)
    loosens the inner tolerance of the CG / FISTA-on-D paths while the outer iteration is far
    from converged. The solver keeps no iterate between calls (the warm start is the party's
    x), so one solver can serve several runs (the Flower client caches it).
    """

    def __init__(self, D, penalty, lam: float, constraint=None, inner_tol: float = 1e-12,
                 inner_max_iter: int = 5000, method: str = "auto", low_memory: bool = False,
                 center: bool = False, predict_last: bool | None = None):
        if method not in METHODS:
            raise ValueError(f"x_solver={method!r} is not supported; choose one of {list(METHODS)}")
        self.D = D
        self.sparse = sp.issparse(D)
        self.penalty = penalty
        self.lam = float(lam)
        self.constraint = constraint
        self.inner_tol = inner_tol
        self.inner_max_iter = inner_max_iter
        self.low_memory = bool(low_memory)
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
        self._center = bool(center) and method in ("gram", "cg")
        self._center_known = not self._center
        self._mu = None
        LOG.info("x-update solver %s%s for a %s block N=%d, d=%d (penalty=%s, constraint=%s)",
                 method, " (auto)" if auto else "", "sparse" if self.sparse else "dense", n, d,
                 penalty.name, type(constraint).__name__ if constraint is not None else None)
        self._rho = None
        #: D^T built once (scipy builds a new CSC object on every ``D.T``: ~12-17 us a call at
        #: a9a's size, a tenth of the product itself); it shares D's arrays
        self.DT = D.T
        self._G = self._eig = self._chol = self._fac = None
        #: CG: the centred squared column norms and the column sums (:meth:`_cg_stats`)
        self._cstats = None
        self._pc_scale = None
        #: (sum_i D_ij^2, sum_i D_ij) from the centring decision, handed to :meth:`_cg_stats`
        self._colstats = None
        self._colsq = None                         # sum_i D_ij^2 from the centring's pass
        self._colpass = None                       # 'gram': (sum_i D_ij^2, sum_i D_ij), kept with the factorization
        #: CG's predicted last iteration (``_cg``): the largest residual reduction of an
        #: iteration measured in the last checked solve, solves since it, and ||Dc^T v|| of
        #: the last solve that formed it (the tolerance's scale when a solve starts from D x)
        self._cg_rate = None
        self._cg_unchecked = 0
        #: the inexact paths' forcing constant (:data:`FORCING`; :data:`FORCING_PLAIN` when the
        #: caller knows that no accelerator extrapolates the rounds)
        self.forcing = FORCING
        self._auto = auto
        self.predict_last = (auto if predict_last is None else bool(predict_last)) and method == "cg" \
            and self.direct and not self.low_memory
        self._rhs_scale = None
        self.last_carry = None
        self.inner_iters_ = 0

    # ------------------------------------------------------------------ run state
    def cg_state(self) -> dict:
        """What the predicted last iteration (``_cg``) carries from one solve to the next, as
        arrays: the measured rate, the solves since it was measured and ||Dc^T v|| of the last
        checked start. Part of the party's state (:meth:`PartyUpdate.get_state`): a party that
        restores it (a real SuperNode's fresh process per message) takes the next solve's steps
        exactly as one that kept its solver. Empty unless ``predict_last``."""
        if not self.predict_last:
            return {}
        out = {"cg_unchecked": np.array([self._cg_unchecked], dtype=np.int64)}
        if self._cg_rate is not None:
            out["cg_rate"] = np.array([self._cg_rate], dtype=float)
        if self._rhs_scale is not None:
            out["cg_rhs_scale"] = np.atleast_1d(np.asarray(self._rhs_scale, dtype=float))
        return out

    def set_cg_state(self, state: dict) -> None:
        """Restore :meth:`cg_state` (its keys absent: the state of a solver that has not solved
        yet, so the next solve runs checked). Called at every run's start and every restore: a
        solver reused from the process's cache (``clients/party_public.py``) never carries one
        run's measured rate into another."""
        rate, scale = state.get("cg_rate"), state.get("cg_rhs_scale")
        self._cg_rate = None if rate is None else float(np.asarray(rate).ravel()[0])
        self._cg_unchecked = int(np.asarray(state.get("cg_unchecked", 0)).ravel()[0])
        if scale is None:
            self._rhs_scale = None
        else:                              # a scalar for one output column, (K,) for K >= 2
            scale = np.array(scale, dtype=float).ravel()
            self._rhs_scale = scale if scale.size > 1 else scale[0]

    # ------------------------------------------------------------------ setup
    def plain_rounds(self):
        """Told (before the first solve) that no accelerator extrapolates the rounds: the inexact
        paths take the looser forcing :data:`FORCING_PLAIN`, and an 'auto' solver re-chooses its
        method with ``plain=True`` (:func:`choose_method`: a tall sparse L2 block then gets CG
        instead of the Gram, see :data:`GRAM_PAIRS_PER_NNZ_L2`). Not for a private party (neither
        the engine nor a private party's ClientApp calls it for one)."""
        self.forcing = FORCING_PLAIN
        if not (self._auto and self._rho is None and self.method_ == "gram" and self.direct
                and self.lam > 0 and self._G is None and self._eig is None):
            return
        if choose_method(self.D, self.penalty, self.constraint, plain=True) == "cg":
            self.method_ = "cg"
            self.predict_last = not self.low_memory
            LOG.info("x-update solver cg (auto, plain rounds) for a sparse block N=%d, d=%d",
                     *self.D.shape)

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
                # the column sums of squares (G's diagonal) from the centring's pass when it ran
                # over canonical entries (a duplicate's squares would not sum to its square)
                diag = self._colsq if self.center_ and self.D.has_canonical_format else None
                self._G = sparse_gram(self.D, diag=diag)
            else:
                with one_blas_thread():
                    self._G = np.asarray(self.D.T @ self.D)
            if self.center_:                       # Dc^T Dc = D^T D - N mu mu^T
                mu = self.mu()
                self._G -= np.outer(mu, mu * self.D.shape[0])
        return self._G

    @property
    def center_(self) -> bool:
        """Whether the solve is centred: ``center`` was asked, the method supports it, and some
        column's mean is material, |mu_j| > 1e-8 of its root mean square (standardized columns,
        means ~1e-17, are solved as they are: the same iterates bitwise). Decided on first use
        from one pass over the block."""
        if not self._center_known:
            self._take_column_stats(*_column_stats(self.D))
        return self._center

    def _take_column_stats(self, sq, s1):
        """The centring decision from the column pass ``(sq, s1)`` (:func:`_column_stats`, or the
        same arrays kept with the factorization: :meth:`adopt_factorization`)."""
        n = self.D.shape[0]
        mu = s1 / n
        self._center = bool(np.any(np.abs(mu) > 1e-8 * np.sqrt(np.maximum(sq, 0.0) / n)))
        self._mu = mu if self._center else None
        self._colsq = sq
        self._center_known = True
        if self.method_ == "gram":
            self._colpass = (sq, s1)               # kept with the factorization (a fresh process: no pass)
        if self.method_ == "cg" and not self.low_memory:
            self._colstats = (sq, s1)          # the CG preconditioner's pass, done once

    def mu(self):
        """The column means D^T 1 / N (kept: a d-vector)."""
        if self._mu is None:
            self._mu = np.asarray(self.DT @ np.ones(self.D.shape[0]), dtype=float).ravel() / self.D.shape[0]
        return self._mu

    def _rhs(self, v):
        """D^T v, centred: Dc^T v = D^T v - mu (1^T v) (= Dc^T P v)."""
        c = self.DT @ v
        if self.center_:
            c = np.asarray(c, dtype=float)
            if np.ndim(v) == 2:
                # K > 1: 1^T v as a BLAS product (numpy's axis-0 sum of an N x K array runs
                # K-wide inner loops: 29 us against 4 us at digits' 1797 x 10)
                c -= np.multiply.outer(self.mu(), self._ones_n() @ v)
            else:
                c -= self.mu() * v.sum(axis=0)
        return c

    def _ones_n(self):
        ones = self.__dict__.get("_ones")
        if ones is None:
            ones = self._ones = np.ones(self.D.shape[0])
        return ones

    def _x_map(self, rho):
        """V diag(rho / (rho e + lam)) V^T, the 'gram' L2 solve's d x d map from D^T v to x, kept
        for the last rho (K > 1, d <= :data:`X_MAP_MAX`: one d x d x K product a round instead
        of two and a division; a new rho costs d^3)."""
        kept = self.__dict__.get("_xmap")
        e, V = self._eig
        if kept is None or kept[0] != rho or kept[1] is not V:
            kept = self._xmap = (rho, V, mm(V * (rho / (rho * e + self.lam)), V.T))
        return kept[2]

    def _eigh(self):
        if self._eig is None:
            if self.method_ == "dual":
                K = self.D @ self.D.T
                self._eig = np.linalg.eigh(np.asarray(K))
            else:
                e, V = np.linalg.eigh(self.gram())
                self._eig = (np.maximum(e, 0.0), V)
        return self._eig

    def factorization(self) -> dict | None:
        """The rho-free factorization this solver computed (the Gram's eigendecomposition, 'gram'
        method), for a caller to keep across processes; None when there is none to keep. With it,
        the centring's column pass when it ran (``colsq``, ``colsum``: :func:`_column_stats`), so a
        fresh process that adopts it makes no pass over the block before its first product."""
        if self.method_ == "gram" and self._eig is not None:
            f = {"e": self._eig[0], "V": self._eig[1]}
            if self._colpass is not None:          # the centring's column pass (2 d-vectors)
                f["colsq"], f["colsum"] = self._colpass
            return f
        return None

    def adopt_factorization(self, f: dict) -> bool:
        """Take ``f`` from :meth:`factorization` of a solver of the same block and parameters (the
        caller checks that); False, nothing changed, when it does not fit this solver."""
        d = self.D.shape[1]
        e, V = np.asarray(f.get("e")), np.asarray(f.get("V"))
        if self.method_ != "gram" or self._eig is not None or e.shape != (d,) or V.shape != (d, d):
            return False
        self._eig = (e, V)
        sq, s1 = (np.asarray(f.get(k), dtype=float) for k in ("colsq", "colsum"))
        if not self._center_known and sq.shape == (d,) and s1.shape == (d,):
            self._take_column_stats(sq, s1)        # the same decision and means as the pass
        return True

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
        elif m == "cg":
            self._pc_scale = None                 # the preconditioner's rho-dependent scalar

    # ------------------------------------------------------------------ solve
    def solve(self, v, rho, x0=None, outer=None, carry=None, overwrite_x0=False, overwrite_v=False):
        """argmin_{x in X} lam R(x) + rho/2 ||D x - v||^2 (warm start ``x0``).

        ``carry``: (D x0, D^T D x0) from the previous CG solve (else recomputed). After a CG
        solve ``last_carry`` holds (D x, D^T D x) of the result (else None); its D^T D x is
        updated in place by the next solve that receives it. ``overwrite_x0``: the CG path may
        update ``x0`` in place and return it (the party passes its own x, which the result
        replaces: one d-vector less per solve); the other paths ignore it. ``overwrite_v``: the CG
        path may use ``v`` as scratch (the party's own temporary target)."""
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
                return self._cg(v, rho, x0, rtol, carry, overwrite_x0, overwrite_v)
            from flower_vfl.core.xsolve_prox import fista_on_D
            x, it = fista_on_D(self, v, rho, x0, rtol)
            self.inner_iters_ += it
            return x
        # 'gram'
        c = self._rhs(v)
        if self.direct:
            if self._chol is not None:
                return sla.cho_solve(self._chol, rho * c, check_finite=False)
            if np.ndim(c) == 2 and self.D.shape[1] <= X_MAP_MAX:
                return mm(self._x_map(rho), c)
            e, V = self._eig
            return mm(V, mm(V, rho * c, trans=True) / _col(rho * e + self.lam, c))
        if self.ball_l2:
            from flower_vfl.core.xsolve_prox import ball_l2
            return ball_l2(self, c, rho)
        from flower_vfl.core.xsolve_prox import prox_on_gram
        x, it = prox_on_gram(self, c, rho, x0)
        self.inner_iters_ += it
        return x

    def _outer_rtol(self, v, outer, x0=None):
        if outer is None:
            return self.inner_tol
        if outer == 0.0 and (x0 is None or not np.any(x0)):
            # the very first round (q = 0, x = 0): nothing to be exact about yet; the floor
            # made it 10 CG iterations against ~4 later (sparse 300k x 600)
            return max(self.inner_tol, self.forcing)
        return max(self.inner_tol, min(0.1, self.forcing * outer / max(vector_norm(v), 1e-300)))

    def _cg(self, v, rho, x0, rtol, carry=None, overwrite_x0=False, overwrite_v=False):
        """Preconditioned CG on (lam I + rho D^T D) x = rho D^T v, column-wise for (N, K).

        1 + 2k mat-vecs for k iterations: D x and D^T D x are carried along (D x += a D p,
        D^T D x += a D^T D p) from one round to the next (``carry``, kept by the party; D^T D x
        is updated in place, D x copied since it is returned as the release), so the start's
        residual rho D^T v - lam x0 - rho D^T D x0 costs one product and the party's release
        D x none (``last_carry``). rho-independent, so a new rho costs nothing. With
        ``low_memory`` (the party's solver) D^T D x is not carried: the start forms D^T (D x0)
        from the carried D x0, and the preconditioner D^T 1: 3 + 2k mat-vecs.

        Memory (on the text-like 50k x 200k blocks a d-vector is 1.6 MB, 14 % of the data): the
        work vectors are r and p, plus the two products scipy allocates per iteration (D p, an
        N-vector, and D^T D p, whose buffer then takes z = M^-1 r, so no separate z is kept);
        x is updated in place when ``overwrite_x0`` (the party's own x), else it is a copy of
        x0. A p is never formed (p^T A p from two dots, r -= a A p in two steps); the
        elementwise kernels that need a temporary (the start's residual, the preconditioner)
        run in slices of ``_CHUNK`` entries through small buffers. The arithmetic is, entry by
        entry, the same as with whole-vector temporaries (without ``low_memory``: bitwise the
        iterates of the version that had them)."""
        D, DT, lam = self.D, self.DT, self.lam
        K = v.shape[1:] if np.ndim(v) == 2 else ()
        shape = (D.shape[1],) + K
        if x0 is None:
            x = np.zeros(shape)
        elif overwrite_x0:
            x = _own(x0, shape)
        else:
            x = np.array(x0, dtype=float).reshape(shape)
        lean = self.low_memory
        cen = self.center_
        zero = (carry is None or x0 is None) and not np.any(x)
        if zero:                                  # x = 0 (the first round): D x = 0, no product
            Dx = np.zeros(v.shape)
            DtDx = None if lean else np.zeros(shape)
        elif carry is None or x0 is None:
            Dx = D @ x
            DtDx = None
        else:
            # D x becomes the party's release s (a fresh array each round): the carried one is
            # read, never written; the first step's a D p array becomes the new D x
            # (``_step_dx``; a copy only if no step is taken). D^T D x is private
            Dx = np.asarray(carry[0], dtype=float)
            DtDx = None if lean or carry[1] is None else _own(carry[1], shape)
        fresh = carry is None or x0 is None       # Dx is this solve's own array
        precond = self._preconditioner(rho, x)
        predict = self.predict_last and not lean
        scale = self._rhs_scale
        if predict and DtDx is None and scale is not None and np.shape(scale) == K:
            # the start from D x alone (the last solve predicted its last iteration, so D^T D x
            # is not known): r = rho Dc^T (v - D x) - lam x in one product; the tolerance's
            # scale ||Dc^T v|| is the last solve's (it moves with v, slowly once rounds settle)
            r = self._rhs(np.subtract(v, Dx, out=v if overwrite_v else None))
            r *= rho
            stop = rtol * rho * np.maximum(scale, 1e-300)
        else:
            r = self._rhs(v)
            if predict:
                self._rhs_scale = np.sqrt(_cdot(r, r))
            r *= rho
            stop = rtol * np.maximum(np.sqrt(_cdot(r, r)), 1e-300)    # rtol * ||rho D^T v||
            if DtDx is None:
                DtDx = DT @ Dx
                if cen:                                            # the carry is Dc^T Dc x
                    self._center_gram_product(DtDx, x)
            precond.sub_scaled(r, DtDx, rho)                       # r -= rho D^T D x0
            if lean:
                del DtDx                                           # not carried: not updated
                DtDx = None
        precond.sub_scaled(r, x, lam)                              # r -= lam x0
        p = precond(r, np.empty(shape))                            # p = z = M^-1 r
        rz = _cdot(r, p)
        # predicted last iteration: with a measured reduction per iteration, an iteration that
        # is predicted to reach the tolerance skips D^T D p (its step length needs ||Dc p||^2
        # only) and leaves D^T D x unknown; every CG_RECHECK-th solve is checked throughout
        may_skip = predict and self._cg_rate is not None and self._cg_unchecked < CG_RECHECK
        rate, rn_prev, skipped = 0.0, None, False
        it = 0
        for it in range(1, self.inner_max_iter + 1):
            rn = np.sqrt(_cdot(r, r))
            if rn_prev is not None:
                rate = max(rate, float(np.max(rn / np.maximum(rn_prev, 1e-300))))
            if np.all(rn <= stop):
                it -= 1
                break
            rn_prev = rn
            Dp = D @ p
            if may_skip and np.all(CG_PREDICT_MARGIN * self._cg_rate * rn <= stop):
                dd = _cdot(Dp, Dp)
                if cen:                                            # ||Dc p||^2 = ||D p||^2 - N (mu^T p)^2
                    mp = self.mu() @ p
                    dd = dd - D.shape[0] * mp * mp
                pAp = rho * dd + lam * _cdot(p, p)
                if np.all(pAp > 0):
                    a = rz / pAp
                    p *= a
                    Dp *= a
                    x += p
                    Dx, fresh = _step_dx(Dx, Dp, fresh), True
                    DtDx = None
                    skipped = True
                    break
            zv = DT @ Dp                                           # D^T D p (scipy's new array)
            if cen:
                self._center_gram_product(zv, p)                   # Dc^T Dc p
            pAp = rho * _cdot(p, zv) + lam * _cdot(p, p)           # p^T A p without forming A p
            a = np.where(pAp > 0, rz / np.where(pAp > 0, pAp, 1.0), 0.0)
            # in place, in the arrays scipy returned: a p, a D p, a D^T D p; then
            # r -= a A p = rho (a D^T D p) + lam (a p)
            p *= a
            Dp *= a
            zv *= a
            x += p
            Dx, fresh = _step_dx(Dx, Dp, fresh), True
            if DtDx is not None:
                DtDx += zv
            del Dp
            zv *= rho
            r -= zv
            r -= np.multiply(p, lam, out=zv)
            precond(r, zv)                                         # D^T D p's buffer takes z
            rz_new = _cdot(r, zv)
            beta = np.where(rz > 0, rz_new / np.where(rz > 0, rz, 1.0), 0.0)
            p *= np.where(a != 0, beta / np.where(a != 0, a, 1.0), 0.0)   # p holds a p
            p += zv
            del zv
            rz = rz_new
        if predict:
            if rate > 0.0:                   # a checked iteration measured it (then maybe a skip)
                self._cg_rate, self._cg_unchecked = rate, 0
            elif skipped:
                self._cg_unchecked += 1
        self.inner_iters_ += it
        self.last_carry = (Dx if fresh else np.array(Dx, dtype=float), DtDx)
        return x

    def _cg_stats(self):
        """(max(||D_:j||^2 - (sum_i D_ij)^2 / N, 0), sum_i D_ij) per column j: the centred
        squared column norms and the column sums, rho-independent, from one pass over the data
        (:func:`_column_stats`), both kept for the solver's life; with ``low_memory`` only the
        first is kept and the sums are D^T 1 (:meth:`_colsum`), formed again by every solve."""
        if self._cstats is None:
            if self.low_memory:
                sq, s1 = _column_stats(self.D, sums=False)[0], self._colsum()
            elif self._colstats is not None:
                (sq, s1), self._colstats = self._colstats, None
            else:
                sq, s1 = _column_stats(self.D)
            t = s1 / self.D.shape[0]                 # mu
            np.multiply(s1, t, out=t)                # N mu_j^2
            sq -= t
            del t
            cd = np.maximum(sq, 0.0, out=sq)
            self._cstats = (cd, None if self.low_memory else s1)
            return cd, s1
        cd, s1 = self._cstats
        return cd, self._colsum() if s1 is None else s1

    def _center_gram_product(self, out, x):
        """out -= N mu (mu^T x): D^T D x in ``out`` becomes Dc^T Dc x (in place)."""
        mu = self.mu()
        mx = mu @ x
        out -= _col(mu, out) * (self.D.shape[0] * mx)
        return out

    def _colsum(self):
        """D^T 1: the column sums as one sparse mat-vec (``low_memory``: formed per solve)."""
        return np.asarray(self.DT @ np.ones(self.D.shape[0]), dtype=float).ravel()

    def _preconditioner(self, rho, like):
        """r -> M^-1 r for M = lam I + rho (Dc^T Dc restricted to its diagonal + N mu mu^T).

        D^T D = Dc^T Dc + N mu mu^T with Dc = D - 1 mu^T the column-centred block (mu = column
        means). M keeps the centred Gram's diagonal and the mean's rank-one term, so its
        diagonal is Jacobi's (lam + rho ||D_:j||^2) and it also captures the direction of the
        mean, the top eigenvector of a non-negative block (binary / count features): on the
        1M x 600 binary set CG needed ~3 iterations a round with Jacobi and ~1 with this.
        Applied in O(d) by Sherman-Morrison with Dg = lam I + rho diag(Dc^T Dc) (> 0: CG needs
        lam > 0) and w = Dg^-1 mu:

            M^-1 r = Dg^-1 r - c w (N mu^T Dg^-1 r),    c = rho / (1 + rho N mu^T w).

        Formed from the cached column statistics (:meth:`_cg_stats`), so a new rho costs no pass
        over the data (``low_memory``: the column sums are D^T 1, one mat-vec per solve): c
        once per rho (two d-vector temporaries), and Dg^-1 and w are never
        stored as d-vectors; each application recomputes them in slices of ``_CHUNK`` entries
        (two passes: Dg^-1 r, the dot, then the rank-one correction), with the same arithmetic
        as whole vectors would have. Returns ``apply(r, out)``, which writes M^-1 r into ``out``
        (``out`` is not ``r``); ``apply.sub_scaled(r, a, s)`` does r -= s a the same way."""
        cd, s1 = self._cg_stats()
        lam, n, d = self.lam, self.D.shape[0], cd.shape[0]
        if not lam > 0:                              # pragma: no cover - refused in __init__
            raise ValueError("the CG x-update needs lam > 0")
        if self._pc_scale is None and self.center_:
            self._pc_scale = 0.0                     # centred: Jacobi on Dc^T Dc, no rank-one term
        if self._pc_scale is None:                   # once per rho
            dg = np.multiply(cd, rho)
            dg += lam
            w = s1 / n
            w /= dg
            self._pc_scale = rho / (1.0 + rho * float(_cdot(s1, w)))   # rho / (1 + rho N mu^T w)
            del dg, w
        c = self._pc_scale
        two = np.ndim(like) == 2
        K = like.shape[1:] if two else ()
        rows = min(d, max(1, _CHUNK // (K[0] if two else 1)))
        g_buf, w_buf = np.empty(rows), np.empty(rows)
        t_buf = np.empty((rows,) + K) if two else w_buf
        S1 = _col(s1, like)                          # N mu, against (d,) or (d, K)

        def dg_slice(sl, m):
            g = np.multiply(cd[sl], rho, out=g_buf[:m])
            g += lam
            return g

        def apply(r, out):
            """M^-1 r into ``out``."""
            for j in range(0, d, rows):
                sl, m = slice(j, j + rows), min(rows, d - j)
                g = np.divide(1.0, dg_slice(sl, m), out=g_buf[:m])          # Dg^-1
                np.multiply(_col(g, like), r[sl], out=out[sl])
            if c == 0.0:
                return out
            sc = c * _cdot(S1, out)                                          # c N mu^T Dg^-1 r
            for j in range(0, d, rows):
                sl, m = slice(j, j + rows), min(rows, d - j)
                g = dg_slice(sl, m)
                w = np.divide(s1[sl], n, out=w_buf[:m])
                np.divide(w, g, out=w)                                       # w = Dg^-1 mu
                out[sl] -= np.multiply(_col(w, like), sc, out=t_buf[:m])
            return out

        def sub_scaled(r, a, s):
            """r -= s a (the product in slices)."""
            for j in range(0, d, rows):
                sl, m = slice(j, j + rows), min(rows, d - j)
                r[sl] -= np.multiply(a[sl], s, out=t_buf[:m])
            return r

        apply.sub_scaled = sub_scaled
        return apply


def sparse_gram(D, chunk=1 << 20, diag=None):
    """D^T D (dense d x d) of a sparse block by counting the pairs of each row's nonzeros.

    scipy's sparse product costs ~15 ns per sum_i nnz_i^2 term (6.9 s for the 1M x 300 binary
    block). Here the rows are grouped by their number k of nonzeros; for each group the codes
    j * d + j' of the k (k - 1) / 2 pairs j < j' are formed in a reused buffer and counted by
    ``np.bincount`` (weighted by the products of the values unless the block is binary), the
    diagonal from the column sums of squares: ~2-3 ns per pair, i.e. per half term (the 1M x 300
    binary block in 0.32 s). Exact for a binary block (integer counts); otherwise a sum of the
    same products in another order. ``diag``: the column sums of squares when the caller
    has them (``_column_stats(D)[0]``, bitwise what this would compute), saving a pass."""
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
    G[np.diag_indices(d)] = _column_stats(D, sums=False)[0] if diag is None else diag
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
            c = np.bincount(i, weights=v, minlength=d)
            s1 += c
            if np.all(v == 1.0):                   # binary: the squares are the values
                sq += c
                continue
        sq += np.bincount(i, weights=v * v, minlength=d)
    return sq, s1


def _step_dx(Dx, aDp, own):
    """D x + a D p: in place in ``Dx`` when it is the solve's own array, else into ``aDp`` (the
    array scipy returned for D p, free after the step): no copy of the carried release."""
    if own:
        Dx += aDp
        return Dx
    aDp += Dx
    return aDp


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
