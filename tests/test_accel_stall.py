"""Anderson once the plain rounds stall (core/accel.py ``STALL_RATIO``): the gate's rule, its
checkpoint state, and end to end the same fixed point (the centralized optimum) and the same
trajectory on the engine and the Flower path."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from flower_vfl import VerticalADMM
from flower_vfl.core import accel


class _Central:
    """What Anderson.step reads of the central node after its step."""

    def __init__(self, q, y, theta=0.5, rho=0.1):
        self.q, self.y, self.theta, self.rho = q, y, theta, rho


def _rounds(norms, n=50, seed=0):
    """(s_list, central) per round: q of the given norms, fixed direction."""
    rng = np.random.default_rng(seed)
    d = rng.normal(size=n)
    d /= np.linalg.norm(d)
    s = [rng.normal(size=n), rng.normal(size=n)]
    return [(s, _Central(r * d, rng.normal(size=n))) for r in norms]


def test_the_gate_engages_after_two_stalled_ratios_and_stays_on():
    # ratios 0.5, 0.9, 0.8 -> the second and third are >= 0.75: engaged in round 4, for good
    norms = [1.0, 0.5, 0.45, 0.36, 0.01, 0.0001]
    acc = accel.Anderson(stall=0.75)
    got = []
    for s, c in _rounds(norms):
        y0 = c.y.copy()
        qs = acc.step(s, c)
        got.append(qs is not None)
        if qs is None:                 # a plain round: the central node's state is not touched
            assert np.array_equal(c.y, y0)
    assert got == [False, False, False, True, True, True]
    assert acc.engaged


def test_no_gate_is_anderson_from_round_one():
    acc = accel.Anderson()
    s, c = _rounds([1.0])[0]
    assert acc.engaged and acc.step(s, c) is not None


def test_the_gate_state_survives_a_checkpoint():
    rounds = _rounds([1.0, 0.5, 0.45, 0.36])
    a = accel.Anderson(stall=0.75)
    for s, c in rounds[:3]:
        assert a.step(s, c) is None
    arrays, scalars = a.get_state()
    assert scalars["engaged"] is False and len(scalars["r_hist"]) == 3
    b = accel.Anderson(stall=0.75)
    b.set_state(arrays, scalars)
    assert b.r_hist == a.r_hist and not b.engaged
    s, c = rounds[3]
    assert b.step(s, c) is not None and b.engaged
    # a checkpoint written before the gate existed: Anderson ran from round 1
    old = {k: v for k, v in scalars.items() if k not in ("engaged", "r_hist")}
    d = accel.Anderson(stall=0.75)
    d.set_state(arrays, old)
    assert d.engaged


def _breast():
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    return [X[:, :10], X[:, 10:20], X[:, 20:]], np.where(y > 0, 1.0, -1.0), X


def test_gated_anderson_reaches_the_centralized_optimum(monkeypatch):
    blocks, y, X = _breast()
    lam = 1e-2
    r = LogisticRegression(C=1.0 / (y.size * lam), tol=1e-12, max_iter=10000).fit(X, y)
    w = r.coef_.ravel()
    f_star = float(np.mean(np.logaddexp(0.0, -y * (X @ w + r.intercept_[0])))) + lam / 2 * float(w @ w)
    monkeypatch.setattr(accel, "STALL_RATIO", 0.75)
    engaged = []
    orig = accel.Anderson.stalled
    monkeypatch.setattr(accel.Anderson, "stalled", lambda self, q: engaged.append(orig(self, q)) or engaged[-1])
    m = VerticalADMM(lam=lam, max_rounds=80, tol=0).fit(blocks, y)
    assert m.acceleration_ == "anderson"
    assert engaged[0] is False and engaged[-1] is True      # plain rounds first, then Anderson
    assert m.history_[-1]["objective"] - f_star <= 1e-9 * f_star
    # an objective gap of 1e-9 leaves the coefficients ~1e-5 from the optimum (lam = 1e-2)
    np.testing.assert_allclose(np.concatenate(m.coef_), w, rtol=0, atol=1e-4)


def test_gated_anderson_flower_and_engine_give_the_same_trajectory(monkeypatch):
    """The strategy and the engine call the same accelerator: bitwise the same rounds with the
    gate on (breast cancer, 3 parties, 15 rounds: the gate engages within them)."""
    from flower_vfl.privacy import mechanism
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("trajectory_check", root / "benchmarks" / "trajectory_check.py")
    tc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tc)
    monkeypatch.setattr(mechanism.GaussianOutputMechanism, "rng", tc.noise_rng)
    monkeypatch.setattr(accel, "STALL_RATIO", 0.75)
    engaged = []
    orig = accel.Anderson.stalled
    monkeypatch.setattr(accel.Anderson, "stalled", lambda self, q: engaged.append(orig(self, q)) or engaged[-1])
    got = tc.run_case("bc", False, None)
    assert True in engaged and engaged[0] is False
    for what in ("history", "coef", "intercept", "decision_sha256", "decision_head"):
        assert np.array_equal(got["engine/" + what], got["flower/" + what], equal_nan=True), what


@pytest.mark.parametrize("stall", [None, 0.75])
def test_make_accelerator_passes_the_module_gate(monkeypatch, stall):
    from flower_vfl.core.central import CentralUpdate
    from flower_vfl.core.losses import get_loss
    monkeypatch.setattr(accel, "STALL_RATIO", stall)
    c = CentralUpdate(get_loss("logistic"), np.array([1.0, -1.0, 1.0]), 0.1, theta=0.5)
    acc = accel.make_accelerator("auto", c, [False, False])
    assert isinstance(acc, accel.Anderson) and acc.stall == stall and acc.engaged == (stall is None)
