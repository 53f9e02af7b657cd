"""The party's ledger (budget, replay, persistence) and the noise it releases."""

import importlib.util
import json
import math
import sys

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from flower_vfl.privacy import (
    BudgetExceeded,
    GaussianOutputMechanism,
    PrivacyLedger,
    ReplayMismatch,
    calibrate_sigma,
    epsilon_spent,
    noise_multiplier_for,
)

DELTA = 1e-5


# ============================================================================ ledger


def _ledger(**kw):
    args = dict(party_id=3, epsilon=1.76, delta=DELTA, planned_rounds=20, sensitivity=2.0)
    args.update(kw)
    return PrivacyLedger(**args)


def test_calibrate_sigma_is_multiplier_times_sensitivity():
    assert calibrate_sigma(1.76, DELTA, 20, 2.0) == pytest.approx(
        2.0 * noise_multiplier_for(1.76, DELTA, 20), rel=1e-12
    )
    assert calibrate_sigma(1.76, DELTA, 20, 2.0) == pytest.approx(20.0, rel=5e-3)
    with pytest.raises(ValueError, match=r"sensitivity=0 must be"):
        calibrate_sigma(1.0, DELTA, 20, 0)


def test_ledger_refuses_once_budget_would_be_exceeded():
    ledger = _ledger()
    assert ledger.noise_multiplier == pytest.approx(10.0, rel=5e-3)
    for r in range(15):
        ledger.record(r, "train")
    for r in range(15, 20):
        ledger.record(r, "eval")  # evaluation rounds are releases too
    assert ledger.spent() == pytest.approx(1.76, rel=1e-3)
    assert ledger.spent() <= 1.76
    assert not ledger.can_release()
    with pytest.raises(BudgetExceeded) as info:
        ledger.record(20, "eval")
    err = info.value
    assert isinstance(err, RuntimeError)
    msg = str(err)
    assert "party 3" in msg and "round 20" in msg and "budget ε=1.76" in msg
    assert "already spent ε=1.76" in msg and "20 release(s)" in msg
    assert err.requested == pytest.approx(epsilon_spent(ledger.noise_multiplier, 21, DELTA))
    assert len(ledger.entries) == 20  # nothing recorded on refusal
    # a much noisier release still fits
    assert ledger.can_release(1e4)


def test_check_release_reports_total_after_release():
    ledger = _ledger()
    ledger.record(0)
    after = ledger.check_release(1, "train")
    assert after == pytest.approx(epsilon_spent(ledger.noise_multiplier, 2, DELTA), rel=1e-12)
    assert len(ledger.entries) == 1  # checking does not record


def test_replay_costs_nothing_and_must_match():
    ledger = _ledger()
    first = ledger.record(0, "train")
    spent = ledger.spent()
    assert ledger.record(0, "train") is first
    assert ledger.check_release(0, "train") == spent
    assert ledger.spent() == spent
    with pytest.raises(ValueError, match=r"already released at z="):
        ledger.record(0, "train", sigma=ledger.sigma * 2)
    ledger.record(0, "eval")  # same round, other kind: a new release
    assert len(ledger.entries) == 2


def test_heterogeneous_multipliers():
    ledger = _ledger(sigma=20.0, epsilon=50.0)
    for r, sigma in enumerate([16.0, 32.0, 64.0]):
        ledger.record(r, sigma=sigma)  # C = 2 -> z = 8, 16, 32
    z_eff = 1 / math.sqrt(1 / 64 + 1 / 256 + 1 / 1024)
    assert ledger.spent("exact") == pytest.approx(
        dp_accounting.get_epsilon_gaussian(z_eff, DELTA), rel=1e-12
    )
    d0, dp = DELTA / 6, DELTA / 2  # three releases so far
    e = [math.sqrt(2 * math.log(1.25 / d0)) / z for z in (8, 16, 32)]
    assert max(e) <= 1
    paper = math.sqrt(2 * math.log(1 / dp) * sum(x * x for x in e)) + sum(
        x * (math.exp(x) - 1) for x in e
    )
    assert ledger.spent("paper") == pytest.approx(paper, rel=1e-12)


def test_entries_carry_theorem3_epsilon_only_when_valid():
    ledger = _ledger(sigma=20.0, epsilon=100.0)
    ok = ledger.record(0)  # z = 10
    d0 = DELTA / (2 * 20)
    assert ok.delta0 == d0
    assert ok.epsilon0 == pytest.approx(math.sqrt(2 * math.log(1.25 / d0)) / 10, rel=1e-12)
    assert ok.epsilon0 == pytest.approx(0.5554, abs=1e-4)
    bad = ledger.record(1, sigma=4.0)  # z = 2: ε₀ ≈ 2.78 > 1
    assert bad.epsilon0 is None and bad.delta0 is None


