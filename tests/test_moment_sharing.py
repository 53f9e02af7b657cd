"""The moment route's math as ADMM sharing (flower_vfl/core/moment_sharing.py, the soft-label loss
in flower_vfl/core/losses.py), against closed forms and the in-process Newton solver."""

import numpy as np
import pytest

from flower_vfl.core.losses import LogisticLoss, SoftLabelLogisticLoss
from flower_vfl.core.moment_sharing import MomentXUpdate, moment_sharing_admm, sharing_target
from flower_vfl.core.scoring import normalize_rows
from flower_vfl.estimator.moment_route import solve_moment_logistic
from flower_vfl.io.data import labels, party_block
from flower_vfl.privacy.ssp import cross_fit_halves


def test_soft_label_loss_is_logistic_at_hard_labels_and_its_z_update_is_the_minimizer():
    rng = np.random.default_rng(0)
    z, a, y = rng.normal(size=50), rng.normal(size=50), rng.normal(size=50) * 0.01
    soft, hard = SoftLabelLogisticLoss(), LogisticLoss()
    for lab in (0.0, 1.0):
        t = np.full(50, lab)
        np.testing.assert_allclose(soft.value(z, t), hard.value(z, np.full(50, 2 * lab - 1)), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(soft.grad(z, t), hard.grad(z, np.full(50, 2 * lab - 1)), rtol=1e-12, atol=1e-14)
    t, n, rho = np.full(50, 0.24), 50, 0.3
    w = soft.z_update(a, y, t, rho, n)
    # stationarity of (1/n) l(w) - y w + rho/2 (w - a)^2
    np.testing.assert_allclose(soft.grad(w, t) / n - y + rho * (w - a), 0.0, atol=1e-12)
    with pytest.raises(ValueError, match="soft labels"):
        soft.encode_labels([0.2, 1.5])


def test_x_update_solves_its_normal_equations_with_centred_columns():
    rng = np.random.default_rng(1)
    P = normalize_rows(rng.normal(size=(40, 6)) + 1.0)
    h, c, lam, rho = rng.normal(size=6), rng.normal(size=40), 0.05, 0.7
    upd = MomentXUpdate(P, h, lam)
    x = upd.solve(c, rho)
    Pc = P - P.mean(axis=0)
    np.testing.assert_allclose((lam * np.eye(6) + rho * Pc.T @ Pc) @ x, rho * Pc.T @ c + h, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(upd.scores(x), Pc @ x, atol=1e-12)
    np.testing.assert_allclose(sharing_target(np.ones(3), np.full(3, 2.0), np.full(3, 4.0), 2.0, 0.5),
                               1 - 0.5 * 2 - 4 * 0.5 / 2, atol=0)


@pytest.mark.parametrize("dataset, lam", [("breast_cancer", 1e-2), ("a9a", 3e-4)])
def test_admm_sharing_reaches_the_newton_minimizer(dataset, lam):
    """The rounds of the Flower route, in process, on a noise-free moment: within 1e-8 of
    solve_moment_logistic (a9a: 8,140 pool rows, ~60 rounds with Anderson and centred columns)."""
    blocks = [party_block(dataset, m, 2) for m in range(2)]
    y, _ = labels(dataset)
    t = (y == np.unique(y)[1]).astype(float)
    pi = float(t.mean())
    h = [np.asarray(normalize_rows(D).T @ (t - pi)).ravel() / t.size for D, _ in blocks]
    pool = [normalize_rows(Dt[cross_fit_halves(Dt.shape[0])[0]]) for _, Dt in blocks]
    xs_ref, b_ref = solve_moment_logistic(pool, h, pi, lam)
    xs, b, rounds = moment_sharing_admm(pool, h, pi, lam, tol=1e-10, max_rounds=300)
    assert max(float(np.max(np.abs(a - r))) for a, r in zip(xs, xs_ref)) <= 1e-8 and abs(b - b_ref) <= 1e-8
    assert rounds <= 100, rounds


def test_pool_rounds_run_the_round_driver_with_the_change_rule():
    """The pool rounds are core.rounds.RoundDriver's (stop='change'): each row's max_change is
    max_m max |s_m^k - s_m^(k-1)| and |b^k - b^(k-1)| (s^0 = 0, b^0 = 0), and the run stops at the
    first round k > 1 where it is below tol."""
    from flower_vfl.core.moment_sharing import PoolExchange, pool_driver
    from flower_vfl.core.rounds import RoundDriver
    blocks = [party_block("breast_cancer", m, 2) for m in range(2)]
    y, _ = labels("breast_cancer")
    t = (y == np.unique(y)[1]).astype(float)
    pi = float(t.mean())
    h = [np.asarray(normalize_rows(D).T @ (t - pi)).ravel() / t.size for D, _ in blocks]
    pool = [normalize_rows(Dt[cross_fit_halves(Dt.shape[0])[0]]) for _, Dt in blocks]
    ups = [MomentXUpdate(P, hm, 1e-2) for P, hm in zip(pool, h)]

    class InProcess(PoolExchange):
        def release(self, k, targets):
            return {m: u.scores(u.solve(targets[m], self.rho_x)) for m, u in enumerate(ups)}

    tol = 1e-7
    driver = pool_driver(pool[0].shape[0], pi, 1e-3, 2, 300, tol)
    ex = InProcess(driver.central)
    seen = [([np.zeros(pool[0].shape[0])] * 2, 0.0)]
    driver.run(ex, on_round=lambda k, row, *_: seen.append(([ex.s[0].copy(), ex.s[1].copy()], float(driver.central.b))))
    changes = [max(max(float(np.max(np.abs(a - o))) for a, o in zip(s, s_old)), abs(b - b_old))
               for (s, b), (s_old, b_old) in zip(seen[1:], seen[:-1])]
    assert [r["max_change"] for r in driver.history] == changes
    assert changes[-1] < tol and all(c >= tol for c in changes[1:-1]) and 2 < len(changes) < 300
    with pytest.raises(ValueError, match="stop='boyd'; choose one of 'residual', 'change'"):
        RoundDriver(driver.central, 2, stop="boyd")
