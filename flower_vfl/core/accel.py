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
        self.k = 0               # columns filled
        self.g_min = np.inf
        self.resets = 0
        self.rho = None

    def reset(self):
        self.k, self.g_min = 0, np.inf
        self.g = None
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
        Tu = np.empty((M + 1) * n)
        for m, s in enumerate(s_list):
            Tu[m * n:(m + 1) * n] = (np.asarray(s) - theta * q).ravel()
        Tu[M * n:] = np.ravel(y)
        if rho != self.rho:
            self.rho = rho
            self.u = None
        u_next = self._next(Tu)
        self.u = u_next
        y_next = u_next[M * n:].reshape(shape).copy()
        qs = [((np.asarray(s).ravel() - u_next[m * n:(m + 1) * n]) / theta).reshape(shape)
              for m, s in enumerate(s_list)]
        return qs, y_next

    def get_state(self) -> tuple[dict, dict]:
        """(arrays, scalars) to checkpoint; :meth:`set_state` restores them bitwise."""
        arrays = {}
        for key in ("u", "_u_prev", "g", "S", "Y", "A"):
            val = getattr(self, key, None)
            if val is not None:
                arrays["aa" + key.strip("_")] = val
        g_min = self.g_min if np.isfinite(self.g_min) else None
        return arrays, {"k": self.k, "g_min": g_min, "resets": self.resets, "rho": self.rho}

    def set_state(self, arrays: dict, scalars: dict):
        for key in ("u", "_u_prev", "g", "S", "Y", "A"):
            setattr(self, key, arrays.get("aa" + key.strip("_")))
        self.k, self.resets, self.rho = int(scalars["k"]), int(scalars["resets"]), scalars["rho"]
        self.g_min = np.inf if scalars["g_min"] is None else float(scalars["g_min"])

    def _next(self, Tu):
        if self.u is None or self.u.shape != Tu.shape:
            self.S = self.Y = None
            self.reset()
            return Tu
        u = self.u
        g = Tu - u
        gn = float(np.sqrt(np.einsum("i,i->", g, g)))
        if not np.isfinite(gn) or gn > self.safeguard * self.g_min:
            self.reset()
            return Tu
        self.g_min = min(self.g_min, gn)
        L = g.shape[0]
        if self.S is None or self.S.shape[1] != L:
            self.S, self.Y = np.empty((self.mem, L)), np.empty((self.mem, L))
            self.A = np.zeros((self.mem, self.mem))
        if self.g is not None:
            i = self.k % self.mem
            np.subtract(u, self._u_prev, out=self.S[i])
            np.subtract(g, self.g, out=self.Y[i])
            self.k += 1
            m = min(self.k, self.mem)
            # one new row of Y Y^T per round; einsum, not BLAS: OpenBLAS's 2 threads stalled these
            # small products for ~70 ms a round on this loaded 2-core machine (docs/benchmarks.md)
            row = np.einsum("ij,j->i", self.Y[:m], self.Y[i])
            self.A[i, :m] = row
            self.A[:m, i] = row
        self._u_prev, self.g = u, g
        m = min(self.k, self.mem)
        if m == 0:
            return Tu
        A = self.A[:m, :m].copy()
        A[np.diag_indices_from(A)] += self.reg * max(float(np.trace(A)), 1e-300) / m
        try:
            gamma = np.linalg.solve(A, np.einsum("ij,j->i", self.Y[:m], g))
        except np.linalg.LinAlgError:
            self.reset()
            return Tu
        if not np.all(np.isfinite(gamma)):
            self.reset()
            return Tu
        out = Tu - np.einsum("i,ij->j", gamma, self.S[:m])
        out -= np.einsum("i,ij->j", gamma, self.Y[:m])
        return out


def make_accelerator(acceleration, central, private, mem: int = 5):
    """The accelerator of a run, or None: ``'anderson'`` applies when alpha = 1 and no party is
    private (a noisy release makes T random); ``'none'`` never. Shared by engine and strategy."""
    if acceleration not in ACCELERATIONS:
        raise ValueError(f"acceleration={acceleration!r} is not supported; choose one of "
                         f"{list(ACCELERATIONS)}")
    if acceleration == "none" or central.alpha != 1.0 or any(private):
        return None
    return Anderson(mem=mem)

