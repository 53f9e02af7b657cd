"""Losses l and their z-update (paper eq. 7), vectorized over samples.

Objective convention (documented in docs/math.md):

    (1/N) * sum_i l_i(z_i)   with   z = sum_m D_m x_m + b.

The central node's z-update (eq. 7) is separable per sample:

    z_i = argmin_z  (1/N) l_i(z) - y_i z + rho/2 (z - a_i)^2,

where ``a = sum_m s_m`` is the aggregated prediction.  Every loss below solves
this for all samples at once (closed form or a vectorized safeguarded Newton
iteration); no Python loop over samples.  No Flower imports here.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, softmax

from flower_vfl.core.loss_base import Loss, check_binary, newton_1d  # noqa: F401  (re-exported)

__all__ = ["Loss", "LogisticLoss", "SquaredLoss", "HingeLoss", "MultinomialLoss",
           "SigmoidLoss", "SoftLabelLogisticLoss", "get_loss", "loss_class", "LOSSES"]


class LogisticLoss(Loss):
    """l(z) = log(1 + exp(-t z)), t in {-1, +1} (0/1 labels are mapped to -1/+1)."""

    name = "logistic"
    curvature = 0.25
    has_proba = True
    supports_label_dp = True
    #: max |l'''| = 1/(6 sqrt(3)): bounds the error left after a Newton step (see z_update)
    curvature3 = 1.0 / (6.0 * np.sqrt(3.0))
    #: ``grad_hess`` takes ``f32=`` (a float32 exp for the central node's first Newton steps)
    grad_hess_f32 = True

    def encode_labels(self, y):
        return check_binary(y, self.name)

    def value(self, z, t):
        # log(1 + e^-u) = max(-u, 0) + log1p(e^-|u|), u = t z: numpy's SIMD exp/log1p, 8x faster
        # than scipy's log_expit at a9a's N (the per-round objective was a third of a round)
        u = np.multiply(t, z)
        out = np.abs(u)
        np.negative(out, out=out)
        np.exp(out, out=out)
        np.log1p(out, out=out)
        np.minimum(u, 0.0, out=u)
        np.subtract(out, u, out=out)
        return out

    #: rows of the product reduction in :meth:`mean` (a product of 64 factors in [1, 2]
    #: cannot overflow; its relative rounding is <= 64 eps)
    _PROD_ROWS = 64

    #: :meth:`mean` takes ``overwrite_z`` (the round driver's own sum of the releases)
    mean_overwrites = True

    def mean(self, z, t, overwrite_z=False):
        """(1/N) sum log(1 + e^-u), u = t z, as sum max(-u, 0) + sum log1p(e^-|u|) with
        sum max(-u, 0) = (sum |u| - sum u) / 2 and the log1p terms summed as the logs of
        products of 64 factors 1 + e^-|u| (in [1, 2]): one log per 64 samples. 11 N-vector
        passes instead of 17 (log1p alone cost 6; -|u| in one, ``copysign``, and sum |u| as
        -sum(-|u|), the same pairwise sum negated); the per-round objective of the engine and
        the strategy's train loss. Agrees with ``value(z, t).mean()`` to ~1e-16 relative.
        ``overwrite_z``: a 1-D float64 ``z`` is the work array (no N-vector allocated)."""
        own = (overwrite_z and isinstance(z, np.ndarray) and z.ndim == 1 and z.dtype == np.float64
               and np.shape(t) == z.shape)
        u = np.multiply(t, z, out=z if own else None)
        if u.ndim != 1:
            return float(np.mean(self.value(z, t)))
        su = float(u.sum())
        np.copysign(u, -1.0, out=u)          # -|u|
        sa = -float(u.sum())
        np.exp(u, out=u)
        u += 1.0
        r = self._PROD_ROWS
        k = (u.size // r) * r
        lp = float(np.log(np.multiply.reduce(u[:k].reshape(r, -1), axis=0)).sum()) if k else 0.0
        if k < u.size:
            lp += float(np.log(u[k:]).sum())
        return (lp + 0.5 * (sa - su)) / u.size

    def grad(self, z, t):
        """-t sigmoid(-t z) = -t / (1 + e^{t z}) with numpy's SIMD exp (scipy's expit took
        ~5.6 ns an entry, 46 ms at 1M rows); t z capped at 700 as in :meth:`grad_hess`, whose
        l' this is bitwise, in one array and without the Hessian's passes."""
        g = np.multiply(t, z, dtype=float)
        if g.max() > 700.0:
            np.minimum(g, 700.0, out=g)
        np.exp(g, out=g)                    # e^u
        g += 1.0
        np.divide(1.0, g, out=g)            # p
        g *= t
        return np.negative(g, out=g)        # l' = -t p

    def hess(self, z, t):
        p = expit(z)
        return p * (1.0 - p)

    def grad_hess(self, z, t, out=None, neg=False, f32=None):
        """(l'(z), l''(z)) from one exp, written into ``out`` = (g, h) if given; with ``neg``
        g = -l'(z) = t p (one pass fewer).

        With u = t z and p = sigmoid(-u) = 1/(1 + e^u): l' = -t p and l'' = e^u p^2 (no
        cancellation). u is capped at 700, beyond which p < 1e-304.

        ``f32`` (a float32 array of z's shape): e^u in single precision (numpy's SIMD exp, ~4x
        numpy's float64 exp here), the rest in float64. u is rounded to float32 (|du| <= 6e-8 |u|)
        and float32's exp errs by a few 6e-8 relative, i.e. moves u by that: l' and l'' are those
        of a point within ~6e-8 |u| + 2.5e-7 of each z, not exact.
        For the central node's first Newton steps only, never for a certified one. u is capped
        at 88 there (float32's exp overflows above ~88.7; p < 1e-38, as good as 0 for a step).
        """
        g, h = (np.empty_like(z), np.empty_like(z)) if out is None else out
        np.multiply(t, z, out=h)
        if f32 is not None:
            np.minimum(h, 88.0, out=h)
            f32[...] = h
            np.exp(f32, out=f32)
            h[...] = f32                    # e^u, to single precision
        else:
            if h.max() > 700.0:
                np.minimum(h, 700.0, out=h)
            np.exp(h, out=h)                # e^u
        np.add(h, 1.0, out=g)
        np.divide(1.0, g, out=g)            # p
        np.multiply(h, g, out=h)
        np.multiply(h, g, out=h)            # l'' = e^u p^2
        np.multiply(g, t, out=g)
        if not neg:
            np.negative(g, out=g)           # l' = -t p
        return g, h

    def hess_from_grad(self, y, t, n, out, third=None):
        """l''(z) = p (1 - p) from a known l'(z) = n y (p = -t l'(z) = sigmoid(-t z)), no exp:
        the central node's z-update predictor (core/central.py). ``out`` = (scratch, h). With
        ``third`` (an array) also the third derivative t (2p - 1) p (1 - p) into it
        (dp/dz = -t p (1 - p))."""
        p, h = out
        np.multiply(t, y, out=p)
        p *= -float(n)
        np.subtract(1.0, p, out=h)
        h *= p
        if third is not None:
            np.multiply(p, 2.0, out=third)
            third -= 1.0
            third *= h
            third *= t
        return h

    def _buffers(self, size, count):
        """Scratch N-vectors reused across calls (allocating fresh ones every round is what
        costs: each new ~N*8-byte array is page-faulted in again). Not re-entrant: one loss
        instance serves one sequential ADMM run (engine / ServerApp)."""
        ws = self.__dict__.get("_ws")
        if ws is None or ws[0].shape != (size,) or len(ws) < count:
            ws = [np.empty(size) for _ in range(count)]
            self._ws = ws
        return ws

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_ws", None)
        return state

    def z_update(self, a, y, t, rho, n, z0=None, max_iter=50, tol=1e-13):
        """Eq. (7) for all samples by Newton in the margin u = t z, one exp per iteration.

        n t phi'(z) = G(u) = n rho u - K - p with K = n t (y + rho a) and p = sigmoid(-u):
        increasing, G' = n rho + e^u p^2 in [n rho, n rho + 1/4], |G''| <= c3 = curvature3,
        G convex for u < 0 and concave for u > 0, and the root lies in [K, K + 1] / (n rho).

        Convergence: from the warm start (z0 = last round's z) an entry is kept if Newton is
        certain to converge from it, i.e. c3 |s| <= G'/2 for its first step s (Kantorovich), or
        it lies on the side where Newton is monotone (G > 0 with u <= 0, G < 0 with u >= 0);
        any other entry restarts at the inflection point u = 0 (clipped into the bracket), from
        where Newton is monotone. So Newton converges for every entry (no 2-cycles).
        Stop: after a Newton step s the remaining error is at most c3 / (2 n rho) s^2 (Taylor),
        so the iteration stops as soon as that bound is below ``tol`` for every entry, without
        a further confirming iteration; warm-started on a9a this takes 3-4 iterations. Entries
        not certified after ``max_iter`` iterations (or NaN) go to the bracketed
        :func:`newton_1d`.
        """
        a = np.asarray(a, dtype=float)
        size = a.shape[0]
        u, E, p, G, K = self._buffers(size, 5)
        nrho = n * rho
        c3 = self.curvature3
        np.multiply(a, nrho, out=K)
        np.add(K, np.multiply(y, n, out=G), out=K)
        np.multiply(K, t, out=K)                              # K = n t (y + rho a)
        if z0 is None:
            np.divide(y, rho, out=u)
            np.add(u, a, out=u)
            np.multiply(u, t, out=u)
        else:
            np.multiply(z0, t, out=u)
        np.divide(K, nrho, out=E)
        np.maximum(u, E, out=u)
        np.add(E, 1.0 / nrho, out=E)
        np.minimum(u, E, out=u)                               # start inside the root's bracket
        smax = np.sqrt(tol * 2.0 * nrho / c3)                 # |step| <= smax: error <= tol
        for it in range(max_iter):
            if u.max() > 700.0:
                np.minimum(u, 700.0, out=E)
                np.exp(E, out=E)
            else:
                np.exp(u, out=E)                              # e^u
            np.add(E, 1.0, out=p)
            np.divide(1.0, p, out=p)                          # p = sigmoid(-u)
            np.multiply(u, nrho, out=G)
            np.subtract(G, K, out=G)
            np.subtract(G, p, out=G)                          # G(u)
            np.multiply(E, p, out=E)
            np.multiply(E, p, out=E)
            np.add(E, nrho, out=E)                            # G'(u)
            np.divide(G, E, out=G)                            # Newton step
            restart = None
            if it == 0:
                np.abs(G, out=p)
                np.multiply(E, 0.5 / c3, out=E)
                np.subtract(p, E, out=p)                      # > 0: Kantorovich test fails
                if p.max() > 0.0:
                    far = np.flatnonzero(p > 0.0)
                    sf, uf = G[far], u[far]
                    restart = far[~(((sf > 0) & (uf <= 0)) | ((sf < 0) & (uf >= 0)))]
            np.subtract(u, G, out=u)
            if restart is not None and restart.size:
                lo = K[restart] / nrho
                u[restart] = np.clip(0.0, lo, lo + 1.0 / nrho)
                G[restart] = np.inf                           # not certified by this step
            m = max(G.max(), -G.min())
            if m <= smax:
                return t * u
            if m != m:
                break
        z = t * u
        bad = np.flatnonzero(~(np.abs(G) <= smax))
        tb = t[bad]
        zb = np.where(np.isfinite(z[bad]), z[bad], a[bad] + y[bad] / rho)
        z[bad] = newton_1d(a[bad], y[bad], rho, n, lambda v: self.grad(v, tb),
                            lambda v: self.hess(v, tb), zb, tol=tol)
        return z

    def predict(self, f):
        return np.where(f >= 0, 1, -1)

    def predict_proba(self, f):
        p = expit(f)
        return np.column_stack([1 - p, p])


class SoftLabelLogisticLoss(Loss):
    """l(z) = log(1 + e^z) - t z, a soft label t in [0, 1] per sample (the cross-entropy to t).

    The moment route's pool objective (docs/privacy_parties.md): every pool row carries the soft
    label pi (the training labels' mean). Not in :data:`LOSSES` (no run config names it). For
    t in {0, 1} it is :class:`LogisticLoss` with labels -1 / +1; its z-update (eq. 7) is
    LogisticLoss's for label -1, log(1 + e^z), with the linear term -t z moved into the dual
    (y + t / n), so the same certified Newton solves it.
    """

    name = "logistic_soft"
    curvature = 0.25
    label_kind = "soft"
    has_proba = True

    def __init__(self):
        self._hard = LogisticLoss()

    def encode_labels(self, y):
        t = np.asarray(y, dtype=float)
        if t.ndim != 1 or not np.all((t >= 0.0) & (t <= 1.0)):
            raise ValueError("soft labels must be a 1-D array of values in [0, 1]")
        return t

    def value(self, z, t):
        return np.logaddexp(0.0, z) - t * z

    def grad(self, z, t):
        return expit(z) - t

    def hess(self, z, t):
        p = expit(z)
        return p * (1.0 - p)

    def z_update(self, a, y, t, rho, n, z0=None):
        minus = np.full(np.shape(a), -1.0)
        return self._hard.z_update(a, np.asarray(y, float) + np.asarray(t, float) / n, minus, rho, n, z0=z0)

    def predict(self, f):
        return np.where(f >= 0, 1, -1)

    def predict_proba(self, f):
        p = expit(f)
        return np.column_stack([1 - p, p])


class SigmoidLoss(Loss):
    """Smooth nonconvex loss l(z) = 1 / (1 + exp(t z)) = sigmoid(-t z) (a smoothed 0-1 loss).

    |l''| <= 1/(6*sqrt(3)) < 0.0963, so the z-subproblem is strongly convex once
    rho > 0.0963 / N (Assumption 1.2a); :meth:`z_update` checks it. The convergence theory
    (Assumption 1.2c) needs rho > 2 * 0.0963 / N; the default is 3 * 0.0963 / N.
    With an intercept the central node updates it as its own block before z (see
    ``CentralUpdate._intercept_then_z``).
    """

    name = "sigmoid"
    curvature = 0.0963
    convex = False

    def encode_labels(self, y):
        return check_binary(y, self.name)

    def value(self, z, t):
        return expit(-t * z)

    def grad(self, z, t):
        p = expit(-t * z)
        return -t * p * (1 - p)

    def hess(self, z, t):
        p = expit(-t * z)
        return p * (1 - p) * (1 - 2 * p)

    def z_update(self, a, y, t, rho, n, z0=None):
        if rho <= self.curvature / n:
            raise ValueError(
                f"rho={rho:g} is too small for the nonconvex sigmoid loss: the z-update needs "
                f"rho > {self.curvature / n:.3g} (= 0.0963/N) to be strongly convex")
        return newton_1d(a, y, rho, n, lambda z: self.grad(z, t), lambda z: self.hess(z, t),
                          a + y / rho if z0 is None else z0)

    def predict(self, f):
        return np.where(f >= 0, 1, -1)


class SquaredLoss(Loss):
    """l(z) = 1/2 (z - t)^2 (regression). Closed-form z-update."""

    name = "squared"
    curvature = 1.0
    label_kind = "real"

    def encode_labels(self, y):
        y = np.asarray(y, dtype=float)
        if y.ndim != 1:
            raise ValueError(f"y must be 1-D for loss='squared'; got shape {y.shape}")
        return y

    def value(self, z, t):
        return 0.5 * (z - t) ** 2

    def grad(self, z, t):
        return z - t

    def hess(self, z, t):
        return np.ones_like(z)

    def z_update(self, a, y, t, rho, n, z0=None):
        # (z - t)/n - y + rho (z - a) = 0
        return (t / n + y + rho * a) / (1.0 / n + rho)


class HingeLoss(Loss):
    """l(z) = max(0, 1 - t z). Closed-form prox z-update."""

    name = "hinge"

    def encode_labels(self, y):
        return check_binary(y, self.name)

    def value(self, z, t):
        return np.maximum(0.0, 1.0 - t * z)

    def grad(self, z, t):  # a subgradient
        return np.where(t * z < 1.0, -t, 0.0)

    def dz_da(self, z, t, rho, n):
        # the prox is the identity shifted, except on the kink (t z == 1) where it is flat
        return np.where(np.abs(t * z - 1.0) <= 1e-12, 0.0, 1.0)

    def z_update(self, a, y, t, rho, n, z0=None):
        # minimize (1/n) max(0, 1 - t z) + rho/2 (z - v)^2 with v = a + y/rho; in u = t z:
        # prox of (1/(n rho)) max(0, 1 - u) at w = t v.
        v = a + y / rho
        w = t * v
        k = 1.0 / (n * rho)
        u = np.where(w >= 1.0, w, np.where(w <= 1.0 - k, w + k, 1.0))
        return t * u

    def predict(self, f):
        return np.where(f >= 0, 1, -1)


class MultinomialLoss(Loss):
    """Softmax cross-entropy over K classes; z, s_m and y are N x K; labels 0..K-1.

    z-update: per sample a strictly convex K-dimensional problem, solved by a
    vectorized damped Newton iteration (batched K x K solves).
    """

    name = "multinomial"
    curvature = 0.5
    convex = True
    label_kind = "classes"
    multiclass = True
    has_proba = True
    supports_private_parties = False

    def __init__(self):
        self.classes_ = None

    @property
    def n_outputs(self):
        return 1 if self.classes_ is None else len(self.classes_)

    def encode_labels(self, y):
        y = np.asarray(y)
        if y.ndim != 1:
            raise ValueError(f"y must be 1-D class labels for loss='multinomial'; got shape {y.shape}")
        if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
            raise ValueError("y contains NaN or inf")
        classes, idx = np.unique(y, return_inverse=True)
        if classes.size < 2:
            raise ValueError(f"loss='multinomial' needs at least 2 classes; got {classes.tolist()}")
        self.classes_ = classes
        onehot = np.zeros((y.size, classes.size))
        onehot[np.arange(y.size), idx] = 1.0
        return onehot

    def value(self, z, t):
        from flower_vfl.core.multinomial import softmax_lse      # no axis-1 max/sum: see core/multinomial.py
        return softmax_lse(z)[1] - np.einsum("ij,ij->i", z, t)

    def mean(self, z, t):
        return float(np.mean(self.value(z, t)))

    def grad(self, z, t):
        return softmax(z, axis=1) - t

    def z_update(self, a, y, t, rho, n, z0=None, max_iter=50, tol=1e-13):
        """Eq. (7) per sample: Newton with Sherman-Morrison solves (core/multinomial.py)."""
        from flower_vfl.core.multinomial import multinomial_newton
        w0 = a + y / rho if z0 is None else z0
        return multinomial_newton(a, y, t, rho, n, w0, np.zeros(a.shape[1]), fit_b=False,
                                  max_iter=max_iter, tol=tol)[0]

    def _z_update_batched(self, a, y, t, rho, n, z0=None, max_iter=50, tol=1e-13):
        """The previous batched K x K Newton with per-sample line search (reference in tests)."""
        z = a + y / rho if z0 is None else z0.copy()
        K = z.shape[1]
        eye = np.eye(K)
        for _ in range(max_iter):
            p = softmax(z, axis=1)
            g = (p - t) / n - y + rho * (z - a)
            H = (p[:, :, None] * eye - p[:, :, None] * p[:, None, :]) / n + rho * eye
            step = np.linalg.solve(H, g[:, :, None])[:, :, 0]
            # damping keeps the iteration monotone far from the optimum; near it Newton is exact
            phi0 = self._phi(z, a, y, t, rho, n)
            alpha = np.ones(z.shape[0])
            for _ in range(30):
                z_try = z - alpha[:, None] * step
                bad = self._phi(z_try, a, y, t, rho, n) > phi0 + 1e-15 * (1 + np.abs(phi0))
                if not bad.any():
                    break
                alpha = np.where(bad, alpha * 0.5, alpha)
            z = z - alpha[:, None] * step
            if np.max(np.abs(alpha[:, None] * step)) <= tol * (1 + np.max(np.abs(z))):
                break
        return z

    def dz_da_mean(self, z, t, rho, n):
        """Mean over samples of the K x K Jacobian of the z-update w.r.t. a."""
        p = softmax(z, axis=1)
        K = z.shape[1]
        H = (p[:, :, None] * np.eye(K) - p[:, :, None] * p[:, None, :]) / n + rho * np.eye(K)
        return rho * np.linalg.inv(H).mean(axis=0)

    def _phi(self, z, a, y, t, rho, n):
        return self.value(z, t) / n - np.sum(y * z, axis=1) + 0.5 * rho * np.sum((z - a) ** 2, axis=1)

    def predict(self, f):
        return self.classes_[np.argmax(f, axis=1)]

    def predict_proba(self, f):
        return softmax(f, axis=1)


LOSSES = {"logistic": LogisticLoss, "squared": SquaredLoss, "hinge": HingeLoss,
          "multinomial": MultinomialLoss, "sigmoid": SigmoidLoss}


def loss_class(loss) -> type[Loss] | None:
    """The class of a loss given by name (:data:`LOSSES`, or 'logistic_rr') or as an object, to
    read what it supports (``label_kind``, ``multiclass``, ``has_proba``, ``supports_label_dp``,
    ``supports_private_parties``: :class:`~flower_vfl.core.loss_base.Loss`); None for a name
    that is not registered."""
    if isinstance(loss, Loss):
        return type(loss)
    if loss == "logistic_rr":
        from flower_vfl.core.label_noise import ForwardCorrectedLogistic
        return ForwardCorrectedLogistic
    return LOSSES.get(loss) if isinstance(loss, str) else None


def get_loss(loss) -> Loss:
    """Return a fresh Loss instance for a name (or pass an instance through)."""
    if isinstance(loss, Loss):
        return loss
    if loss == "logistic_rr":   # label-noise-corrected logistic (lazy: scipy.optimize only when asked)
        from flower_vfl.core.label_noise import ForwardCorrectedLogistic
        return ForwardCorrectedLogistic()
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r} is not supported; choose one of {sorted(LOSSES)}")
    return LOSSES[loss]()
