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


def _far_start_problem(n=3000, seed=5, rho_n=0.05):
    """Round 1 of an imbalanced logistic problem (as a9a's first rounds): z = 0, y = l'(0)/N
    (sum(y) != 0, so the intercept moves by ~sum(y)/(rho N)), a = first releases spread over
    several logits (here 2 steps of the fast path do not halve)."""
    rng = np.random.default_rng(seed)
    t = np.where(rng.random(n) < 0.24, 1.0, -1.0)
    loss = LogisticLoss()
    c = CentralUpdate(loss, t, rho_n / n)
    a_hat = rng.normal(size=n) * 4.0 - 0.5 * t
    return c, a_hat


def test_far_start_takes_full_newton_steps_and_ends_at_the_damped_solution(monkeypatch):
    """From a far start the fast z-update used to give up after the first step that did not halve
    and ran the damped Newton (backtracking on F, ~4 transcendental passes an iteration). It now
    goes on with full steps while the Newton decrement falls (at most FAR_STEPS of them): here it
    finishes without the damped path, and its z and b equal the damped path's (forced by
    FAR_STEPS = 0) and the reference's to 1e-12."""
    used = {"damped": 0, "far": 0}
    fast = CentralUpdate._newton_fast

    def spy(self, *a):
        z = fast(self, *a)
        used["damped"] += z is None
        return z
    monkeypatch.setattr(CentralUpdate, "_newton_fast", spy)
    dec = central_mod._decrement

    def count(*a):
        used["far"] += 1
        return dec(*a)
    monkeypatch.setattr(central_mod, "_decrement", count)
    c, a_hat = _far_start_problem()
    y0 = c.y.copy()
    c.step(a_hat)
    assert used == {"damped": 0, "far": used["far"]} and used["far"] >= 1    # far steps, no damped path
    z_ref, b_ref = _reference_z(c, a_hat, y0)
    scale = 1.0 + np.max(np.abs(z_ref))
    assert np.max(np.abs(c.z - z_ref)) <= 1e-12 * scale and abs(float(c.b) - b_ref) <= 1e-12 * (1 + abs(b_ref))

    monkeypatch.setattr(central_mod, "FAR_STEPS", 0)
    d, _ = _far_start_problem()
    d.step(a_hat)
    assert used["damped"] == 1                                  # the old behaviour: damped path
    assert np.max(np.abs(d.z - c.z)) <= 1e-12 * scale and abs(float(d.b) - float(c.b)) <= 1e-12 * (1 + abs(b_ref))


def test_decrement_is_the_dense_formula():
    """_decrement(dw, P, ...) = -(grad_w F . dw + dF/db db) with grad_w F = (nrho db - dw / P)/N."""
    rng = np.random.default_rng(0)
    n = 50
    dw, P = rng.normal(size=n), rng.random(n) + 0.1
    nrho, db, gb = 0.3, -0.7, 0.2
    grad = (nrho * db - dw / P) / n
    want = -(float(grad @ dw) + gb * db)
    assert abs(central_mod._decrement(dw, P, np.empty(n), nrho, db, n, gb) - want) <= 1e-14 * (1 + abs(want))
