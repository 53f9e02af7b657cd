"""The private party: enforced assumptions, noise statistics, replay, budget refusal, audit."""

import numpy as np
import pytest
from scipy import stats

from flower_vfl import VerticalADMM
from flower_vfl.privacy import BudgetExceeded, epsilon_spent
from flower_vfl.estimator.audit import audit_private_run
from flower_vfl.privacy.party import PlanExceeded, PrivacyConfig, PrivateParty, ReplayRefused, normalize_rows
from flower_vfl.privacy.sensitivity import strict_sensitivity


@pytest.fixture(scope="module")
def block():
    rng = np.random.default_rng(3)
    D = rng.normal(size=(2000, 6))
    return D, rng


def _party(D, **kw):
    cfg = dict(epsilon=2.0, delta=1e-5, train_rounds=4, eval_rounds=1, b1=3.0, c_v=2.0, c_s=2.0, seed=11)
    cfg.update(kw)
    return PrivateParty(D, D[:50], lam=1e-2, config=PrivacyConfig(**cfg), party_id=1, n_parties=2)


def test_noise_is_gaussian_with_calibrated_sigma(block):
    D, rng = block
    p = _party(D)
    q, y = rng.normal(size=2000), rng.normal(size=2000) * 1e-3
    s_tilde = p.train_release(1, q, y, rho=1e-3, theta=0.5)
    exact = np.clip(p.D @ p.x, -2.0, 2.0)
    sigma = p.ledger.entries[0].sigma
    assert sigma == pytest.approx(p.z * strict_sensitivity(2e-3, 1e-2, 3.0, 2.0, 2.0), rel=1e-12)
    # KS test of the standardized noise against N(0, 1) at significance 0.001
    assert stats.kstest((s_tilde - exact) / sigma, "norm").pvalue > 1e-3


def test_noise_independent_across_rounds_and_parties(block):
    D, rng = block
    a, b = _party(D, seed=5), _party(D, seed=5)
    b.party_id = 2
    b.mechanism = type(b.mechanism)(1.0, 2, seed=5)
    n1 = a.mechanism.output_noise(1, "train", (20000,))
    n2 = a.mechanism.output_noise(2, "train", (20000,))
    m1 = b.mechanism.output_noise(1, "train", (20000,))
    bound = 4 / np.sqrt(20000)    # |r| of independent N(0,1) samples exceeds this with p < 1e-4
    assert abs(np.corrcoef(n1, n2)[0, 1]) < bound
    assert abs(np.corrcoef(n1, m1)[0, 1]) < bound


def test_replay_identical_inputs_same_vector_other_inputs_refused(block):
    D, rng = block
    p = _party(D)
    q, y = rng.normal(size=2000), np.zeros(2000)
    first = p.train_release(1, q, y, rho=1e-3)
    spent = p.ledger.spent()
    again = p.train_release(1, q, y, rho=1e-3)            # an identical re-send
    assert np.array_equal(first, again)
    with pytest.raises(ReplayRefused, match="already answered the train request of round 1 with other inputs"):
        p.train_release(1, q * 5, y, rho=1e-3)             # crafted inputs for an answered round
    p.train_release(3, q, y, rho=1e-3)
    with pytest.raises(ReplayRefused, match="round numbers must increase"):
        p.train_release(2, q, y, rho=1e-3)                 # an older, never answered round
    assert len(p.ledger.entries) == 2 and p.ledger.spent() > spent


def test_party_refuses_once_budget_is_spent(block):
    """Plan per kind within a run; the budget across runs on the same data (one store)."""
    from flower_vfl.privacy.store import PartyStore
    D, rng = block
    store = PartyStore(":memory:")
    p = PrivateParty(D, D[:50], 1e-2, PrivacyConfig(epsilon=2.0, train_rounds=3, eval_rounds=0, b1=3.0,
                                                     c_v=2.0, c_s=2.0), party_id=1, store=store, run="a")
    q, y = rng.normal(size=2000), np.zeros(2000)
    for k in range(1, 4):
        p.train_release(k, q, y, rho=1e-3)
    assert p.ledger.spent() == pytest.approx(2.0, rel=1e-3)
    with pytest.raises(PlanExceeded, match="allows 3 train release"):
        p.train_release(4, q, y, rho=1e-3)                 # the server asks anyway
    with pytest.raises(PlanExceeded, match="allows 0 eval release"):
        p.eval_release(5, rho=1e-3)                        # an evaluation allowance is not a training one
    p2 = PrivateParty(D, D[:50], 1e-2, p.config, party_id=1, store=store, run="b")   # a new run
    with pytest.raises(BudgetExceeded, match="budget"):
        p2.train_release(1, q, y, rho=1e-3)
    assert len(p2.ledger.entries) == 3


