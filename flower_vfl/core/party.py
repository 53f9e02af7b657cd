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

from flower_vfl.core.xsolve import XSolver, vector_norm

__all__ = ["PartyUpdate", "Releases", "PLAIN_ROUNDS", "x_update_target", "target_norm"]

#: the train-config flag by which the central node tells a party that no accelerator
#: extrapolates the rounds (:meth:`PartyUpdate.plain_rounds`); the Flower strategy sends it, a
#: non-private party's ClientApp reads it, a private party ignores it (an accuracy knob only)
PLAIN_ROUNDS = "plain_rounds"


def x_update_target(x_hat, q, y, rho, theta, out=None):
    """``(z_loc, v)`` of eq. (6): the party's share of z, ``z_loc = x_hat - theta q``, and its
    x-update target ``v = z_loc - y / rho_x`` (``rho_x = rho / theta``), with two N-vector
    temporaries (each costs an mmap at a9a's N; the arithmetic is bitwise the textbook form),
    or written into ``out = (z_loc, v)`` (float64 arrays of q's shape, or None for a new one,
    sharing no memory with an input: a buffer the party reuses round to round; bitwise the same
    values).

    ``x_hat`` is the party's last release at alpha = 1 (else its relaxed ``alpha s + (1 - alpha)
    z_loc``). The party's :meth:`PartyUpdate.step` and the central node (which holds each party's
    last release, but under secure aggregation, and so can send it ``v`` alone at alpha = 1: 8 N
    bytes a round instead of q and y's 16 N) both call this function, so the target is bitwise
    the same on either side."""
    z_loc = np.multiply(q, -theta, out=None if out is None else out[0])
    z_loc += x_hat
    v = np.divide(y, -(rho / theta), out=None if out is None else out[1])
    v += z_loc
    return z_loc, v


def target_norm(q) -> float:
    """``||q||``, which the inexact (CG) x-update ties its tolerance to: sent beside ``v`` when the
    central node sends the target alone (the party then has no q)."""
    return vector_norm(q)


class Releases:
    """The non-private release interface every party block update shares (the linear
    :class:`PartyUpdate`, the MLP block's update in :mod:`flower_vfl.core.blocks_mlp`; a private
    party's is :class:`flower_vfl.privacy.PrivateParty`): ``step`` toward the target, then the exact
    release, cached for the next residual."""

    def commit(self, s_released):
        """Cache the value actually sent (noisy when private): the next residual contains it."""
        self.s = np.asarray(s_released, dtype=float)

    def train_release(self, round, q, y, rho, alpha=1.0, theta=1.0, v=None, q_norm=None):
        """Non-private release: the exact block output (``v``, ``q_norm``: the update's ``step``)."""
        s = self.step(q, y, rho, alpha, theta, v=v, q_norm=q_norm)
        self.commit(s)
        return s


