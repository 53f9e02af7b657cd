"""A private party at dp-epsilon=5 on breast cancer: the run that "diverged" and blamed party 0.

Cause (found with the in-process engine, seed 0, dp-train-rounds=3): the private party's first
noisy release (sigma ~ 66 per value against values clipped to +-10) moved the sum of releases far
from the last z; every sample's logistic curvature at the new point underflowed, and the central
node's fast joint (z, intercept) Newton step (core/central.py ``_newton_fast``) took a step in b of
~1/s with a Schur sum s = 1.9e-29, then "certified" a gradient that had lost every digit: the
intercept went to 2.8e32, z to 3.6e16, and the non-private party's next x-update target with it
(its release grew 55 -> 6.5e3 in two rounds; 1.58e8 on the Flower path). The fix leaves such a
step to the damped Newton path (``S_MIN``); non-private runs never come near it (s >= 0.095 on
breast cancer at lam 1e-8, 1.6e4 on a9a), so their trajectories are unchanged bitwise
(tests/test_trajectories.py). What remains is a private party whose noise is large at these
settings: a refused release now names that cause and what to change.
"""

import re

import numpy as np
import pytest

import flower_vfl.core.central as central
from flower_vfl import VerticalADMM
from flower_vfl.io.data import column_ranges, load_all
from flower_vfl.privacy.accounting import noise_multiplier_for
from flower_vfl.privacy.party import PrivacyConfig
from flower_vfl.privacy.sensitivity import strict_sensitivity
from flower_vfl.strategies.exchange import ReplyError
from tests.test_resume import strategy
from tests.test_strategy_faults import RC, FaultyGrid, nodes


@pytest.fixture(scope="module")
def blocks():
    X, y, _, _ = load_all("breast_cancer")
    return [X[:, a:b] for a, b in column_ranges("breast_cancer", X.shape[1], 2)], y


def _state_before(blocks, k_stop, monkeypatch_s_min=None):
    """The central node's state and the release sum of round ``k_stop`` (engine, seed 0)."""
    import copy
    B, y = blocks
    seen = {}
    real = central.CentralUpdate._step

    def spy(self, s_sum):
        seen["k"] = seen.get("k", 0) + 1
        if seen["k"] == k_stop:
            seen["state"] = (copy.deepcopy(self), np.array(s_sum, copy=True))
        return real(self, s_sum)
    central.CentralUpdate._step = spy
    try:
        VerticalADMM(max_rounds=200, privacy=[None, PrivacyConfig(epsilon=5.0, train_rounds=3, seed=0)],
                     random_state=0).fit(B, y)
    finally:
        central.CentralUpdate._step = real
    return seen["state"]


def _kkt(c, s_sum, z_new, b_new):
    """Gradient of F(w, b) = (1/N) sum l(w) - <y, w> + b sum(y) + rho/2 ||a + b - w||^2 at the
    step's result (w = z + b), relative to the terms' size: 0 at the exact (z, b) update."""
    b = float(b_new)
    w = z_new + b
    r = s_sum + b - w
    g_w = c.loss.grad(w, c.t) / c.n - c.y - c.rho * r
    g_b = float(c.y.sum() + c.rho * r.sum())
    scale = np.abs(c.y).max() + c.rho * (np.abs(s_sum).max() + abs(b))
    return max(np.abs(g_w).max(), abs(g_b) / c.n) / scale


def _objective(c, s_sum, z_new, b_new):
    """F(w, b) of the (z, b) update (eq. 7 with the intercept), at w = z + b."""
    w, b = z_new + float(b_new), float(b_new)
    r = s_sum + b - w
    return float(np.sum(c.loss.value(w, c.t)) / c.n - c.y @ w + b * c.y.sum() + 0.5 * c.rho * r @ r)


