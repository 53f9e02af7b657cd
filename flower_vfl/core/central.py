"""The central node's side of ADMM sharing (Algorithm 1, lines 8-12). No Flower imports.

The central node owns the labels, z, y and (optionally) the intercept, which it
solves jointly with z (see ``_z_and_intercept``). Each round it aggregates the parties' s_m and
does the z-update (eq. 7, jointly with the intercept) and y-update (eq. 8) with Boyd's over-relaxation
``a_hat = alpha * sum_m s_m + (1 - alpha) * z`` (alpha = 1 is the paper verbatim).
"""

from __future__ import annotations

import numpy as np

from flower_vfl.core.losses import MultinomialLoss
from flower_vfl.core.multinomial import CENTRAL_RTOL, central_solve
from flower_vfl.core.xsolve import one_blas_thread

__all__ = ["CentralUpdate", "residuals"]


class CentralUpdate:
    """z/y-updates plus the label owner's intercept block.

    Parameters
    ----------
    loss : Loss
    t : ndarray
        Encoded labels, (N,) or (N, K).
    rho, alpha, theta : float
        Penalty, over-relaxation and Jacobi damping (see :mod:`flower_vfl.core.party`).
    """

    def __init__(self, loss, t, rho, alpha=1.0, theta=1.0, fit_intercept=True):
        self.loss = loss
        self.t = t
        self.n = t.shape[0]
        self.rho = float(rho)
        self.alpha = float(alpha)
        self.theta = float(theta)
        self.fit_intercept = fit_intercept
        shape = t.shape if t.ndim == 2 else (self.n,)
        self.z = np.zeros(shape)
        # dual-feasible start: y = grad l(z)/N at z = 0, so the first party round already moves
        self.y = loss.grad(self.z, t) / self.n
        self.q = np.zeros(shape)
        kb = () if t.ndim == 1 else (t.shape[1],)
        self.b = np.zeros(kb)

    def _z_and_intercept(self, a_hat):
        """Joint (z, b) minimization: the intercept is part of the central node's z-block.

        min_{z,b} (1/N) l(z + b) - <y, z> + rho/2 ||a_hat - z||^2. With w = z + b, for fixed b
        the w-problem is eq. (7) at a_hat + b; b solves the scalar (K-vector) equation
        b = mean(w(b)) - mean(a_hat) - sum(y)/(rho N), monotone in b: safeguarded Newton.
        This is Boyd's sharing ADMM with g(u) = min_b l(u + b), so it stays a two-block
        ADMM whose fixed point is the centralized optimum with an unpenalized intercept.
        That holds for convex l only; a nonconvex l goes to :meth:`_intercept_then_z`.
        """
        loss, y, t, rho, n = self.loss, self.y, self.t, self.rho, self.n
        if not loss.convex:
            return self._intercept_then_z(a_hat)
        if loss.n_outputs == 1 and loss.curvature is not None:
            return self._joint_newton(a_hat)
        if isinstance(loss, MultinomialLoss):   # joint (z, b) Newton, O(N K) per iteration
            work = self.__dict__.setdefault("_mn_work", {})
            z, self.b = central_solve(a_hat, y, t, rho, n, self.z, self.b, y_plus=self._dual_for_predictor(),
                                      work=work, rtol=CENTRAL_RTOL)
            return z
        c = a_hat.mean(axis=0) + y.sum(axis=0) / (rho * n)
        b = self.b.copy()
        scale = 1.0 + float(np.max(np.abs(a_hat)))
        w = self.z + self.b
        for _ in range(100):
            w = loss.z_update(a_hat + b, y, t, rho, n, z0=w)
            h = w.mean(axis=0) - b - c           # decreasing in b
            if np.max(np.abs(h)) <= 1e-12 * scale:
                break
            if np.ndim(b) == 0:
                slope = float(np.mean(loss.dz_da(w, t, rho, n))) - 1.0   # in [-1, 0]
                if slope > -1e-12:
                    break   # h is flat in b (piecewise-linear loss): every b is a minimizer
                step = h / slope
                b = b - step
                if abs(step) <= 1e-13 * (1.0 + abs(b)):
                    break
            else:
                J = loss.dz_da_mean(w, t, rho, n) - np.eye(b.shape[0])
                b = b - np.linalg.lstsq(J, h, rcond=1e-10)[0]
        self.b = b
        return loss.z_update(a_hat + b, y, t, rho, n, z0=w) - b

    def _dual_for_predictor(self):
        """T(u)'s dual y_plus of the last solve, or None: that solve left l'(w) = p - t = N y_plus
        to its tolerance (an accelerator may have replaced y since), so p(z + b) = t + N y_plus
        without an exp (multinomial :func:`~flower_vfl.core.multinomial.central_solve`'s
        predictor; rho unchanged since)."""
        y_plus = self.__dict__.get("_y_plus")
        if y_plus is None or self.__dict__.get("_y_plus_rho") != self.rho or y_plus.shape != self.t.shape:
            return None
        return y_plus

    def _intercept_then_z(self, a_hat):
        """Nonconvex l: one Gauss-Seidel sweep, the intercept block first, then z (eq. 7).

        For nonconvex l the joint (z, b) problem is not convex in b for any rho (its Schur
        complement rho * sum_i (l_i''/N) / (l_i''/N + rho) is negative once the samples with
        l'' < 0 dominate), and for
        a bounded l (sigmoid) its infimum can lie at b = +-inf: minimizing it jointly sent b to
        ~28 in round 1 on breast cancer and ADMM stalled on the saturated plateau (every
        l' ~ 0, objective = the minority-class fraction). Here b is its own block, a column of
        ones with no penalty: b = argmin_b b * sum(y) + rho/2 ||a_hat + b - w||^2 with w the
        last z + b (closed form, strongly convex), then the strongly convex z-update at
        a_hat + b. At a fixed point a_hat + b = w, so sum(y) = 0 and y = l'(w)/N: the
        stationary point of the centralized objective with an unpenalized intercept.
        """
        loss, y, t, rho, n = self.loss, self.y, self.t, self.rho, self.n
        w_old = self.z + self.b
        b = np.mean(w_old - a_hat, axis=0) - y.sum(axis=0) / (rho * n)
        w = loss.z_update(a_hat + b, y, t, rho, n, z0=w_old)
        self.b = np.float64(b) if np.ndim(b) == 0 else b
        return w - b

    def _newton_fast(self, a_hat, sy, tol):
        """The fast path of :meth:`_joint_newton` (its docstring); None: take the damped path.

        Predictor (a chord step, no exp): the previous solve left l'(w_prev) = N y_plus to its
        tolerance (y_plus = y + rho q, the dual that step computed), so at the warm start
        w_prev = z + b the new gradient is known without evaluating l: N dF/dw =
        N (y_plus - y) + N rho (z - a), and l''(w_prev) = p (1 - p) with p = -t l'(w_prev)
        (``loss.hess_from_grad``). One bordered step with that Hessian moves w by the round's
        change; the Newton steps after it are short, so the certificate below usually holds
        after one of them (a9a: 1 exp-evaluation a round instead of 2). The predictor only
        chooses the start: the stopping rule is the certificate of a true Newton step.
        """
        loss, y, t, rho, n = self.loss, self.y, self.t, self.rho, self.n
        size = a_hat.shape[0]
        buf = self.__dict__.get("_joint_buf")
        if buf is None or buf[0].shape != (size,):
            # reused across rounds: a fresh N-vector per temporary is page-faulted in again
            buf = [np.empty(size) for _ in range(5)] + [np.empty(size, dtype=np.float32)]
            self._joint_buf = buf
        w, P, E, G, c1, e32 = buf
        nrho = n * rho
        b = float(self.b)
        np.add(self.z, b, out=w)
        # dF/db at the start, sum(y) + rho sum(a + b - w) = sum(y) - rho sum(z - a); after a
        # full (or chord) step it is 0 (F is quadratic in b and the step solves the bordered
        # system's b-row exactly), so it is not recomputed
        np.subtract(self.z, a_hat, out=G)
        gb = sy - rho * float(G.sum())
        y_plus = self.__dict__.get("_y_plus")
        hfg = getattr(loss, "hess_from_grad", None)
        m_pred = None
        if y_plus is not None and hfg is not None and self.__dict__.get("_y_plus_rho") == rho:
            G *= nrho
            if y_plus is not y:                      # Anderson moved y after the last step
                np.subtract(y_plus, y, out=P)
                P *= n
                G += P                               # G = N dF/dw at w_prev, no exp
            hfg(y_plus, t, n, out=(P, E), third=c1)  # E = l''(w_prev), c1 = the third derivative
            s, sg = _bordered(E, G, nrho, n, P)
            if s > 0.0:
                db = -(gb + rho * sg) / (rho * s)
                np.subtract(nrho * db, G, out=G)
                G *= P
                w += G
                b += db
                gb = 0.0
                m_pred = max(float(G.max()), -float(G.min()))
                if CUBIC_PREDICTOR and m_pred <= CUBIC_MAX_STEP:
                    # the chord step's residual to second order, N dF/dw = l3 dw^2 / 2 (its
                    # first-order terms cancel; F is quadratic in b), taken out by a second
                    # step with the same bordered Hessian: the start is O(dw^3) from the root,
                    # not O(dw^2). Still no exp; only the start moves
                    np.multiply(G, G, out=E)
                    E *= c1
                    E *= 0.5
                    db2 = -float(np.dot(E, P)) / s
                    np.subtract(nrho * db2, E, out=E)
                    E *= P
                    w += E
                    b += db2
        np.multiply(a_hat, nrho, out=c1)
        np.add(c1, np.multiply(y, n, out=G), out=c1)     # c1 = N y + N rho a
        k2 = loss.curvature3 / (2.0 * n * rho)
        m_prev = np.inf
        # the size of the last step, the predictor's first: from a start it moved by at most
        # F32_ABOVE the first Newton step is exact and may certify at once, as after any short
        # step (a9a 40 rounds: 97 -> 76 exp-evaluations; breast cancer 3 x 10, 60 rounds: 141 -> 119)
        last = np.inf if m_pred is None else m_pred
        far, dec_far = 0, np.inf
        single = F32_STEPS and getattr(loss, "grad_hess_f32", False)
        for _ in range(12 + FAR_STEPS):
            # a step from a start farther than F32_ABOVE: its derivatives from a float32 exp
            # (those of a point within ~6e-8 |u| + 2.5e-7 of w); every step after is exact, and
            # only those certify
            rough = single and last > F32_ABOVE
            loss.grad_hess(w, t, out=(P, E), neg=True, f32=e32 if rough else None)  # P = -l'(w), E = l''(w)
            np.multiply(w, nrho, out=G)
            G -= c1
            G -= P
            G -= nrho * b                            # G = N * dF/dw
            s, sg = _bordered(E, G, nrho, n, P)      # P = 1/D, D = N * d2F/dw2
            if not s > S_MIN:                       # (nearly) every sample saturated: b ill-posed here
                return None
            db = -(gb + rho * sg) / (rho * s)
            gb_step, gb = gb, 0.0
            np.subtract(nrho * db, G, out=G)
            G *= P                                   # dw
            w += G
            b += db
            m = max(float(G.max()), -float(G.min()))
            if not (np.isfinite(m) and np.isfinite(b)):
                return None
            if not m <= 0.5 * m_prev:
                # not shrinking: far from the root. Full Newton steps still converge from there as
                # a rule (a9a's rounds 1-2: every step of the damped path below was a full one),
                # so up to FAR_STEPS such steps are taken while the Newton decrement
                # lambda^2 = dw^T H dw = -(grad . dw) falls from one to the next; otherwise
                # (oscillation) the damped path runs from the same start
                dec = _decrement(G, P, E, nrho, db, n, gb_step)
                if far >= FAR_STEPS or not dec < dec_far:
                    return None
                far, dec_far = far + 1, dec
            if not rough and _certified(G, m, k2, n, s, tol):
                self.b = np.float64(b)
                return np.subtract(w, b, out=self._z_buffer(size))
            m_prev = last = m
        return None

    def _z_buffer(self, size):
        """The array the new z is written into: of two kept arrays, the one that is not the
        current z (still needed this round as z_old). A fresh N-vector each round is page-faulted
        in again (a9a: ~60 us of the round); a z restored from a checkpoint is never written."""
        bufs = self.__dict__.get("_z_bufs")
        if bufs is None or bufs[0].shape != (size,):
            bufs = self._z_bufs = [np.empty(size), np.empty(size)]
        return bufs[1] if bufs[0] is self.z else bufs[0]

    def _joint_newton(self, a_hat, max_iter=50, tol=1e-13):
        """Newton on F(w, b) = (1/N) sum l(w) - <y, w> + b sum(y) + rho/2 ||a + b - w||^2.

        The Hessian is diagonal plus one border row/column (b), so each step costs O(N)
        through the Schur complement. Returns z = w - b and sets self.b.

        Fast path (losses with ``grad_hess`` and a bound ``curvature3`` on |l'''|, i.e.
        logistic): plain Newton steps from the warm start, in place in reused N-vectors.
        After a full step (dw, db) the b-gradient is exactly 0 (F is quadratic in b) and the
        w-gradient is R_i = (l'(w_i + dw_i) - l'(w_i) - l''(w_i) dw_i)/N, |R_i| <= c3/(2N) dw_i^2.
        The remaining error is H^-1 R; with the bordered structure, |e_b| <= sum|R_i| / schur
        and |e_w,i| <= |R_i|/rho + |e_b|, so with m = max|dw| the error in z = w - b is at most
        c3/(2N) (m^2 + 4 sum dw_i^2 / S)/rho <= c3/(2N) m^2 (1 + 4N/S)/rho, S = schur/rho (a
        factor 2 of slack for the Hessian moving along the step). The iteration stops when the
        right-hand bound is below ``tol`` or, when only its b-term misses, the middle one (one
        dot; :func:`_certified`): no confirming extra iteration, no evaluation of F. A step that
        fails to halve the previous one (far from the root) is kept while the Newton decrement
        falls from one such step to the next, up to :data:`FAR_STEPS` of them (a9a's first
        rounds: 2-4 such steps a fit, where the damped path evaluated F ~9 times a round); if it rises
        (Newton oscillating on this sigmoid-shaped gradient), the steps run out or a value is
        not finite, the damped Newton below runs from the same start.

        Damped path (every other convex scalar loss, and the fallback): backtracking on F
        keeps it globally convergent.
        """
        loss, y, t, rho, n = self.loss, self.y, self.t, self.rho, self.n
        sy = float(y.sum())
        if getattr(loss, "curvature3", None) is not None and hasattr(loss, "grad_hess") and \
                np.ndim(a_hat) == 1:
            z = self._newton_fast(a_hat, sy, tol)
            if z is not None:
                return z
        w, b = self.z + self.b, float(self.b)

        def F(w, b):
            r = a_hat + b - w
            # einsum, not BLAS dots: 2-thread OpenBLAS stalled N-vector dots under load
            return float(np.sum(loss.value(w, t)) / n - _dot(y, w) + b * sy + 0.5 * rho * _dot(r, r))

        f = F(w, b)
        for _ in range(max_iter):
            r = a_hat + b - w
            g = loss.grad(w, t) / n - y - rho * r
            gb = sy + rho * r.sum()
            d = loss.hess(w, t) / n + rho
            schur = rho * n - rho * rho * float(np.sum(1.0 / d))
            schur = max(schur, 1e-300)
            db = -(gb + rho * float(np.sum(g / d))) / schur
            dw = (-g + rho * db) / d
            dec = -(_dot(g, dw) + gb * db)       # Newton decrement^2 (>= 0)
            if np.max(np.abs(dw)) <= 1e-13 * (1.0 + np.max(np.abs(w))):
                w, b = w + dw, b + db
                break
            if dec <= 1e-10 * (1.0 + abs(f)):
                # quadratic-convergence region: F differences are at round-off, take full steps
                w, b = w + dw, b + db
                f = F(w, b)
                continue
            step = 1.0
            while True:
                f_new = F(w + step * dw, b + step * db)
                if f_new <= f - 1e-4 * step * dec or step < 1e-10:
                    break
                step *= 0.5
            w, b, f = w + step * dw, b + step * db, f_new
        self.b = np.float64(b)
        return w - b

    def step(self, s_sum):
        """Given sum_m s_m, update z (with the intercept) and y (eq. 7, 8).

        Returns (primal residual norm, dual residual norm) at the new iterate.
        """
        # few N-vector temporaries: at a9a's N each one costs an mmap and page faults
        # (benchmarks/bench_round.py); the arithmetic is the same as the textbook form. The
        # N-vector dots run on one BLAS thread (xsolve.one_blas_thread: 2 OpenBLAS threads
        # stalled them under load; einsum's own loop is ~3x slower than 1-thread BLAS)
        with one_blas_thread():
            return self._step(s_sum)

    def _step(self, s_sum):
        relaxed = self.alpha != 1.0
        a_hat = self.alpha * s_sum + (1.0 - self.alpha) * self.z if relaxed else s_sum
        z_old = self.z
        if self.fit_intercept:
            self.z = self._z_and_intercept(a_hat)
        else:
            self.z = self.loss.z_update(a_hat, self.y, self.t, self.rho, self.n, z0=self.z)
        q = a_hat - self.z
        y = np.multiply(q, self.rho)
        y += self.y
        self.y, self.q = y, q
        # T(u)'s dual: l'(z + b) = N y_plus at the solution, the next z-update's predictor
        # (an accelerator may replace self.y; this reference keeps T(u)'s)
        self._y_plus, self._y_plus_rho = y, self.rho
        r = _norm1(s_sum - self.z) if relaxed else _norm1(q)
        d = self.rho * _norm1(np.subtract(self.z, z_old, out=self._scratch_like(self.z, z_old)))
        return r, d

    def _scratch_like(self, *arrays):
        """A free N-vector of the fast z-update's work arrays for a temporary of ``arrays``' shape
        (they are free between its calls; a new array each round is written cold), or None (a new
        one) when there is none of that shape or it could share memory with them."""
        buf = self.__dict__.get("_joint_buf")
        if buf is None or buf[3].size < 1 << 14:          # small: malloc's pools, no cold pages
            return None
        g = buf[3]
        if any(not isinstance(a, np.ndarray) or a.shape != g.shape or np.may_share_memory(g, a) for a in arrays):
            return None
        return g

    def set_rho(self, rho):
        # y is the unscaled dual, so it stays valid when rho changes (Boyd 3.4.1)
        self.rho = float(rho)

    def get_state(self):
        return {"z": self.z, "y": self.y, "q": self.q, "b": np.atleast_1d(self.b)}

    def predictor_state(self) -> dict:
        """Arrays to checkpoint beside z, y, q, b so that a resumed run's next z-update starts
        from the same predictor (bitwise the same iterates): T(u)'s dual y_plus when an
        accelerator replaced y (else it is y itself) and the rho it was computed with."""
        y_plus = self.__dict__.get("_y_plus")
        if y_plus is None:
            return {}
        out = {"zp_rho": np.array([self._y_plus_rho])}
        if y_plus is not self.y:
            out["zp_y_plus"] = y_plus
        return out

    def set_predictor_state(self, arrays):
        """Restore :meth:`predictor_state` (after z, y, q, b); absent keys: no predictor."""
        if "zp_rho" not in arrays:
            self._y_plus = None
            return
        self._y_plus_rho = float(np.asarray(arrays["zp_rho"]).ravel()[0])
        self._y_plus = np.asarray(arrays["zp_y_plus"], dtype=float) if "zp_y_plus" in arrays else self.y