class PartyUpdate(Releases):
    """The x-update of one party plus the bookkeeping it needs across rounds.

    State (kept by the party, never sent): ``x`` (its model block), ``s`` (the
    value it last released, Alg. 1 line 4's cache), ``z_loc`` (its share of z in the
    sharing reformulation; equals ``s - theta * r`` when alpha = 1).
    """

    def __init__(self, D, penalty, lam, constraint=None, n_outputs=1, inner_tol=1e-12,
                 v_clip=None, x_solver="auto", center=False):
        self.D = D
        #: entry-wise bound on the x-update target, enforced here on the party side so that
        #: whatever the central node sends, the sensitivity bound of the release holds
        self.v_clip = v_clip
        self.n, self.d = D.shape
        # low_memory: between rounds the CG path keeps x, D x (= the release s) and one
        # d-vector of column statistics, not also D^T D x and the column sums (2 mat-vecs more
        # a round; with M parties solving in turn, 2 M - 1 d-vectors less at the peak: the
        # sums are one d-vector again during the party's own solve)
        # (only for a block wider than tall, where the d-vectors are the memory: with d <= N,
        # CG chosen for very large N, the 2 mat-vecs over N rows would cost more than they save)
        self.solver = XSolver(D, penalty, lam, constraint=constraint, inner_tol=inner_tol,
                              method=x_solver, low_memory=self.d > self.n,
                              center=center and v_clip is None)   # centred: see XSolver; never private
        shape_x = (self.d,) if n_outputs == 1 else (self.d, n_outputs)
        shape_s = (self.n,) if n_outputs == 1 else (self.n, n_outputs)
        self.x = np.zeros(shape_x)
        self.s = np.zeros(shape_s)
        self.z_loc = np.zeros(shape_s)
        #: rho / theta of the x-update that produced ``x`` (None before the first one); the
        #: sensitivity of anything released from x must use this value, not a later message's
        self.rho_x = None
        #: (D x, None) of the current x, carried by the CG x-update (never sent; D^T D x is not
        #: kept, see ``low_memory``)
        self.carry = None

    def step(self, q, y, rho, alpha=1.0, theta=1.0, v=None, q_norm=None):
        """One x-update (eq. 6); returns the exact ``D_m x_m`` (before any privacy noise).

        ``v`` (with ``q`` and ``y`` None): the target itself, as the central node sends it at
        alpha = 1 (:func:`x_update_target` of the party's last release); ``q_norm`` is then
        ``||q||`` (:func:`target_norm`). z_loc is not formed then (alpha = 1 never reads it). The
        target is clipped here either way (``v_clip``), whatever the central node sent.
        The caller stores what it actually released with :meth:`commit`.
        """
        rho_x = rho / theta
        if v is None:
            x_hat = self.s if alpha == 1.0 else alpha * self.s + (1.0 - alpha) * self.z_loc
            self.z_loc, v = x_update_target(x_hat, q, y, rho, theta, out=self._target_buffers(q, y, x_hat))
        else:
            if alpha != 1.0:
                raise ValueError(f"an x-update target v is only defined at alpha = 1 (got alpha={alpha!r})")
            v = np.array(v, dtype=float)        # the party's own copy (the solver may overwrite it)
        if self.v_clip is not None:
            np.clip(v, -self.v_clip, self.v_clip, out=v)
        # kept for the privacy audit of a private party (its target is clipped; never sent); a
        # non-private party lets it go (M N-vectors less between rounds: 24 MB at 1M x 3)
        self.last_target = v if self.v_clip is not None else None
        # inexact (CG / FISTA-on-D) solvers tie their tolerance to the residual received
        outer = (theta * (vector_norm(q) if q_norm is None else float(q_norm))) if self.solver.inexact else None
        # x is the party's own array (never handed out except by get_state): the CG path
        # updates it in place instead of allocating a new d-vector each round
        self.x = self.solver.solve(v, rho_x, x0=self.x, outer=outer, carry=self.carry,
                                   overwrite_x0=True, overwrite_v=self.last_target is None)
        self.rho_x = float(rho_x)
        self.carry = self.solver.last_carry   # the CG path carries D x: no extra mat-vec
        return self.D @ self.x if self.carry is None else self.carry[0]

    #: the x-update target ``v`` is written into an array the party keeps between rounds from
    #: TARGET_BUFFER_MIN entries (128 KB: smaller ones come from malloc's pools, where the checks
    #: would cost more than they save) up to TARGET_BUFFER_MAX (8 MB): in between a fresh array's
    #: cold writes cost more than the memory (a9a: ~5 us a party a round); above it the party
    #: keeps one N-vector less between rounds
    TARGET_BUFFER_MIN, TARGET_BUFFER_MAX = 1 << 14, 1 << 20

    def _target_buffers(self, q, y, x_hat):
        """``out`` for :func:`x_update_target`: ``(None, v)`` with ``v`` an array the party keeps
        (never handed out: the solver may use it as scratch), z_loc a new array as before (it is
        the party's state, which :meth:`get_state` hands out itself); None (both new) for a private
        party (its clipped target is kept for the privacy audit, ``last_target``), outside
        :data:`TARGET_BUFFER_MIN` .. :data:`TARGET_BUFFER_MAX` entries, and where an input is not a float64 array of the
        release's shape or shares memory with the kept array. Bitwise the same values."""
        if self.v_clip is not None or not self.TARGET_BUFFER_MIN <= self.s.size <= self.TARGET_BUFFER_MAX:
            return None
        shape = self.s.shape
        for a in (q, y, x_hat):
            if not (isinstance(a, np.ndarray) and a.dtype == np.float64 and a.shape == shape):
                return None
        v = self.__dict__.get("_vbuf")
        if v is None or v.shape != shape:
            v = self._vbuf = np.empty(shape)
        if any(np.may_share_memory(v, a) for a in (q, y, x_hat)):
            return None
        return None, v

    def plain_rounds(self):
        """No accelerator extrapolates this run's rounds: the x-update may be looser
        (:meth:`XSolver.plain_rounds`). Called before the first x-update, by the engine and by a
        non-private party's ClientApp alike; never for a private party."""
        self.solver.plain_rounds()

    def eval_release(self, round, rho=None, theta=None, D_eval=None):
        return D_eval @ self.x

    def penalty_value(self):
        return self.solver.penalty.value(self.x)

    # -- state for Flower's context.state (every message is a fresh process on real nodes)
    def get_state(self) -> dict:
        """The party's arrays themselves (no copies): the next step updates x in place, so copy
        them to keep this round's values."""
        state = {"x": self.x, "s": self.s, "z_loc": self.z_loc}
        if self.rho_x is not None:
            state["rho_x"] = np.array([self.rho_x])
        if self.carry is not None:
            state["Dx"] = self.carry[0]
            if self.carry[1] is not None:     # D^T D x: carried unless the solver is low-memory
                state["DtDx"] = self.carry[1]
        state.update(self.solver.cg_state())  # CG's measured rate (the predicted last iteration)
        return state

    def set_state(self, state: dict):
        """Restore :meth:`get_state` (``{}``: the state a run starts from, as far as the solver
        carries any: its measured CG rate is reset, :meth:`XSolver.set_cg_state`)."""
        self.solver.set_cg_state(state)
        for k in ("x", "s", "z_loc"):
            if k in state:    # x is copied: the CG x-update writes into the party's own x
                conv = np.array if k == "x" else np.asarray
                setattr(self, k, conv(state[k], dtype=float).reshape(getattr(self, k).shape))
        if "rho_x" in state:
            self.rho_x = float(np.asarray(state["rho_x"]).ravel()[0])
        if "x" in state:     # the carried D x (and D^T D x) belong to this x (absent: recomputed);
            # a low-memory solver ignores a "DtDx" (it forms D^T D x from D x)
            dtdx = state.get("DtDx") if not self.solver.low_memory else None
            self.carry = None if "Dx" not in state else (
                np.array(state["Dx"], dtype=float).reshape(self.s.shape),
                None if dtdx is None else np.array(dtdx, dtype=float).reshape(self.x.shape))
