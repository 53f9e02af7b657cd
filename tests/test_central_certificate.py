"""The fast z-update's stopping rule (core/central.py ``_certified``, session 32): the error bound
k2 (m^2 + 4 sum dw_i^2 / s) <= tol, tried with sum dw_i^2 <= N m^2 first and with sum dw_i^2
itself only when that misses by its b-term alone.

- the rule against its formula: it holds where the max-based bound holds, it holds on the
  sum-based bound when only the b-term misses, never when k2 m^2 alone exceeds tol;
- over rounds whose releases move and settle (a new rho in between), every z-update is the
  solution of eq. (7) with the intercept to 1e-12 (a reference Newton iterated to round-off),
  also in the rounds that stopped on the sum-based bound (some do, checked).
"""

import numpy as np

from flower_vfl.core import central as central_mod
from flower_vfl.core.central import CentralUpdate
from flower_vfl.core.losses import LogisticLoss


def test_rule_against_its_formula():
    n, s, tol = 1000, 500.0, 1e-13
    k2 = 1.0
    one_big = np.zeros(n)
    one_big[3] = 2e-7                       # sum dw^2 = m^2, far below N m^2
    m = 2e-7
    assert k2 * m * m * (1.0 + 4.0 * n / s) > tol          # the max-based bound misses ...
    assert k2 * (m * m + 4.0 * m * m / s) <= tol           # ... the sum-based one holds
    assert central_mod._certified(one_big, m, k2, n, s, tol)
    flat = np.full(n, m)                                   # sum dw^2 = N m^2: the same bound
    assert not central_mod._certified(flat, m, k2, n, s, tol)
    small = np.full(n, 1e-9)
    assert central_mod._certified(small, 1e-9, k2, n, s, tol)
    big = np.zeros(n)
    big[0] = 1e-6                                          # k2 m^2 = 1e-12 > tol: never
    assert not central_mod._certified(big, 1e-6, k2, n, s, tol)


def _reference_z(c, a_hat, y, iters=60):
    """Eq. (7) with the intercept by bordered Newton from the solution's neighbourhood, iterated
    to round-off (no stopping rule): (z, b)."""
    loss, t, rho, n = c.loss, c.t, c.rho, c.n
    w, b = c.z + c.b, float(c.b)       # the fast path's own result: the reference polishes it
    sy = float(y.sum())
    for _ in range(iters):
        g = loss.grad(w, t) / n - y - rho * (a_hat + b - w)
        gb = sy + rho * float(np.sum(a_hat + b - w))
        d = loss.hess(w, t) / n + rho
        schur = rho * n - rho * rho * float(np.sum(1.0 / d))
        db = -(gb + rho * float(np.sum(g / d))) / schur
        w = w + (-g + rho * db) / d
        b = b + db
    return w - b, b


def test_every_z_update_meets_the_tolerance(monkeypatch):
    calls = {"max": 0, "sum": 0}
    rule = central_mod._certified

    def spy(dw, m, k2, n, s, tol):
        ok = rule(dw, m, k2, n, s, tol)
        if ok:
            calls["max" if k2 * m * m * (1.0 + 4.0 * n / s) <= tol else "sum"] += 1
        return ok

    monkeypatch.setattr(central_mod, "_certified", spy)
    n = 20000
    rng = np.random.default_rng(3)
    t = np.where(rng.random(n) < 0.4, -1.0, 1.0)
    c = CentralUpdate(LogisticLoss(), t, 0.05 / n, alpha=1.0, theta=1.0)
    a = rng.normal(size=n)
    for k in range(30):
        a = a + rng.normal(scale=0.5 / (k + 1) ** 2, size=n)     # the releases move, then settle
        if k == 15:
            c.set_rho(2.0 * c.rho)
        y_before = c.y.copy()
        c.step(a)
        # the reference starts from this round's solution and must stay there
        saved = c.y
        c.y = y_before
        z_ref, b_ref = _reference_z(c, a, y_before)
        c.y = saved
        scale = 1.0 + float(np.max(np.abs(z_ref)))
        assert np.max(np.abs(c.z - z_ref)) <= 1e-12 * scale
        assert abs(float(c.b) - b_ref) <= 1e-12 * scale
    assert calls["max"] > 0 and calls["sum"] > 0, calls