def test_reported_epsilon_comes_from_the_accountant(block):
    D, rng = block
    p = _party(D)
    for k in range(1, 5):
        p.train_release(k, rng.normal(size=2000), np.zeros(2000), rho=1e-3)
    p.eval_release(5, rho=1e-3)
    z = p.ledger.entries[0].noise_multiplier
    assert p.report()["totals"]["exact"] == pytest.approx(epsilon_spent(z, 5, 1e-5, "exact"), rel=1e-9)
    assert p.report()["totals"]["exact"] <= 2.0 + 1e-6


def test_malicious_server_cannot_raise_what_is_released(block):
    D, rng = block
    p = _party(D)
    huge = 1e9 * rng.normal(size=2000)
    p.train_release(1, huge, huge, rho=1e-3)
    assert np.linalg.norm(p.x) <= 3.0 * (1 + 1e-9)                 # x stays in its ball
    assert np.all(np.abs(p.update.last_target) <= 2.0)              # target clipped
    assert np.allclose(np.linalg.norm(p.D, axis=1), 1.0)            # rows normalized


def test_normalize_rows_sparse_matches_dense():
    import scipy.sparse as sp
    A = np.array([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]])
    assert np.allclose(normalize_rows(sp.csr_matrix(A)).toarray(), normalize_rows(A))
    assert np.allclose(normalize_rows(A)[0], [0.6, 0.8]) and np.allclose(normalize_rows(A)[1], 0)


def test_private_config_errors():
    with pytest.raises(ValueError, match="calibration"):
        PrivacyConfig(calibration="loose").validate()
    with pytest.raises(ValueError, match="delta"):
        PrivacyConfig(delta=2).validate()
    with pytest.raises(ValueError, match="lam > 0"):
        PrivateParty(np.ones((4, 2)), None, 0.0, PrivacyConfig())
    with pytest.raises(ValueError, match="penalty='l2'"):
        VerticalADMM(penalty="l1", privacy=[PrivacyConfig(), None]).fit(
            [np.eye(4), np.eye(4)], [1, -1, 1, -1])


def _ill_conditioned(rng, n=400):
    base = rng.normal(size=(n, 3))
    D = np.hstack([base, base @ rng.normal(size=(3, 5)) + 1e-3 * rng.normal(size=(n, 5))])
    y = np.where(D[:, 0] + rng.normal(size=n) > 0, 1, -1)
    return [D[:, :4], D[:, 4:]], y


def test_audit_finds_no_violation_of_strict_on_ill_conditioned_data():
    blocks, y = _ill_conditioned(np.random.default_rng(1))
    cfg = PrivacyConfig(epsilon=1, train_rounds=5, b1=5, c_v=2, c_s=2, seed=0)
    for party in (0, 1):
        res = audit_private_run(blocks, y, party, 1e-3, [cfg, cfg], rounds=3, n_random=10, n_climb=15)
        assert 0.05 < res.max_ratio < 1.0          # a real gap was found, below the bound
        assert res.max_param_ratio < 1.0


@pytest.mark.slow
def test_audit_strict_on_a9a_and_paper_violations():
    from pathlib import Path
    from sklearn.datasets import load_svmlight_file
    path = Path(__file__).resolve().parents[2] / "shared" / "data" / "a9a" / "a9a"
    X, y = load_svmlight_file(str(path), n_features=123)
    X = X.tocsc()
    B = [X[:, :66].tocsr(), X[:, 66:].tocsr()]
    idx = np.random.default_rng(0).choice(B[0].shape[0], 3000, replace=False)
    B, y = [b[idx] for b in B], y[idx]
    cfg = PrivacyConfig(epsilon=1, train_rounds=5, b1=5, c_v=2, c_s=2, seed=0)
    res = audit_private_run(B, y, 1, 1e-4, [None, cfg], rounds=3, n_random=10, n_climb=15)
    assert res.max_ratio < 1.0 and res.max_param_ratio < 1.0
    # Lemma 1 at the paper's operating point (rho = 1): neighbours exceed its C
    pcfg = PrivacyConfig(epsilon=1, train_rounds=5, b1=5, c_v=2, c_s=2, seed=0, calibration="paper")
    res = audit_private_run(B, y, 1, 1e-4, [None, pcfg], rounds=3, relation="paper", rho=1.0,
                            variant="paper", n_random=10, n_climb=15)
    assert res.max_ratio > 1.0