def test_paper_method_ledger_refuses_outside_theorem_3():
    ledger = PrivacyLedger("p", epsilon=20.523, delta=DELTA, planned_rounds=20, method="paper",
                           sensitivity=1.0)
    assert ledger.noise_multiplier == pytest.approx(10.0, rel=1e-4)
    assert not ledger.can_release(2.0)  # ε₀ > 1 -> inf
    for r in range(20):
        ledger.record(r)
    with pytest.raises(BudgetExceeded, match="party 'p'"):
        ledger.record(20)


def test_totals_by_every_available_method():
    ledger = _ledger(sigma=20.0, epsilon=10.0)
    for r in range(20):
        ledger.record(r)
    totals = ledger.totals()
    expected = {"paper", "exact", "pld"}
    if importlib.util.find_spec("opacus") is not None:
        expected |= {"rdp", "prv"}
    assert set(totals) == expected
    assert totals["exact"] == pytest.approx(1.760, abs=5e-3)
    assert totals["pld"] == pytest.approx(totals["exact"], rel=1e-3)
    assert totals["paper"] == pytest.approx(20.52, abs=0.01)
    if "rdp" in totals:
        assert totals["rdp"] == pytest.approx(1.914, abs=0.01)
        assert totals["prv"] == pytest.approx(totals["exact"], abs=5e-3)


