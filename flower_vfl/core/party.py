"""A vertical party's side of ADMM sharing (Algorithm 1, lines 3-6). No Flower imports.

The party owns D_m and x_m. Each round it receives from the central node the
(relaxed) residual ``q = a_hat - z`` and the dual ``y`` (N-vectors, or N x K), plus
scalars ``rho``, ``alpha`` (over-relaxation) and ``theta`` (Jacobi damping), and
returns one value per sample, ``s_m = D_m x_m``.

With ``theta = 1`` and ``alpha = 1`` this is eq. (6) of the paper verbatim:
``x_m = argmin lam R(x) + <y, D_m x> + rho/2 ||sum_{k!=m} s_k + D_m x - z||^2``.
With ``theta = 1/M`` it is the ADMM sharing of Boyd et al. (2011, Sec. 7.3), a
proximal-Jacobi form of eq. (6) with rho_x = rho/theta that is a genuine two-block
ADMM and so converges for any rho > 0 on convex problems; ``alpha`` is Boyd's
over-relaxation (Sec. 3.4.3). Every variant has the same fixed points: the
stationary points (9)-(12) of problem (1).
"""

from __future__ import annotations

import numpy as np

from .xsolve import XSolver, _norm

__all__ = ["PartyUpdate"]


class PartyUpdate:
    """The x-update of one party plus the bookkeeping it needs across rounds.

    State (kept by the party, never sent): ``x`` (its model block), ``s`` (the
    value it last released, Alg. 1 line 4's cache), ``z_loc`` (its share of z in the
    sharing reformulation; equals ``s - theta * r`` when alpha = 1).
    """

    def __init__(self, D, penalty, lam, constraint=None, n_outputs=1, inner_tol=1e-12,
                 v_clip=None, x_solver="auto"):
        self.D = D
        #: entry-wise bound on the x-update target, enforced here on the party side so that
        #: whatever the central node sends, the sensitivity bound of the release holds
        self.v_clip = v_clip
        self.n, self.d = D.shape
        self.solver = XSolver(D, penalty, lam, constraint=constraint, inner_tol=inner_tol,
                              method=x_solver)
        shape_x = (self.d,) if n_outputs == 1 else (self.d, n_outputs)
        shape_s = (self.n,) if n_outputs == 1 else (self.n, n_outputs)
        self.x = np.zeros(shape_x)
        self.s = np.zeros(shape_s)
        self.z_loc = np.zeros(shape_s)
        #: rho / theta of the x-update that produced ``x`` (None before the first one); the
        #: sensitivity of anything released from x must use this value, not a later message's
        self.rho_x = None
        #: (D x, D^T D x) of the current x, carried by the CG x-update (never sent)
        self.carry = None

    def step(self, q, y, rho, alpha=1.0, theta=1.0):
        """One x-update (eq. 6); returns the exact ``D_m x_m`` (before any privacy noise).

        The caller stores what it actually released with :meth:`commit`.
        """
        # z_loc = x_hat - theta q and v = z_loc - y / rho_x, with two N-vector temporaries
        # (each costs an mmap at a9a's N; the arithmetic is bitwise the textbook form)
        x_hat = self.s if alpha == 1.0 else alpha * self.s + (1.0 - alpha) * self.z_loc
        z_loc = np.multiply(q, -theta)
        z_loc += x_hat
        self.z_loc = z_loc
        rho_x = rho / theta
        v = np.divide(y, -rho_x)
        v += z_loc
        if self.v_clip is not None:
            np.clip(v, -self.v_clip, self.v_clip, out=v)
        self.last_target = v          # kept for the privacy audit (never sent)
        # inexact (CG / FISTA-on-D) solvers tie their tolerance to the residual received
        outer = theta * _norm(q) if self.solver.inexact else None
        self.x = self.solver.solve(v, rho_x, x0=self.x, outer=outer, carry=self.carry)
        self.rho_x = float(rho_x)
        self.carry = self.solver.last_carry   # the CG path carries D x: no extra mat-vec
        return self.D @ self.x if self.carry is None else self.carry[0]

    def commit(self, s_released):
        """Cache the value actually sent (noisy when private): the next residual contains it."""
        self.s = np.asarray(s_released, dtype=float)

    # the release interface shared with flower_vfl.privacy.PrivateParty
    def train_release(self, round, q, y, rho, alpha=1.0, theta=1.0):
        """Non-private release: the exact D_m x_m."""
        s = self.step(q, y, rho, alpha, theta)
        self.commit(s)
        return s

    def eval_release(self, round, rho=None, theta=None, D_eval=None):
        return D_eval @ self.x

    def penalty_value(self):
        return self.solver.penalty.value(self.x)

    # -- state for Flower's context.state (every message is a fresh process on real nodes)
    def get_state(self) -> dict:
        state = {"x": self.x, "s": self.s, "z_loc": self.z_loc}
        if self.rho_x is not None:
            state["rho_x"] = np.array([self.rho_x])
        if self.carry is not None:
            state["Dx"], state["DtDx"] = self.carry
        return state

    def set_state(self, state: dict):
        for k in ("x", "s", "z_loc"):
            if k in state:
                setattr(self, k, np.asarray(state[k], dtype=float).reshape(getattr(self, k).shape))
        if "rho_x" in state:
            self.rho_x = float(np.asarray(state["rho_x"]).ravel()[0])
        if "x" in state:     # the carried products belong to this x (absent: recomputed)
            self.carry = None if "Dx" not in state else (
                np.array(state["Dx"], dtype=float).reshape(self.s.shape),
                np.array(state["DtDx"], dtype=float).reshape(self.x.shape))