def test_the_central_update_after_a_noisy_release_is_the_exact_minimizer(blocks, monkeypatch):
    """Round 202, the second noisy round: the (z, b) update meets its optimality conditions to
    1e-8 (relative), and agrees with the damped Newton path (a globally convergent reference) to
    1e-9; with the old rule (S_MIN = 0) the same inputs give b = 2.8e32 and fail them."""
    c0, s_sum = _state_before(blocks, 202)
    import copy
    c = copy.deepcopy(c0)
    c.step(s_sum)
    assert abs(float(c.b)) < 100 and _kkt(c0, s_sum, c.z, c.b) < 1e-8
    ref = copy.deepcopy(c0)
    monkeypatch.setattr(central.CentralUpdate, "_newton_fast", lambda *a: None)
    ref.step(s_sum)
    monkeypatch.undo()
    np.testing.assert_allclose(c.z, ref.z, rtol=0, atol=1e-9 * (1 + np.abs(ref.z).max()))
    assert float(c.b) == pytest.approx(float(ref.b), rel=1e-9)
    old = copy.deepcopy(c0)
    monkeypatch.setattr(central, "S_MIN", 0.0)
    old.step(s_sum)
    # the bug, for the record: b = 2.8e32 and an objective of 1.4e32 against the minimum 20.8
    assert abs(float(old.b)) > 1e20
    assert _objective(c0, s_sum, old.z, old.b) > 1e6 * abs(_objective(c0, s_sum, c.z, c.b))


@pytest.mark.parametrize("train_rounds", [3, 10])
def test_the_non_private_release_stays_in_scale(blocks, train_rounds):
    """Three seeds: the non-private party's release after the private rounds stays within 3x its
    warm-start size (before: 6.5e3 vs 55 at seed 0, three rounds), the intercept within +-100."""
    B, y = blocks
    for seed in range(3):
        peaks = []

        def watch(k, m):
            peaks.append((float(np.abs(m._parties[0].s).max()), abs(float(m._central.b))))
        VerticalADMM(max_rounds=200, privacy=[None, PrivacyConfig(epsilon=5.0, train_rounds=train_rounds,
                                                                  seed=seed)],
                     random_state=seed, callback=watch).fit(B, y)
        warm = peaks[199][0]
        assert max(p for p, _ in peaks[200:]) <= 3 * warm, (seed, peaks[200:])
        assert max(b for _, b in peaks) < 100


def test_a_refused_release_names_the_private_partys_noise():
    """Through the real strategy and ClientApp handlers: party 1 private at dp-epsilon=5 with 3
    training rounds and the issue's dp-lam (1e-4, the run's lam: the default before dp-lam
    scaled with N); a release beyond max-release names party 1's noise (sigma computed here from
    the calibration: the accountant's multiplier times the strict sensitivity at the round's
    rho / theta) and the node-config keys to change."""
    cfg = nodes()
    cfg[101].update({"dp": True, "dp-epsilon": 5.0, "dp-train-rounds": 3, "dp-lam": 1e-4})
    rc = {**RC, "max-release": 100.0}
    st = strategy(rc)
    with pytest.raises(ReplyError) as err:
        st.start(FaultyGrid(cfg, rc))
    n, theta = 426, 0.5
    rho = 0.2 * 0.25 / n                                       # default_rho for logistic (curvature 1/4)
    sigma = noise_multiplier_for(5.0, 1e-5, 4, "exact") * strict_sensitivity(rho / theta, 1e-4, 2.0, 10.0, 10.0)
    assert sigma == pytest.approx(st.privacy_[1]["ledger"]["entries"][-1]["sigma"], rel=1e-12)
    tail = (f"; refused: the run diverged (max-release=100, run config, bounds every released value); the likely "
            f"cause is a private party's noise at these settings: party 1's training releases carry Gaussian noise "
            f"of sigma={sigma:.4g} per value against values clipped to +-10 (its dp-epsilon=5 over 3 training and 1 "
            "evaluation release(s), dp-lam=0.0001). That noise enters z and y and every party's next "
            "x-update; raise the private parties' dp-lam (node config), lower their dp-train-rounds, or give them "
            "a larger dp-epsilon (dp-train-rounds=0: it releases only its final model)")
    assert re.fullmatch(r"party [01] \(node 10[01]\), round (9|10|11) \(train\): release\['s'\] holds \d+ value\(s\) "
                        r"beyond \+-100 \(e\.g\. -?[0-9.e+-]+ at row \d+\)" + re.escape(tail), str(err.value)), \
        str(err.value)


def test_without_private_parties_the_message_is_unchanged():
    from flower_vfl.privacy.outcome import noise_divergence_cause
    assert noise_divergence_cause({}) is None
    assert noise_divergence_cause({1: {"ledger": {"entries": [{"kind": "eval", "sigma": 3.0}]}}}) is None
