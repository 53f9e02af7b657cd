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
:meth:`Anderson.targets` after the central step, so the two paths stay identical.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Anderson", "ACCELERATIONS", "make_accelerator"]

ACCELERATIONS = ("anderson", "none")


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
    """

    def __init__(self, mem: int = 5, reg: float = 1e-10, safeguard: float = 10.0):
        if int(mem) < 1:
            raise ValueError(f"anderson mem={mem!r} must be >= 1")
        self.mem, self.reg, self.safeguard = int(mem), float(reg), float(safeguard)
        self.u = None            # the state the last round started from
        self.g = None
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
        L = (M + 1) * n
        Tu = self._buf("Tu", L)
        for m, s in enumerate(s_list):
            seg = Tu[m * n:(m + 1) * n]
            np.multiply(np.ravel(q), -theta, out=seg)
            seg += np.ravel(s)                                  # s_m - theta q
        Tu[M * n:] = np.ravel(y)
        if rho != self.rho:
            self.rho = rho
            self.u = None
        u_next = self._next(Tu)
        self.u = u_next
        y_next = self._free("y", (n,), 2)
        y_next[:] = u_next[M * n:]
        qs = []
        for m, s in enumerate(s_list):
            qm = self._free(f"q{m}", (n,), 2)
            np.subtract(np.ravel(s), u_next[m * n:(m + 1) * n], out=qm)
            qm /= theta
            qs.append(qm.reshape(shape))
        return qs, y_next.reshape(shape)

    # Work arrays are reused across rounds: a fresh (M + 1) N-vector each round is mmapped and
    # page-faulted in again (at a9a's N ~190 faults each); under load that took the round's
    # Anderson step from ~2 ms to a 23-40 ms median.
    def _buf(self, key, L):
        pool = self.__dict__.setdefault("_pool", {})
        b = pool.get(key)
        if b is None or b.shape != (L,):
            b = pool[key] = np.empty(L)
        return b

    def _free(self, key, shape, count):
        """A pool array of ``shape`` that is none of the live ones (u, u_prev, g; the last
        returned y / q), rotating over ``count`` arrays."""
        pool = self.__dict__.setdefault("_pool", {})
        arrs = pool.get(key)
        if arrs is None or arrs[0].shape != shape:
            arrs = pool[key] = [np.empty(shape) for _ in range(count)]
        live = [getattr(self, k, None) for k in ("u", "_u_prev", "g")]
        last = pool.get(key + ".last")
        for a in arrs:
            if a is not last and all(a is not v for v in live):
                pool[key + ".last"] = a
                return a
        raise RuntimeError("no free work array")          # pragma: no cover

    def get_state(self) -> tuple[dict, dict]:
        """(arrays, scalars) to checkpoint; :meth:`set_state` restores them bitwise."""
        arrays = {}
        for key in ("u", "_u_prev", "g", "S", "Y", "A", "Yg"):
            val = getattr(self, key, None)
            if val is not None:
                arrays["aa" + key.strip("_")] = val
        g_min = self.g_min if np.isfinite(self.g_min) else None
        return arrays, {"k": self.k, "g_min": g_min, "resets": self.resets, "rho": self.rho}

    def set_state(self, arrays: dict, scalars: dict):
        for key in ("u", "_u_prev", "g", "S", "Y", "A", "Yg"):
            setattr(self, key, arrays.get("aa" + key.strip("_")))
        self.k, self.resets, self.rho = int(scalars["k"]), int(scalars["resets"]), scalars["rho"]
        self.g_min = np.inf if scalars["g_min"] is None else float(scalars["g_min"])

    def _next(self, Tu):
        L = Tu.shape[0]
        out = self._free("u", (L,), 3)
        if self.u is None or self.u.shape != Tu.shape:
            self.S = self.Y = None
            self.reset()
            np.copyto(out, Tu)
            return out
        u = self.u
        g = self._free("g", (L,), 2)
        np.subtract(Tu, u, out=g)
        gn = float(np.sqrt(np.einsum("i,i->", g, g)))
        if not np.isfinite(gn) or gn > self.safeguard * self.g_min:
            self.reset()
            np.copyto(out, Tu)
            return out
        self.g_min = min(self.g_min, gn)
        L = g.shape[0]
        if self.S is None or self.S.shape[1] != L:
            # S holds Delta u + Delta g (= S + Y of the docstring): u+ = T(u) - gamma (S + Y)
            self.S, self.Y = np.empty((self.mem, L)), np.empty((self.mem, L))
            self.A, self.Yg = np.zeros((self.mem, self.mem)), None
        fresh = None
        if self.g is not None:
            fresh = self.k % self.mem
            np.subtract(g, self.g, out=self.Y[fresh])
            np.subtract(u, self._u_prev, out=self.S[fresh])
            self.S[fresh] += self.Y[fresh]
            self.k += 1
        m = min(self.k, self.mem)
        self._u_prev, self.g = u, g
        if m == 0:
            np.copyto(out, Tu)
            return out
        # einsum, not BLAS (2 OpenBLAS threads stalled these products under load). Y g costs one
        # pass over Y; the new row of A = Y Y^T reuses last round's Y g_prev for the rows that did
        # not change: (g - g_prev) . Y_j = (Y g)_j - (Y g_prev)_j
        Yg = np.einsum("ij,j->i", self.Y[:m], g)
        row = np.empty(m)
        for j in range(m):
            if j == fresh or self.Yg is None or j >= self.Yg.shape[0]:
                row[j] = float(np.einsum("i,i->", self.Y[fresh], self.Y[j]))
            else:
                row[j] = Yg[j] - self.Yg[j]
        self.A[fresh, :m] = row
        self.A[:m, fresh] = row
        self.Yg = Yg
        A = self.A[:m, :m].copy()
        A[np.diag_indices_from(A)] += self.reg * max(float(np.trace(A)), 1e-300) / m
        gamma = _small_spd_solve(A, Yg)
        if gamma is None or not np.all(np.isfinite(gamma)):
            self.reset()
            np.copyto(out, Tu)
            return out
        np.einsum("i,ij->j", gamma, self.S[:m], out=out)
        np.subtract(Tu, out, out=out)
        return out

def _small_spd_solve(A, b):
    """Solve A x = b for a small SPD A (m <= mem) by Cholesky in Python: LAPACK's gesv went
    through OpenBLAS's threads and stalled most rounds for ~30 ms on this loaded 2-core machine
    (a9a: round median 35-40 ms with it, 2.3 ms minimum). None if A is not positive definite."""
    m = A.shape[0]
    L = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1):
            v = A[i, j] - float(np.dot(L[i, :j], L[j, :j])) if j else A[i, j]
            if i == j:
                if not v > 0.0:
                    return None
                L[i, i] = np.sqrt(v)
            else:
                L[i, j] = v / L[j, j]
    x = np.array(b, dtype=float)
    for i in range(m):                       # L y = b
        x[i] = (x[i] - float(np.dot(L[i, :i], x[:i]))) / L[i, i]
    for i in range(m - 1, -1, -1):           # L^T x = y
        x[i] = (x[i] - float(np.dot(L[i + 1:, i], x[i + 1:]))) / L[i, i]
    return x


def make_accelerator(acceleration, central, private, penalty="l2", constrained=False, mem: int = 5):
    """The accelerator of a run, or None. Shared by the engine and the strategy.

    ``'anderson'`` applies when alpha = 1, no party is private (a noisy release makes T random)
    and the x-update is smooth (penalty 'l2' without a constraint set): on a9a with L1 the
    accelerated iteration stalled at ||g|| = 0.18 from round ~50 and then left the optimum
    (objective 122 after its resets) while the plain one converged, so it is off for
    non-smooth x-updates ('none' then). ``'none'`` never accelerates."""
    if acceleration not in ACCELERATIONS:
        raise ValueError(f"acceleration={acceleration!r} is not supported; choose one of "
                         f"{list(ACCELERATIONS)}")
    if acceleration == "none" or central.alpha != 1.0 or any(private):
        return None
    if getattr(penalty, "name", penalty) != "l2" or constrained:
        return None
    return Anderson(mem=mem)