#: the fast z-update's Newton steps from a start whose last step (the first one's: the predictor's
#: chord step, or none) moved some entry by more than F32_ABOVE take e^u in float32
#: (``grad_hess(f32=)``); the steps after are float64 and certify
F32_STEPS = True
F32_ABOVE = 1e-2

#: the chord predictor's second step (l3 dw^2 / 2 taken out with the same Hessian, no exp), when
#: the chord step moved no entry by more than CUBIC_MAX_STEP (beyond it the Taylor term is no
#: guide: a9a's first rounds move w by 5-30). a9a 33 rounds: 147 -> 137 grad_hess (L1), 17 rounds
#: L2 58 -> 51; breast cancer L1 100 rounds 279 -> 232; 1M x 3 (chord steps 0.6-4): 30 -> 29
CUBIC_PREDICTOR = True
CUBIC_MAX_STEP = 1.0

#: full Newton steps the fast z-update takes while they do not halve (far from the root), each
#: with a smaller Newton decrement than the one before (:meth:`CentralUpdate._newton_fast`)
FAR_STEPS = 6

#: the fast z-update leaves to the damped path a step whose Schur sum s = sum h/D (the samples'
#: share of curvature in the b-direction) is below this: there a full Newton step moves b by
#: ~1/s, and a noisy release (a private party's s~, sigma >> its clip) once took b to 2.8e32 in
#: one step, "certified" by a gradient that had lost every digit. Normal runs stay far above it
#: (breast cancer at lam 1e-8: 0.095; a9a: 1.6e4)
S_MIN = 1e-6