def test_ledger_json_round_trip():
    ledger = _ledger(party_id="bank")
    for r in range(19):
        ledger.record(r, "train" if r % 4 else "eval")
    text = ledger.to_json()
    restored = PrivacyLedger.from_json(text)
    assert json.loads(text) == restored.to_dict() == ledger.to_dict()
    assert restored.spent() == ledger.spent()
    restored.record(19)
    with pytest.raises(BudgetExceeded, match="party 'bank'"):
        restored.record(20)
    assert PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict()))).entries == ledger.entries


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(epsilon=-1.0), r"epsilon=-1.0 must be"),
        (dict(delta=1.5), r"delta=1.5 must be"),
        (dict(planned_rounds=0), r"rounds=0 must be an integer >= 1"),
        (dict(method="moments"), r"method='moments' is not supported; accepted values"),
        (dict(sensitivity=0.0), r"sensitivity=0.0 must be"),
        (dict(sigma=-3.0), r"sigma=-3.0 must be"),
    ],
)
def test_ledger_rejects_bad_configuration(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        _ledger(**kwargs)


def test_ledger_rejects_bad_release():
    ledger = _ledger()
    with pytest.raises(ValueError, match=r"kind='predict' is not supported"):
        ledger.record(0, "predict")
    with pytest.raises(ValueError, match=r"round=-1 must be an integer >= 0"):
        ledger.record(-1)


def test_opacus_ledger_method_needs_opacus(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus", None)
    monkeypatch.setitem(sys.modules, "opacus.accountants", None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ImportError, match=r"pip install 'flower-vfl\[opacus\]'"):
        _ledger(method="rdp")


def test_dp_event_describes_the_releases():
    ledger = _ledger()
    assert isinstance(ledger.dp_event(), dp_accounting.NoOpDpEvent)
    ledger.record(0)
    ledger.record(1)
    event = ledger.dp_event()
    assert event == dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(ledger.noise_multiplier), 2
    )


# ============================================================================ mechanism


SIGMA = 2.5


def _noise(mech, r, kind="train", n=20_000):
    s = np.linspace(-3, 3, n)
    return mech.release(s, round=r, kind=kind) - s


@pytest.mark.parametrize("shape", [(20_000,), (5_000, 4)])
def test_output_noise_is_gaussian_with_sigma(shape):
    mech = GaussianOutputMechanism(SIGMA, party_id=1, seed=2024)
    s = np.arange(np.prod(shape), dtype=float).reshape(shape) / 1000.0
    released = mech.release(s, round=0)
    assert released.shape == shape
    e = (released - s).ravel()
    assert stats.kstest(e, "norm", args=(0.0, SIGMA)).pvalue > 1e-3
    assert np.std(e) == pytest.approx(SIGMA, rel=0.03)


def test_noise_independent_across_rounds_kinds_and_parties():
    n = 20_000
    bound = 4 / math.sqrt(n)
    a = GaussianOutputMechanism(SIGMA, party_id=1, seed=7)
    b = GaussianOutputMechanism(SIGMA, party_id=2, seed=7)  # same seed, other party
    streams = [_noise(a, 0), _noise(a, 1), _noise(a, 0, "eval"), _noise(b, 0), _noise(b, 1)]
    for i in range(len(streams)):
        for j in range(i + 1, len(streams)):
            r = np.corrcoef(streams[i], streams[j])[0, 1]
            assert abs(r) < bound, (i, j, r)


def test_replay_returns_identical_vector_and_never_touches_global_state():
    np.random.seed(0)
    before = np.random.get_state()[1].copy()
    mech = GaussianOutputMechanism(SIGMA, party_id=5, seed=11)
    s = np.linspace(0, 1, 500)
    first = mech.release(s, round=3, kind="eval")
    again = mech.release(s, round=3, kind="eval")
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(mech.cached(3, "eval"), first)
    assert mech.verify(3, "eval", first) and not mech.verify(3, "eval", first + 1e-9)
    # a restarted party (state restored from JSON) answers the same
    restored = GaussianOutputMechanism.from_dict(json.loads(json.dumps(mech.to_dict())))
    np.testing.assert_array_equal(restored.release(s, round=3, kind="eval"), first)
    # the noise depends on the seed
    other = GaussianOutputMechanism(SIGMA, party_id=5, seed=12).release(s, round=3, kind="eval")
    assert not np.allclose(other, first)
    np.testing.assert_array_equal(np.random.get_state()[1], before)


def test_replay_with_different_input_is_refused():
    mech = GaussianOutputMechanism(SIGMA, party_id=0, seed=1)
    s = np.ones(10)
    mech.release(s, round=0)
    with pytest.raises(ReplayMismatch, match=r"round 0 \(train\) was already released"):
        mech.release(2 * s, round=0)


def test_cache_is_bounded():
    mech = GaussianOutputMechanism(SIGMA, party_id=0, seed=1, cache_size=2)
    for r in range(5):
        mech.release(np.zeros(3), round=r)
    assert mech.cached(0) is None and mech.cached(4) is not None
    assert len(mech.hashes) == 5


def _column_space_residual(D, v):
    Q, _ = np.linalg.qr(D)
    return np.linalg.norm(v - Q @ (Q.T @ v)) / np.linalg.norm(v)


def test_paper_form_noise_lies_in_column_space_but_output_form_does_not():
    rng = np.random.default_rng(0)
    D = rng.standard_normal((300, 6))
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    x = rng.standard_normal(6)
    paper = GaussianOutputMechanism(SIGMA, party_id=1, seed=3, form="paper")
    noise = paper.release(round=0, D=D, x=x) - D @ x
    assert _column_space_residual(D, noise) < 1e-10
    output = GaussianOutputMechanism(SIGMA, party_id=1, seed=3)
    noise = output.release(D @ x, round=0) - D @ x
    assert _column_space_residual(D, noise) > 0.9  # ≈ sqrt((N - d) / N)
    assert isinstance(paper.dp_event(1.0), dp_accounting.NonPrivateDpEvent)
    assert output.dp_event(0.5) == dp_accounting.GaussianDpEvent(SIGMA / 0.5)


def test_paper_form_parameter_noise_has_covariance_sigma2_gram_inverse():
    rng = np.random.default_rng(1)
    D = rng.standard_normal((100, 4)) * np.array([1.0, 0.3, 2.0, 0.7])
    K = 5_000
    mech = GaussianOutputMechanism(SIGMA, party_id=2, seed=4, form="paper")
    released = mech.release(round=1, D=D, x=np.zeros((4, K)))
    assert released.shape == (100, K)
    xi = np.linalg.lstsq(D, released, rcond=None)[0]
    # whiten with the Cholesky of DᵀD: Lᵀ ξ / σ ~ N(0, I)
    L = np.linalg.cholesky(D.T @ D)
    w = (L.T @ xi) / SIGMA
    np.testing.assert_allclose(np.cov(w), np.eye(4), atol=0.06)
    assert stats.kstest(w.ravel(), "norm").pvalue > 1e-3


def test_mechanism_rejects_bad_input():
    with pytest.raises(ValueError, match=r"sigma=0 must be"):
        GaussianOutputMechanism(0, party_id=0, seed=0)
    with pytest.raises(ValueError, match=r"form='parameter' is not supported"):
        GaussianOutputMechanism(1.0, party_id=0, seed=0, form="parameter")
    mech = GaussianOutputMechanism(1.0, party_id=0, seed=0)
    with pytest.raises(ValueError, match=r"kind='test' is not supported"):
        mech.release(np.zeros(3), round=0, kind="test")
    with pytest.raises(ValueError, match=r"shape \(N,\) or \(N, K\)"):
        mech.release(np.zeros((2, 2, 2)), round=0)
    with pytest.raises(ValueError, match=r"D and x are required"):
        GaussianOutputMechanism(1.0, 0, 0, form="paper").release(np.zeros(3), round=0)


def test_string_party_ids_get_distinct_streams():
    a = GaussianOutputMechanism(1.0, party_id="alice", seed=9).release(np.zeros(1000), round=0)
    b = GaussianOutputMechanism(1.0, party_id="bob", seed=9).release(np.zeros(1000), round=0)
    assert abs(np.corrcoef(a, b)[0, 1]) < 4 / math.sqrt(1000)