# ----------------------------------------------------------- the warm-started protocol
def test_private_schedule_phases():
    from flower_vfl.estimator.engine import private_schedule

    assert private_schedule([False, False], 30, []) == [(30, [True, True], True)]
    # warm start by the non-private side (stopping rule on), then the smallest private plan
    assert private_schedule([False, True, True], 30, [4, 2]) == \
        [(30, [True, False, False], True), (2, [True, True, True], False)]
    assert private_schedule([True, True], 10, [0, 0]) == [(10, [False, False], True), (0, [True, True], False)]


def test_config_needs_at_least_one_release():
    with pytest.raises(ValueError, match=r"train_rounds \+ eval_rounds must be >= 1"):
        PrivacyConfig(train_rounds=0, eval_rounds=0).validate()
    with pytest.raises(ValueError, match=r"lam must be a finite number > 0 or None; got lam=-1"):
        PrivacyConfig(lam=-1).validate()
    with pytest.raises(ValueError, match=r"train_rounds must be >= 0; got train_rounds=-2"):
        PrivacyConfig(train_rounds=-2).validate()


def test_eval_sensitivity_uses_the_rho_that_produced_x(block):
    """A server that asks for the evaluation with a smaller rho cannot shrink the noise."""
    from flower_vfl.privacy.sensitivity import strict_param_sensitivity

    D, rng = block
    p = _party(D, train_rounds=0, eval_rounds=1)
    p.final_update(np.zeros(2000), rng.normal(size=2000) * 1e-4, rho=1e-3, theta=0.5)
    p.eval_release(1, rho=1e-9, theta=0.5)
    e = p.ledger.entries[0]
    assert e.kind == "eval"
    assert e.sensitivity == pytest.approx(strict_param_sensitivity(2e-3, 1e-2, 3.0, 2.0), rel=1e-12)
    assert p.x_released.shape == (6,) and p.eval_release(2).shape == (50,)
    assert len(p.ledger.entries) == 1                      # later scoring is free


def test_party_lam_overrides_the_run_lam(block):
    D, _ = block
    p = PrivateParty(D, None, lam=1e-4, config=PrivacyConfig(lam=3e-3), party_id=0)
    assert p.lam == p.solver.lam == 3e-3


@pytest.fixture(scope="module")
def a9a():
    from sklearn.linear_model import LogisticRegression

    from flower_vfl.io.data import column_ranges, load_all

    X, y, Xt, yt = load_all("a9a")
    cols = column_ranges("a9a", X.shape[1], 2)
    B, Bt = [X[:, a:b].tocsr() for a, b in cols], [Xt[:, a:b].tocsr() for a, b in cols]
    # the reference line: party 1 alone, same objective (lam/2 ||w||^2, free intercept)
    p1 = LogisticRegression(C=1 / (y.size * 1e-4), tol=1e-10, max_iter=5000).fit(B[0], y)
    f1 = p1.decision_function(Bt[0])
    return B, y, Bt, yt, np.mean(np.sign(f1) == yt), np.mean(np.logaddexp(0, -yt * f1))


