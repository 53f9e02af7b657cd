"""Both parties private at epsilon = 1 near the non-private model (issue 21 item 3): the moment route.

Each party releases once g~_m = D_m^T v + N(0, sigma^2 I) (flower_vfl/privacy/label_moments.py);
the joint logistic model is fitted on unlabelled pool rows (flower_vfl/estimator/moment_route.py).
Checked against independent references: the sensitivity against a neighbour search, the ledger's
epsilon against dp-accounting's own Gaussian computations, the solver against scikit-learn's L2
logistic regression (noise-free moment, the training rows as the pool), and the route's accuracy
and log-loss on a9a (fixed seed) against the goal of the issue.
"""

import dp_accounting
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from flower_vfl.estimator.moment_route import MomentMatchingLogistic, solve_moment_logistic
from flower_vfl.privacy.boundary import InvalidMessage
from flower_vfl.privacy.label_moments import MomentParty, moment_sensitivity
from flower_vfl.privacy.party import PlanExceeded, PrivacyConfig, ReplayRefused


@pytest.mark.parametrize("c_v", [0.5, 1.5])
def test_moment_sensitivity_bounds_every_neighbour_and_is_tight(c_v):
    """||D^T v - D'^T v|| <= 2 c_v for one replaced row (norm <= 1), v fixed; the opposite row attains it.

    The statistic is the party's own (MomentParty.statistic, rows normalized and v clipped by the
    party): a target 100x over the clip does not raise the change.
    """
    rng = np.random.default_rng(0)
    n, d = 40, 6
    C = moment_sensitivity(c_v)
    assert C == pytest.approx(2 * c_v)
    D = rng.normal(size=(n, d))
    v = 100 * c_v * rng.choice([-1.0, 1.0], size=n)               # the server sends far over the clip
    cfg = PrivacyConfig(epsilon=1.0, delta=1e-5, c_v=c_v)
    base = MomentParty(D, cfg).statistic(v)
    worst = 0.0
    for k in range(120):
        D2 = D.copy()
        r = rng.random()
        b = rng.normal(size=d) if r < 0.4 else (-D[0] + 0.2 * rng.normal(size=d) if r < 0.8 else -D[0])
        D2[0] = b * (1.0 if k % 5 else 1e-3)                      # some near-zero rows (norm < 1 after normalizing)
        worst = max(worst, np.linalg.norm(MomentParty(D2, cfg).statistic(v) - base))
    assert worst <= C * (1 + 1e-12)
    assert worst >= C * (1 - 1e-9)                                  # -D[0] exactly: the bound is attained


def test_ledger_epsilon_matches_dp_accounting_and_the_release_is_replayed_and_planned():
    rng = np.random.default_rng(1)
    D = rng.normal(size=(500, 4))
    v = rng.choice([-0.25, 0.75], size=500)
    cfg = PrivacyConfig(epsilon=1.0, delta=1e-5, c_v=0.75, seed=7)
    p = MomentParty(D, cfg, party_id=3)
    assert p.sigma == pytest.approx(p.z * 1.5)
    g1 = p.release(1, v)
    # independent: dp-accounting's analytic Gaussian epsilon and its PLD accountant, at the party's z
    ref = float(dp_accounting.get_epsilon_gaussian(p.z, 1e-5))
    pld = dp_accounting.pld.PLDAccountant().compose(dp_accounting.GaussianDpEvent(p.z)).get_epsilon(1e-5)
    assert p.ledger.spent() == pytest.approx(ref, rel=1e-6)
    assert p.ledger.spent() == pytest.approx(1.0, rel=2e-3) and p.ledger.spent() <= 1.0 + 1e-9
    assert pld == pytest.approx(ref, rel=5e-3) and pld >= ref * (1 - 1e-9)   # PLD is pessimistic
    rep = p.report()
    assert [e["kind"] for e in rep["ledger"]["entries"]] == ["eval"]
    assert rep["ledger"]["entries"][0]["sensitivity"] == pytest.approx(1.5)
    # the noise is the stated Gaussian: g~ - D^T v over many parties' draws has sd sigma
    diffs = [MomentParty(D, PrivacyConfig(epsilon=1.0, delta=1e-5, c_v=0.75, seed=s)).release(1, v)
             - p.statistic(v) for s in range(100)]
    assert np.std(diffs) == pytest.approx(p.sigma, rel=0.1)
    assert np.array_equal(p.release(1, v), g1)                      # identical re-send: stored answer
    with pytest.raises(ReplayRefused, match="another target"):
        p.release(1, v[::-1].copy())
    with pytest.raises(PlanExceeded, match="one release per run"):
        p.release(2, v)
    with pytest.raises(InvalidMessage, match="shape"):
        MomentParty(D, cfg, party_id=4).release(1, v[:10])
    assert len(p.ledger.entries) == 1
    with pytest.raises(ValueError, match="train_rounds=0, eval_rounds=1"):
        MomentParty(D, PrivacyConfig(train_rounds=2), party_id=5)