def _decrement(dw, P, scratch, nrho, db, n, gb) -> float:
    """The Newton decrement lambda^2 = -(dF/dw . dw + dF/db db) of the step (dw, db) just taken,
    from dw alone: the step solved N dF/dw = nrho db - D dw (D = 1/P), so
    N dF/dw . dw = nrho db sum(dw) - sum(dw^2 / P). ``scratch`` is overwritten."""
    np.multiply(dw, dw, out=scratch)
    scratch /= P
    gdw = (nrho * db * float(dw.sum()) - float(scratch.sum())) / n
    return -(gdw + gb * db)


def _certified(dw, m, k2, n, s, tol) -> bool:
    """The fast z-update's stopping rule after a full Newton step ``dw`` (m = max|dw|, k2 =
    c3/(2 N rho), s = schur/rho): the error bound k2 (m^2 + 4 sum dw_i^2 / s) <= tol
    (:meth:`CentralUpdate._joint_newton`). First with sum dw_i^2 <= N m^2 (no pass over dw);
    only when that misses by its b-term alone, with sum dw_i^2 itself (one read-only dot)."""
    e2 = k2 * m * m
    if e2 * (1.0 + 4.0 * n / s) <= tol:
        return True
    return e2 <= tol and k2 * (m * m + 4.0 * float(np.dot(dw, dw)) / s) <= tol


