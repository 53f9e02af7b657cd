"""Fewer rounds: type-II Anderson acceleration of the ADMM sharing round. No Flower imports.

With alpha = 1 one round of ADMM sharing is a fixed-point map u -> T(u) of

    u = (zeta_1, ..., zeta_M, y),   zeta_m = the party's z_loc = s_m - theta q_m,

because party m's x-update depends on (zeta_m, y) only (its target is v = zeta_m - y/rho_x,
docs/math.md Section 2), the central node's (z, b) on (sum_m s_m, y), and the new state is
zeta_m' = s_m - theta (a - z), y' = y + rho (a - z). The central node knows every s_m it
received, so it can form T(u) itself and send each party its own q_m = (s_m - zeta_m)/theta
such that the party's own arithmetic reproduces any zeta_m: only N-vectors cross the wire and
the parties' code is unchanged.

:class:`Anderson` is type-II Anderson acceleration (Walker & Ni 2011; for ADMM with safeguards
Zhang, O'Donoghue & Boyd 2020, "Globally convergent type-I Anderson acceleration for
nonsmooth fixed-point iterations", and Fu, Zhang & Boyd 2020, "Anderson accelerated
Douglas-Rachford splitting"): with g = T(u) - u and the last ``mem`` differences
S = [Delta u], Y = [Delta g],

    gamma = argmin ||g - Y gamma||^2 + reg ||Y||_F^2 ||gamma||^2 / mem,
    u+    = u + g - (S + Y) gamma.

Safeguard: when ||g|| exceeds ``safeguard`` times the smallest ||g|| since the last reset (or
is not finite), the memory is dropped and the plain ADMM step u+ = T(u) is taken. A fixed point
of the accelerated iteration (g = 0) is a fixed point of T, i.e. the ADMM solution, so the
result is unchanged; only the number of rounds is. Both the engine and the Flower strategy call
the accelerator's ``step(s_list, central)`` (:func:`make_accelerator`) after the central step,
so the two paths stay identical. With :data:`STALL_RATIO` set, the accelerator under 'auto' /
'anderson' waits until the plain rounds stall (off by default).

:class:`SpectralRho` is spectral (Barzilai-Borwein) adaptive rho (Xu, Figueiredo & Goldstein
2017) from the same N-vectors; :class:`Chain` runs it before Anderson. Measured on a9a, breast
cancer and a wide set it is an option, not a default (docs/benchmarks-history.md).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.lapack import dposv

from flower_vfl.core.penalties import penalty_class
from flower_vfl.core.xsolve import LOG, one_blas_thread

__all__ = ["Anderson", "SpectralRho", "Chain", "ACCELERATIONS", "make_accelerator", "acceleration_name", "anderson_bytes",
           "AUTO_ANDERSON_MAX_BYTES"]

#: 'auto' runs Anderson only while its memory (:func:`anderson_bytes`) stays at or below this:
#: 128 MiB. At 1M rows x 3 parties it would be 260 MiB, 0.75x the 346 MB of data, where the
#: rest of the fit allocates 0.49x (issue 9's goal: the fit's peak <= 1.5x the data in all);
#: it saves 5 of 14 rounds to a gap of 1e-4 there. a9a (11 MB), the text-like set (10 MB) and
#: Fashion-MNIST multinomial (117 MiB) keep it. ``acceleration='anderson'`` forces it.
AUTO_ANDERSON_MAX_BYTES = 128 << 20


def anderson_bytes(n_rows: int, n_parties: int, n_outputs: int = 1, mem: int = 5) -> int:
    """Bytes :class:`Anderson` holds for a run: with L = (M + 1) N K state entries, the history
    S, Y (2 mem L in float32 once L >= ``Anderson.F32_MIN``, else float64), the state u and
    g = T(u) - u (float64), the last step (history dtype) and the returned q_1..q_M, y."""
    L = (int(n_parties) + 1) * int(n_rows) * int(n_outputs)
    h = 4 if L >= Anderson.F32_MIN else 8
    return L * (2 * int(mem) * h + 8 + 8 + h) + L * 8

ACCELERATIONS = ("auto", "anderson", "spectral", "anderson+spectral", "none")

#: :class:`Anderson` under 'auto' / 'anderson' engages only once the plain rounds stall: from the
#: first round after which the primal residual ||q|| has shrunk by less than this factor a round
#: (ratio >= STALL_RATIO) :data:`STALL_ROUNDS` rounds running; before that the rounds are plain
#: (the accelerator returns None and touches nothing; its ``engaged`` is False), in which the round
#: driver adapts theta as in plain rounds (core/rounds.py). None (the default): Anderson from round 1.
#: Not the default because it is not a win everywhere (benchmarks/anderson_stall.py, 0.75, CPU to a
#: relative gap of 1e-6, gated / from round 1, median of alternated pairs): a9a L2 0.93, digits
#: K = 10 0.92, breast cancer 3 x 10 0.79, mixture 0.93, skewed 0.89, but counts 1.04 (14 rounds
#: instead of 11), Fashion-MNIST's first 10k rows 1.05 (268 instead of 256) and breast cancer 2 x 15
#: at lam 1e-3 106 rounds instead of 82: its gain is the plain rounds before it engages, Anderson's
#: tail after a later start is faster or slower by up to ~30 % from one problem to the next.
STALL_RATIO = None
STALL_ROUNDS = 2


class Anderson:
    """Type-II Anderson acceleration on u = (zeta_1..zeta_M, y) (module docstring).

    Parameters
    ----------
    mem : int, default=5
        Number of past differences kept ((M + 1) N * 2 mem floats of memory).
    reg : float, default=1e-10
        Tikhonov regularization of the least-squares problem, relative to ||Y||_F^2 / mem.
    safeguard : float, default=10.0
        Reset when ||g|| > safeguard * min ||g|| since the last reset.
    stall : float or None, default=None
        The stall gate (:data:`STALL_RATIO`): while ``engaged`` is False, :meth:`step` records the
        round's ||q|| and returns None (a plain round; nothing is kept, so it costs one N-vector
        dot) until ||q_k|| >= stall * ||q_{k-1}|| held :data:`STALL_ROUNDS` rounds running; from
        that round on it is Anderson as without the gate (its first step is the plain one,
        u = T(u)). None: engaged from round 1.

    The history S, Y is stored in float32 once a state vector has ``F32_MIN`` entries or more
    ((M + 1) N: 1 MB a vector; N >= 32,768 rows with 3 parties): 2 mem (M + 1) N * 4 bytes
    instead of * 8, i.e. 160 MB less at 1M rows x 3 parties. Its inner products and the
    combination are still accumulated in float64 (each chunk's rows cast to float64 in cache,
    then BLAS: :meth:`_advance`), so only the stored differences are rounded
    (relative 6e-8 of a difference that vanishes at the fixed point, which is unchanged). Below
    that size (a9a: 97,683) the history stays float64 and its products are plain BLAS gemv.

    Besides the history the accelerator keeps u (updated in place), g = T(u) - u, the last
    step Delta u = u - u_prev (in the history's dtype) and a chunk-sized scratch, plus the
    returned y and q_m (one N-vector each): :func:`anderson_bytes` counts them.
    """

    F32_MIN = 1 << 17

    def __init__(self, mem: int = 5, reg: float = 1e-10, safeguard: float = 10.0, stall: float | None = None):
        if int(mem) < 1:
            raise ValueError(f"anderson mem={mem!r} must be >= 1")
        self.mem, self.reg, self.safeguard = int(mem), float(reg), float(safeguard)
        #: the stall gate (:data:`STALL_RATIO`): None, engaged from round 1
        self.stall = None if stall is None else float(stall)
        self.engaged = self.stall is None
        self.r_hist = []         # the plain rounds' ||q||, the last STALL_ROUNDS + 1 (gate only)
        self.u = None            # the state the next round starts from (updated in place)
        self.g = None            # T(u) - u of the last round
        self.du = None           # the last step u+ - u (history dtype)
        self.S = self.Y = None   # (mem, L) ring buffers of Delta u, Delta g
        self.A = None            # Y Y^T, one row updated per round
        self.Yg = None           # Y g of the last round
        self.k = 0               # columns filled
        self.g_min = np.inf
        self.resets = 0
        self.rho = None

    def reset(self):
        self.k, self.g_min = 0, np.inf
        self.g = self.Yg = None
        self.resets += 1

    def step(self, s_list, central):
        """The round's acceleration after the central step (engine and strategy call this):
        sets ``central.y`` to the next round's dual and returns the per-party q_m; None (a plain
        round: ``central`` untouched) while the stall gate has not engaged (:meth:`stalled`)."""
        if not self.engaged and not self.stalled(central.q):
            return None
        qs, central.y = self.targets(s_list, central.q, central.y, central.theta, central.rho)
        return qs

    def stalled(self, q) -> bool:
        """The gate (:data:`STALL_RATIO`): record this plain round's primal residual ||q|| (alpha = 1)
        and engage, for good, once ||q_k|| >= stall * ||q_{k-1}|| held STALL_ROUNDS rounds running."""
        v = np.ravel(q)
        with one_blas_thread():
            r = float(np.sqrt(np.dot(v, v)))
        self.r_hist = (self.r_hist + [r])[-(STALL_ROUNDS + 1):]
        h = self.r_hist
        if len(h) > STALL_ROUNDS and all(h[i + 1] >= self.stall * h[i] for i in range(STALL_ROUNDS)):
            self.engaged = True
        return self.engaged

    def targets(self, s_list, q, y, theta, rho):
        """After the central step: the per-party residuals q_m and the dual y of the next round.

        Parameters
        ----------
        s_list : list of arrays
            The values s_m each party released this round (what the central node received).
        q, y : arrays
            The central node's ``a - z`` and dual after its step (T(u)'s y).
        theta, rho : float
            Jacobi damping and the penalty of the round (a new rho restarts the memory).

        Returns
        -------
        (list of q_m, y_next): send q_m to party m and y_next to all; the central node uses
        y_next as its dual in the next z-update.
        """
        shape = np.shape(q)
        n = int(np.prod(shape))
        M = len(s_list)
        if rho != self.rho:
            self.rho = rho
            self.u = None
        s_flat = [np.ravel(s) for s in s_list]
        q_flat, y_flat = np.ravel(q), np.ravel(y)
        y_next = self._out("y", n)
        q_out = [self._out(f"q{m}", n) for m in range(M)]
        CH = self.CHUNK
        chunks = [(seg, a, min(n, a + CH)) for seg in range(M + 1) for a in range(0, n, CH)]

        def source(i, out, u_c=None):    # T(u) on chunk i (s_m - theta q, then y), minus u_c if given
            seg, a, b = chunks[i]
            if seg < M:
                np.multiply(q_flat[a:b], -theta, out=out)
                out += s_flat[seg][a:b]
                if u_c is not None:
                    out -= u_c
            elif u_c is None:
                out[:] = y_flat[a:b]
            else:
                np.subtract(y_flat[a:b], u_c, out=out)

        def emit(i, u_c):                # the new state's messages: q_m = (s_m - zeta_m) / theta, y
            seg, a, b = chunks[i]
            if seg < M:
                qm = q_out[seg][a:b]
                np.subtract(s_flat[seg][a:b], u_c, out=qm)
                qm /= theta
            else:
                y_next[a:b] = u_c

        spans = [(seg * n + a, seg * n + b) for seg, a, b in chunks]
        with one_blas_thread():
            self._advance((M + 1) * n, spans, source, emit)
        return [qm.reshape(shape) for qm in q_out], y_next.reshape(shape)

    # The round runs in two sweeps over chunks of the state (CHUNK entries, 256 KB in float64,
    # segment-aligned so a chunk is one party's zeta_m or y): the first forms T(u) - u, the new
    # history rows and the products Y g, Y Y_fresh from the chunk while it is in cache; the
    # second the combination, u += Delta u, the kept Delta u and the messages. Before, each step
    # was a pass over the whole (M + 1) N state (~15 of them) and T(u) and the combination had
    # (M + 1) N arrays of their own (issue 9: a9a's Anderson step ~0.75 ms, 64 MB at 1M rows).
    CHUNK = 1 << 15

    def _out(self, key, n):
        """The returned y / q_m: one array each, rewritten every round (the caller has used the
        last round's before it calls again: the engine's and the strategy's rounds both do)."""
        outs = self.__dict__.setdefault("_outs", {})
        a = outs.get(key)
        if a is None or a.shape != (n,):
            a = outs[key] = np.empty(n)
        return a

    def _scratch(self, rows, cols):
        b = self.__dict__.get("_scr")
        if b is None or b.shape[0] < rows or b.shape[1] < cols:
            b = self._scr = np.empty((max(rows, 1), cols))
        return b

    def get_state(self) -> tuple[dict, dict]:
        """(arrays, scalars) to checkpoint; :meth:`set_state` restores them bitwise."""
        arrays = {}
        for key in ("u", "g", "du", "S", "Y", "A", "Yg"):
            val = self.__dict__.get(key)
            if val is not None:
                arrays["aa" + key] = val
        g_min = self.g_min if np.isfinite(self.g_min) else None
        return arrays, {"k": self.k, "g_min": g_min, "resets": self.resets, "rho": self.rho,
                        "engaged": bool(self.engaged), "r_hist": [float(r) for r in self.r_hist]}

    def set_state(self, arrays: dict, scalars: dict):
        # own writable copies: u is updated in place (a loaded checkpoint may be read-only);
        # a checkpoint of the earlier layout has u_prev instead of du = u - u_prev
        for key in ("u", "g", "S", "Y", "A", "Yg"):
            v = arrays.get("aa" + key)
            setattr(self, key, None if v is None else np.array(v, copy=True))
        du = arrays.get("aadu")
        if du is None and arrays.get("aau_prev") is not None and self.u is not None:
            du = (self.u - arrays["aau_prev"]).astype(self.S.dtype if self.S is not None else float)
        self.du = None if du is None else np.array(du, copy=True)
        self.k, self.resets, self.rho = int(scalars["k"]), int(scalars["resets"]), scalars["rho"]
        self.g_min = np.inf if scalars["g_min"] is None else float(scalars["g_min"])
        # a checkpoint from before the stall gate: Anderson ran from round 1
        self.engaged = bool(scalars.get("engaged", True))
        self.r_hist = [float(r) for r in scalars.get("r_hist", [])]

    def _next(self, Tu):
        """u+ from a whole T(u) (tests, and any caller that has T(u) as one array): the same
        two sweeps as :meth:`targets`, in chunks of ``Tu``; returns the state u (in place)."""
        L = Tu.shape[0]
        spans = [(a, min(L, a + self.CHUNK)) for a in range(0, L, self.CHUNK)]

        def source(i, out, u_c=None):
            lo, hi = spans[i]
            if u_c is None:
                out[:] = Tu[lo:hi]
            else:
                np.subtract(Tu[lo:hi], u_c, out=out)

        with one_blas_thread():
            return self._advance(L, spans, source, None)

    def _advance(self, L, spans, source, emit):
        """u+ = u + g - gamma S with g = T(u) - u, in place in u; S holds Delta u + Delta g =
        Delta T(u), Y holds Delta g (module docstring). ``source(i, out, u_c=None)`` writes T(u)
        on ``spans[i]`` into ``out``, minus ``u_c`` if given; ``emit(i, u_chunk)`` (if given) sends
        the new state's chunk. Returns u."""
        if self.u is None or self.u.shape != (L,):
            self.S = self.Y = self.du = None
            self.reset()
            u = self.u = np.empty(L)                   # u+ = T(u)
            for i, (lo, hi) in enumerate(spans):
                source(i, u[lo:hi])
                if emit is not None:
                    emit(i, u[lo:hi])
            return u
        u = self.u
        if self.S is None or self.S.shape[1] != L:
            dt = np.float32 if L >= self.F32_MIN else np.float64
            self.S, self.Y = np.empty((self.mem, L), dt), np.empty((self.mem, L), dt)
            self.A, self.Yg = np.zeros((self.mem, self.mem)), None
        S, Y, du = self.S, self.Y, self.du
        hist = self.g is not None and du is not None  # a new history row this round
        g = self.g if self.g is not None else self.__dict__.get("_gbuf")
        if g is None or g.shape != (L,):
            g = np.empty(L)
        self._gbuf = g
        fresh = self.k % self.mem if hist else None
        m = min(self.k + 1, self.mem) if hist else 0
        # the new row of A = Y Y^T reuses last round's Y g_prev for the rows that did not
        # change: (g - g_prev) . Y_j = (Y g)_j - (Y g_prev)_j, so only Y_fresh . Y_fresh is new
        # (all of Y Y_fresh after a reset of Yg)
        full = m > 0 and (self.Yg is None or self.Yg.shape[0] < m - (fresh == m - 1))
        Yg, row, gg = np.zeros(m), np.zeros(m), 0.0
        width = max(hi - lo for lo, hi in spans)
        scr = self._scratch(m + 1, width)
        for i, (lo, hi) in enumerate(spans):           # sweep 1: g, the history rows, products
            w = hi - lo
            t = scr[m, :w]
            source(i, t, u[lo:hi])                     # g = T(u) - u on the chunk
            gg += float(np.dot(t, t))
            if hist:
                yf = Y[fresh, lo:hi]
                np.subtract(t, g[lo:hi], out=yf)       # Delta g (S's new row: in sweep 2)
                if Y.dtype == np.float64:
                    Yc = Y[:m, lo:hi]
                else:                                  # float32 rows cast in cache, then BLAS
                    Yc = scr[:m, :w]
                    np.copyto(Yc, Y[:m, lo:hi])
                Yg += Yc @ t
                if full:
                    row += Yc @ Yc[fresh]
                else:
                    row[fresh] += float(np.dot(Yc[fresh], Yc[fresh]))
            g[lo:hi] = t
        gn = float(np.sqrt(gg))
        if not np.isfinite(gn) or gn > self.safeguard * self.g_min:
            self.reset()
            self.du = None
            return self._sweep2(u, g, None, None, spans, emit)   # the plain ADMM step u+ = T(u)
        self.g_min = min(self.g_min, gn)
        self.g = g
        if m == 0:        # (right after a reset): the plain step; Delta u = g exactly
            if du is None or du.shape != (L,) or du.dtype != S.dtype:
                du = self.du = np.empty(L, S.dtype)
            return self._sweep2(u, g, None, du, spans, emit)
        self.k += 1
        if not full:
            for j in range(m):
                if j != fresh:
                    row[j] = Yg[j] - self.Yg[j]
        self.A[fresh, :m] = row
        self.A[:m, fresh] = row
        self.Yg = Yg
        A = self.A[:m, :m].copy()
        A.flat[::m + 1] += self.reg * max(float(np.trace(A)), 1e-300) / m   # the diagonal
        gamma = _small_spd_solve(A, Yg)
        if gamma is None or not np.all(np.isfinite(gamma)):
            self.reset()
            self.du = None
            return self._sweep2(u, g, None, None, spans, emit)
        return self._sweep2(u, g, gamma, du, spans, emit, fresh)

    def _sweep2(self, u, g, gamma, du, spans, emit, fresh=None):
        """Sweep 2: Delta u+ = g - gamma S (g alone without gamma), u += Delta u+, kept in
        ``du`` (if given) for next round's S, and the messages of the new state. ``fresh``: S's
        new row, Delta u + Delta g = Delta T(u) from the last step ``du`` and Y's new row, is
        written here, chunk by chunk just before the combination reads it and overwrites ``du``
        (in sweep 1 both were written back to memory and read again: ~3 % of the step at a9a's
        size; only a round that combines uses the row, a reset drops it)."""
        m = 0 if gamma is None else gamma.shape[0]
        S, Y = self.S, self.Y
        scr = self._scratch(m + 1, max(hi - lo for lo, hi in spans))
        # Delta u+ is formed in du itself when du is float64 (no copy a chunk); g alone is not copied
        direct = du is not None and du.dtype == np.float64
        for i, (lo, hi) in enumerate(spans):
            w = hi - lo
            if gamma is None:
                c = g[lo:hi]
            else:
                if fresh is not None:
                    np.add(du[lo:hi], Y[fresh, lo:hi], out=S[fresh, lo:hi])
                c = du[lo:hi] if direct else scr[m, :w]
                if S.dtype == np.float64:    # matmul: BLAS on the strided rows (np.dot copies them)
                    np.matmul(gamma, S[:m, lo:hi], out=c)
                else:
                    Sc = scr[:m, :w]
                    np.copyto(Sc, S[:m, lo:hi])
                    np.matmul(gamma, Sc, out=c)
                np.subtract(g[lo:hi], c, out=c)
            u[lo:hi] += c
            if du is not None and not (direct and gamma is not None):
                np.copyto(du[lo:hi], c, casting="same_kind")
            if emit is not None:
                emit(i, u[lo:hi])
        return u


def _small_spd_solve(A, b):
    """Solve A x = b for a small SPD A (m <= mem): LAPACK's dposv (Cholesky and solve, ~1 us),
    called inside :func:`one_blas_thread` (LAPACK's gesv through OpenBLAS's 2 threads stalled
    most rounds for ~30 ms on a loaded 2-core machine; the Python Cholesky used before cost
    ~28 us a round). None if A is not positive definite."""
    x, info = dposv(A, np.asarray(b, dtype=float), lower=1)[1:]
    return x if info == 0 else None


class SpectralRho:
    """Spectral (Barzilai-Borwein) adaptive rho: Xu, Figueiredo & Goldstein 2017, "Adaptive ADMM
    with spectral penalty parameter selection" (AADMM), on the sharing form of the round.

    Boyd's sharing ADMM (docs/math.md Section 2) has one constraint per party, s_m - zeta'_m = 0,
    penalty rho_x = rho / theta, the parties' f_m on one side and g(sum_m zeta_m) on the other,
    with the common dual y. After round k (start state zeta_m, y; releases s_m; central step to
    y', q = a - z):

        party side  (dual estimate of each x-update)   yhat_m = y + rho_x (s_m - zeta_m),
                     -s_m is the gradient of f_m^* at yhat_m
        central side                                    zeta'_m = s_m - theta q,  dual y' for all m.

    Every ``every`` rounds, with the differences since the last update (Delta yhat, Delta s;
    Delta y, Delta zeta'), the two curvature estimates are the paper's hybrid of the steepest-
    descent and minimum-gradient BB steps,

        a_SD = |Dyhat|^2 / c_H,  a_MG = c_H / |Ds|^2,   c_H = -sum_m <Ds_m, Dyhat_m> (>= 0),
        b_SD = M |Dy|^2 / c_G,   b_MG = c_G / sum_m |Dzeta'_m|^2,   c_G = <Dz, Dy> (>= 0),
        a = a_MG if 2 a_MG > a_SD else a_SD - a_MG / 2   (b likewise),

    with correlations cor_H = c_H / (|Ds| |Dyhat|), cor_G = c_G / (|Dzeta'| sqrt(M) |Dy|):
    rho_x <- sqrt(a b) when both exceed ``eps_cor``, a or b when only one does, unchanged
    otherwise; rho = theta rho_x. Every quantity is an N-vector the central node already holds
    (the s_m it received, the state it sent), so nothing more crosses the wire; the parties
    receive the new rho in the next round's message as always. A change is bounded by the
    factor 1 + ``c_cg`` / k^2 (the paper's condition for convergence: the sum of the eta_k is
    finite). A new rho costs the parties no pass over the data (docs/math.md Section 6).
    Memory: (4 M + 2) N-vectors.
    """

    def __init__(self, every: int = 2, eps_cor: float = 0.2, c_cg: float = 1e10):
        if int(every) < 1:
            raise ValueError(f"spectral every={every!r} must be >= 1")
        self.every, self.eps_cor, self.c_cg = int(every), float(eps_cor), float(c_cg)
        self.k = 0              # rounds seen
        self.k0 = 0             # round of the reference point
        self.start = None       # [zeta_1..zeta_M, y] the next round starts from
        self.ref = None         # [yhat_1..M, s_1..M, zeta'_1..M, y'] at round k0
        self.changes = 0

    def step(self, s_list, central):
        """After the central step (``central.q``, ``central.y`` = T(u)'s): maybe a new rho, set
        on ``central`` (the next message carries it). Returns None (q is the central's)."""
        theta, rho = central.theta, central.rho
        q, y = central.q, central.y
        zeta_new = [np.asarray(s) - theta * q for s in s_list]
        self.k += 1
        new_rho = rho
        if self.start is not None:
            rho_x = rho / theta
            yhat = [self.start[-1] + rho_x * (np.asarray(s) - z0) for s, z0 in zip(s_list, self.start[:-1])]
            cur = yhat + [np.asarray(s) for s in s_list] + zeta_new + [y]
            if self.ref is None:
                self.ref, self.k0 = [np.array(v, dtype=float) for v in cur], self.k
            elif self.k - self.k0 >= self.every:
                tau = self._tau(cur, len(s_list), rho_x)
                self.ref, self.k0 = [np.array(v, dtype=float) for v in cur], self.k
                if tau is not None:
                    bound = 1.0 + self.c_cg / float(self.k) ** 2
                    new_rho = theta * min(max(tau, rho_x / bound), rho_x * bound)
        if new_rho != rho:
            self.changes += 1
            central.set_rho(new_rho)
        self.start = zeta_new + [np.array(y, dtype=float)]
        return None

    def restart_from(self, s_list, qs, y, theta):
        """The next round starts from an accelerated state (Anderson's q_m, y), not T(u)."""
        self.start = [np.asarray(s) - theta * np.asarray(qm) for s, qm in zip(s_list, qs)] + \
            [np.array(y, dtype=float)]

    def _tau(self, cur, M, rho_x):
        ref = self.ref
        d = [_dot(c - r, c - r) for c, r in zip(cur, ref)]
        dyh, ds, dz, dy = (slice(0, M), slice(M, 2 * M), slice(2 * M, 3 * M), 3 * M)
        c_h = -sum(_dot(cur[M + m] - ref[M + m], cur[m] - ref[m]) for m in range(M))
        c_g = _dot(sum(cur[2 * M + m] - ref[2 * M + m] for m in range(M)), cur[dy] - ref[dy])
        n_yh, n_s, n_z, n_y = sum(d[dyh]), sum(d[ds]), sum(d[dz]), M * d[dy]
        a = b = None
        if c_h > 0 and n_s > 0 and n_yh > 0 and c_h > self.eps_cor * np.sqrt(n_s * n_yh):
            a = _hybrid(n_yh / c_h, c_h / n_s)
        if c_g > 0 and n_z > 0 and n_y > 0 and c_g > self.eps_cor * np.sqrt(n_z * n_y):
            b = _hybrid(n_y / c_g, c_g / n_z)
        if a is not None and b is not None:
            tau = float(np.sqrt(a * b))
        else:
            tau = a if a is not None else b
        return tau if tau is not None and np.isfinite(tau) and tau > 0 else None

    _KEYS = ("start", "ref")

    def get_state(self) -> tuple[dict, dict]:
        arrays = {}
        for key in self._KEYS:
            for i, v in enumerate(getattr(self, key) or []):
                arrays[f"sr{key}{i}"] = v
        return arrays, {"k": self.k, "k0": self.k0, "changes": self.changes,
                        "n_start": len(self.start or []), "n_ref": len(self.ref or [])}

    def set_state(self, arrays: dict, scalars: dict):
        self.k, self.k0, self.changes = int(scalars["k"]), int(scalars["k0"]), int(scalars["changes"])
        for key in self._KEYS:
            n = int(scalars["n_" + key])
            setattr(self, key, [np.asarray(arrays[f"sr{key}{i}"], dtype=float) for i in range(n)] or None)


def _hybrid(sd, mg):
    """Xu et al. 2017's safeguarded hybrid of the two Barzilai-Borwein step sizes."""
    return mg if 2.0 * mg > sd else sd - 0.5 * mg


def _dot(a, b) -> float:
    a, b = np.ravel(a), np.ravel(b)
    return float(np.einsum("i,i->", a, b))


class Chain:
    """Spectral rho, then Anderson on the new rho (its memory restarts when rho changes)."""

    def __init__(self, spectral: SpectralRho, anderson: Anderson):
        self.spectral, self.anderson = spectral, anderson

    def step(self, s_list, central):
        self.spectral.step(s_list, central)
        qs = self.anderson.step(s_list, central)
        self.spectral.restart_from(s_list, qs, central.y, central.theta)
        return qs

    def get_state(self):
        a_arr, a_sc = self.anderson.get_state()
        s_arr, s_sc = self.spectral.get_state()
        return {**a_arr, **s_arr}, {"aa": a_sc, "sr": s_sc}

    def set_state(self, arrays, scalars):
        self.anderson.set_state(arrays, scalars["aa"])
        self.spectral.set_state(arrays, scalars["sr"])


def acceleration_name(acc) -> str:
    """What :func:`make_accelerator` returned, by name: 'anderson', 'spectral',
    'anderson+spectral' or 'none' (the engine's and the strategy's ``acceleration_``)."""
    return {Anderson: "anderson", SpectralRho: "spectral", Chain: "anderson+spectral"}.get(type(acc), "none")


def make_accelerator(acceleration, central, private, penalty="l2", constrained=False, mem: int = 5,
                     n_parties=None):
    """The accelerator of a run, or None. Shared by the engine and the strategy, which both call
    ``acc.step(s_list, central)`` after the central step (it may set ``central.y`` and
    ``central.rho``) and send party m ``qs[m]`` (or ``central.q`` when it returns None).

    ``'anderson'`` applies when alpha = 1, no party is private (a noisy release makes T random)
    and the x-update is smooth (penalty 'l2' without a constraint set): on a9a with L1 the
    accelerated iteration stalled at ||g|| = 0.18 from round ~50 and then left the optimum
    (objective 122 after its resets) while the plain one converged, so it is off for
    non-smooth x-updates ('none' then). ``'spectral'`` (:class:`SpectralRho`) applies when
    alpha = 1, no party is private and the loss is convex, for every penalty;
    ``'anderson+spectral'`` is both where both apply. ``'auto'`` (the default) is 'anderson'
    (behind its stall gate when :data:`STALL_RATIO` is set) for a smooth x-update and 'none' otherwise: spectral rho lost to the plain iteration on
    a9a and breast cancer with L1 (docs/benchmarks-history.md), and only while Anderson's
    memory is at most :data:`AUTO_ANDERSON_MAX_BYTES` (from N, K and ``n_parties``, default
    ``len(private)``: the engine and the strategy decide alike; the choice is logged on
    ``flower_vfl.core``). ``'none'`` never accelerates."""
    if acceleration not in ACCELERATIONS:
        raise ValueError(f"acceleration={acceleration!r} is not supported; choose one of "
                         f"{list(ACCELERATIONS)}")
    if acceleration == "none" or central.alpha != 1.0 or any(private):
        return None
    smooth = bool(getattr(penalty_class(penalty), "anderson", False)) and not constrained
    if acceleration == "auto":
        if not smooth:
            return None
        need = anderson_bytes(np.shape(central.t)[0], len(private) if n_parties is None else n_parties,
                              int(getattr(central.loss, "n_outputs", 1) or 1), mem)
        if need > AUTO_ANDERSON_MAX_BYTES:
            LOG.info("acceleration='auto': plain rounds, Anderson would hold %.0f MiB (> %.0f MiB); "
                     "acceleration='anderson' forces it", need / 2**20, AUTO_ANDERSON_MAX_BYTES / 2**20)
            return None
        acceleration = "anderson"
    use_aa = "anderson" in acceleration and smooth
    use_sr = "spectral" in acceleration and bool(getattr(central.loss, "convex", False))
    if use_aa and use_sr:
        return Chain(SpectralRho(), Anderson(mem=mem))
    if use_aa:
        return Anderson(mem=mem, stall=STALL_RATIO)
    return SpectralRho() if use_sr else None