def test_noise_free_moment_on_the_training_rows_is_l2_logistic_regression():
    """With g = D^T (t - pi) exact and the training rows as the pool, the minimizer is scikit-learn's fit."""
    rng = np.random.default_rng(2)
    n = 3000
    blocks = [rng.normal(size=(n, 4)), rng.normal(size=(n, 3))]
    blocks = [b / np.linalg.norm(b, axis=1, keepdims=True) for b in blocks]
    X = np.hstack(blocks)
    t = (rng.random(n) < 1 / (1 + np.exp(-(X @ rng.normal(size=7) * 3 - 1)))).astype(float)
    pi, lam = t.mean(), 1e-3
    xs, b = solve_moment_logistic(blocks, [B.T @ (t - pi) / n for B in blocks], pi, lam)
    sk = LogisticRegression(C=1 / (n * lam), tol=1e-12, max_iter=10_000).fit(X, t)
    assert np.allclose(np.r_[xs[0], xs[1]], sk.coef_.ravel(), atol=2e-5)
    assert b == pytest.approx(float(sk.intercept_[0]), abs=2e-5)


@pytest.fixture(scope="module")
def a9a():
    from flower_vfl.io.data import column_ranges, load_all

    X, y, Xt, yt = load_all("a9a")
    cols = column_ranges("a9a", X.shape[1], 2)
    return ([X[:, a:b].tocsr() for a, b in cols], y, [Xt[:, a:b].tocsr() for a, b in cols], yt)


def test_both_private_at_epsilon_1_reach_the_goal_on_a9a(a9a):
    """a9a, both parties private at epsilon = 1 (delta = 1e-5, strict: each adds its whole noise),
    seed 0, the test set cross-fitted as the pool: accuracy >= 0.845 and log-loss <= 0.335, the
    goal of issue 21 item 3 (measured on seeds 0-2: 0.8492 / 0.3282, 0.8493 / 0.3282, 0.8480 / 0.3283);
    each ledger spends at most its budget."""
    B, y, Bt, yt = a9a
    perm = np.random.default_rng(12345).permutation(yt.size)
    halves = (np.sort(perm[: yt.size // 2]), np.sort(perm[yt.size // 2:]))
    cfg = PrivacyConfig(epsilon=1.0, delta=1e-5, c_v=1.0)
    m = MomentMatchingLogistic([cfg, cfg], lam=3e-4, random_state=0).fit(B, y, [b[halves[0]] for b in Bt])
    f = np.empty(yt.size)
    f[halves[1]] = m.decision_function([b[halves[1]] for b in Bt])
    m.refit([b[halves[1]] for b in Bt])                              # free: the same releases, other pool
    f[halves[0]] = m.decision_function([b[halves[0]] for b in Bt])
    acc = float(np.mean(np.where(f >= 0, 1, -1) == yt))
    ll = float(np.mean(np.logaddexp(0.0, -yt * f)))
    assert acc >= 0.845 and ll <= 0.335, (acc, ll)
    assert all(p.ledger.spent() <= 1.0 + 1e-9 and len(p.ledger.entries) == 1 for p in m._parties)