def _bordered(h, G, nrho, n, out):
    """1/D into ``out`` (D = h + N rho, the w-block of N * Hessian; ``h`` is overwritten when
    the Schur sum needs it), and (s, sg) = (schur / rho = sum h / D, sum G / D)."""
    np.add(h, nrho, out=out)
    np.divide(1.0, out, out=out)
    s = n - nrho * float(out.sum())
    if s < 1e-3 * n:                                 # cancellation: sum h / D directly
        np.multiply(h, out, out=h)
        s = float(h.sum())
    return s, float(np.dot(G, out))


def _dot(a, b) -> float:
    return float(np.einsum("i,i->", a, b))


def _norm1(v) -> float:
    """Euclidean norm by BLAS; call inside :func:`one_blas_thread` (1-thread dot 5.7 us at
    a9a's N, einsum 15.7 us, 2-thread OpenBLAS under load up to ~1 ms)."""
    v = np.ravel(v)
    return float(np.sqrt(np.dot(v, v)))


def residuals(r, d, s_sum, z, y, tol, tol_abs):
    """Boyd et al. (2011) Sec. 3.3.1 stopping rule; returns (eps_pri, eps_dual)."""
    sqrt_n = np.sqrt(z.size)
    with one_blas_thread():
        eps_pri = sqrt_n * tol_abs + tol * max(_norm1(s_sum), _norm1(z))
        eps_dual = sqrt_n * tol_abs + tol * _norm1(y)
    return eps_pri, eps_dual