@pytest.mark.parametrize("eps", [0.25, 1.0])
def test_private_party2_beats_party1_alone_on_a9a(a9a, eps):
    """Issue #3's utility goal, with a stated margin: party 2 private (sample-level, strict,
    delta=1e-5, exact accountant) adds accuracy and lowers log-loss over party 1 alone.

    Over 3 noise draws the spread is ~0.001 in accuracy (simulations/privacy_utility.py), so a
    margin of 0.004 is > 4 sd; settings are those the simulation selects on a validation split.
    """
    B, y, Bt, yt, p1_acc, p1_ll = a9a
    n = y.size
    accs, lls = [], []
    for seed in range(3):
        cfg = PrivacyConfig(epsilon=eps, delta=1e-5, train_rounds=0, eval_rounds=1, b1=2.0,
                            c_v=1 / (2 * 0.05), c_s=1.0, lam=3e-3, seed=seed)
        m = VerticalADMM(lam=1e-4, rho=0.05 / n, max_rounds=40, tol=1e-5, privacy=[None, cfg]).fit(B, y)
        f = m.decision_function(Bt)
        accs.append(np.mean(np.sign(f) == yt))
        lls.append(np.mean(np.logaddexp(0, -yt * f)))
        rep = m.privacy_report()[0]
        assert [e["kind"] for e in rep["ledger"]["entries"]] == ["eval"]   # no training release
        assert rep["totals"]["exact"] == pytest.approx(eps, rel=1e-4)
        assert not np.any(m._parties[1].s)          # the server never got a training value of party 2
    assert p1_acc == pytest.approx(0.8376, abs=5e-4) and p1_ll == pytest.approx(0.3493, abs=5e-4)
    assert np.mean(accs) >= p1_acc + 0.004
    assert np.mean(lls) <= p1_ll - 0.01


def test_evaluation_noise_is_gaussian_in_parameter_space(block):
    """x~ = x + N(0, sigma_e^2 I), drawn once per model: 200 models (fresh OS entropy each) x 6
    coordinates, standardized, pass a KS test against N(0, 1) at significance 1e-6 (OS entropy, no
    seed: the test must not fail by chance in CI), and consecutive models are uncorrelated
    (|r| < 5/sqrt(n), 5 sd, false-alarm rate 6e-7). Each model costs exactly
    its budget once, however many predictions follow."""
    D, rng = block
    y = rng.normal(size=2000) * 1e-4
    zs = []
    for _ in range(200):
        p = _party(D, train_rounds=0, eval_rounds=1, seed=None)
        p.final_update(np.zeros(2000), y, rho=1e-3, theta=0.5)
        first = p.eval_release(1, rho=1e-3, theta=0.5, D_eval=np.eye(6))
        again = [p.predict(np.eye(6)) for _ in range(3)] + [p.eval_release(2, D_eval=np.eye(6))]
        assert all(np.array_equal(first, a) for a in again)
        zs.append((p.x_released - p.x) / p.ledger.entries[0].sigma)
        assert len(p.ledger.entries) == 1
    z = np.array(zs)
    assert stats.kstest(z.ravel(), "norm").pvalue > 1e-6
    r = np.corrcoef(z[:-1].ravel(), z[1:].ravel())[0, 1]
    assert abs(r) < 5 / np.sqrt(z[1:].size)
    assert p.ledger.totals()["exact"] == pytest.approx(2.0, rel=1e-6)   # the whole budget, no more


def test_a_resume_over_another_view_of_the_party_is_refused_by_name(block):
    """A server that presents a plan's token (a resume) while showing the party another block than
    the plan was made on (another num-parties: other columns) gets a refusal naming the cause and the
    fix, nothing released, not a raw reshape error."""
    from flower_vfl.privacy.party import PlanViewChanged
    from flower_vfl.privacy.store import PartyStore
    D, rng = block
    store = PartyStore(":memory:")
    cfg = PrivacyConfig(epsilon=2.0, train_rounds=3, eval_rounds=0, b1=3.0, c_v=2.0, c_s=2.0)
    p = PrivateParty(D, D[:50], 1e-2, cfg, party_id=1, store=store, run="a")
    plan, _ = p.admit()
    q, y = rng.normal(size=2000), np.zeros(2000)
    p.train_release(1, q, y, rho=1e-3)
    made = len(p.ledger.entries)
    other = PrivateParty(D[:, :4], D[:50, :4], 1e-2, cfg, party_id=1, store=store, run="b")
    with pytest.raises(PlanViewChanged) as err:
        other.admit(token=plan.token)
    assert err.value.code == "plan"
    assert str(err.value) == (
        f"party 1 refuses to continue plan {plan.plan}: that plan's iterate x has {D.shape[1]} entries, this "
        f"run's block gives 4 (2000 rows x 4 columns): a resume must keep the party's view (the same "
        "num-parties, split, preprocessing and files as the run it continues); resume with the original run's "
        "settings, or start a new run once this plan's reservation is released (flower-vfl ledger "
        "--release-plan)")
    assert len(other.ledger.entries) == made                      # nothing released
