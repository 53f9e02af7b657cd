"""The party's one ledger (budget, charge, replay store, persistence) and the noise it draws.

The ledger is tested as it runs: a :class:`Ledger` over a :class:`PartyStore` (in memory or a
file on the party's disk), charged only through :meth:`Ledger.commit`."""

import importlib.util
import math
import sys

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from flower_vfl.privacy import (
    Budget,
    BudgetExceeded,
    GaussianOutputMechanism,
    Ledger,
    PartyStore,
    calibrate_sigma,
    epsilon_spent,
    noise_multiplier_for,
)

DELTA = 1e-5
Z = noise_multiplier_for(1.76, DELTA, 20)          # ≈ 10: 20 releases spend ε = 1.76


# ============================================================================ ledger


def _ledger(store=None, epsilon=1.76, accountant="exact", source="files:a", party_id=3):
    return Ledger(store or PartyStore(":memory:"), source, Budget(epsilon, DELTA, accountant), party_id)


def _charge(led, round, kind="train", z=Z, run="r1", mechanism="gaussian", sensitivity=2.0):
    return led.commit(run, round, kind, f"h{round}", unit="strict:row", noise_multiplier=z, sigma=z * sensitivity,
                      sensitivity=sensitivity, payload={"s": np.full(3, float(round))}, mechanism=mechanism)


def test_calibrate_sigma_is_multiplier_times_sensitivity():
    assert calibrate_sigma(1.76, DELTA, 20, 2.0) == pytest.approx(
        2.0 * noise_multiplier_for(1.76, DELTA, 20), rel=1e-12
    )
    assert calibrate_sigma(1.76, DELTA, 20, 2.0) == pytest.approx(20.0, rel=5e-3)
    with pytest.raises(ValueError, match=r"sensitivity=0 must be"):
        calibrate_sigma(1.0, DELTA, 20, 0)


def test_ledger_refuses_once_budget_would_be_exceeded():
    led = _ledger()
    assert Z == pytest.approx(10.0, rel=5e-3)
    for r in range(15):
        _charge(led, r, "train")
    for r in range(15, 20):
        _charge(led, r, "eval")                    # evaluation rounds are releases too
    assert led.spent() == pytest.approx(1.76, rel=1e-3) and led.spent() <= 1.76
    with pytest.raises(BudgetExceeded) as info:
        _charge(led, 20, "eval")
    err = info.value
    assert isinstance(err, RuntimeError) and err.code == "budget"
    msg = str(err)
    assert "party 3" in msg and "round 20" in msg and "budget ε=1.76" in msg
    assert "already spent ε=1.76" in msg and "20 release(s)" in msg
    assert err.requested == pytest.approx(epsilon_spent(Z, 21, DELTA))
    assert len(led.entries) == 20 and led.answer("r1", 20, "eval") is None     # nothing written on refusal
    _charge(led, 20, "eval", z=1e4)                # a much noisier release still fits
    assert len(led.entries) == 21


def test_check_reports_total_after_release_and_writes_nothing():
    led = _ledger()
    _charge(led, 0)
    after = led.check(led.entries, round=1, kind="train", mechanism="gaussian", noise_multiplier=Z)
    assert after == pytest.approx(epsilon_spent(Z, 2, DELTA), rel=1e-12)
    assert len(led.entries) == 1


def test_a_round_is_charged_once_and_its_answer_is_stored():
    led = _ledger()
    first = _charge(led, 0)
    spent = led.spent()
    with pytest.raises(RuntimeError, match=r"round 0 \(train\) of run r1 was already released"):
        _charge(led, 0)
    assert led.spent() == spent
    np.testing.assert_array_equal(led.answer("r1", 0, "train").payload["s"], first.payload["s"])
    _charge(led, 0, "eval")                        # same round, other kind: a new release
    _charge(led, 0, run="r2")                      # same round, other run: a new release, same ledger
    assert len(led.entries) == 3 and led.spent() == pytest.approx(epsilon_spent(Z, 3, DELTA), rel=1e-12)


def test_one_ledger_per_source_whatever_the_run():
    store = PartyStore(":memory:")
    a, b = _ledger(store, source="files:a"), _ledger(store, source="files:b")
    for r, run in enumerate(("1", "2", "3")):
        _charge(a, r, run=run)
    _charge(b, 0)
    assert len(a.entries) == 3 and len(b.entries) == 1
    assert a.spent() == pytest.approx(epsilon_spent(Z, 3, DELTA), rel=1e-12)
    assert a.affordable([("gaussian", Z)] * 2, exclude_run="3")["spent_before_run"] == pytest.approx(
        epsilon_spent(Z, 2, DELTA), rel=1e-12)


def test_heterogeneous_multipliers():
    led = _ledger(epsilon=50.0)
    for r, z in enumerate([8.0, 16.0, 32.0]):
        _charge(led, r, z=z)
    z_eff = 1 / math.sqrt(1 / 64 + 1 / 256 + 1 / 1024)
    assert led.spent("exact") == pytest.approx(dp_accounting.get_epsilon_gaussian(z_eff, DELTA), rel=1e-12)
    d0, dp = DELTA / 6, DELTA / 2                  # three releases so far
    e = [math.sqrt(2 * math.log(1.25 / d0)) / z for z in (8, 16, 32)]
    assert max(e) <= 1
    paper = math.sqrt(2 * math.log(1 / dp) * sum(x * x for x in e)) + sum(x * (math.exp(x) - 1) for x in e)
    assert led.spent("paper") == pytest.approx(paper, rel=1e-12)


def test_laplace_and_gaussian_releases_compose_in_one_privacy_loss_distribution():
    from dp_accounting.pld import PLDAccountant

    led = _ledger(epsilon=100.0, accountant="pld")
    for r in range(3):
        _charge(led, r, z=5.0, mechanism="laplace")
    for r in range(3, 5):
        _charge(led, r, z=3.0)
    ref = PLDAccountant(value_discretization_interval=1e-4)
    ref.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(3.0), 2))
    ref.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(5.0), 3))
    assert led.spent() == pytest.approx(ref.get_epsilon(DELTA), rel=1e-6)
    assert led.spent() > _ledger(epsilon=100.0).epsilon_of(led.entries[3:])      # the Laplace part counts
    assert set(led.totals()) == {"exact", "pld"}
    with pytest.raises(ValueError, match="cannot compose Laplace releases"):
        led.spent("paper")


def test_paper_method_ledger_refuses_outside_theorem_3():
    z = noise_multiplier_for(20.523, DELTA, 20, "paper")
    led = _ledger(epsilon=20.523, accountant="paper", party_id="p")
    assert z == pytest.approx(10.0, rel=1e-4)
    with pytest.raises(BudgetExceeded):
        led.check([], round=0, kind="train", mechanism="gaussian", noise_multiplier=2.0)   # ε₀ > 1 -> inf
    for r in range(20):
        _charge(led, r, z=z)
    with pytest.raises(BudgetExceeded, match="party 'p'"):
        _charge(led, 20, z=z)


def test_totals_by_every_available_method():
    led = _ledger(epsilon=10.0)
    for r in range(20):
        _charge(led, r, z=10.0)
    totals = led.totals()
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


def test_the_ledger_is_on_the_partys_disk_and_survives_a_restart(tmp_path):
    led = _ledger(PartyStore(tmp_path), party_id="bank")
    for r in range(19):
        _charge(led, r, "train" if r % 4 else "eval")
    spent = led.spent()
    led.store.close()
    again = _ledger(PartyStore(tmp_path), party_id="bank")          # a restarted party process
    assert [(e.round, e.kind) for e in again.entries] == [(r, "train" if r % 4 else "eval") for r in range(19)]
    assert again.spent() == spent
    np.testing.assert_array_equal(again.answer("r1", 7, "train").payload["s"], np.full(3, 7.0))
    _charge(again, 19)
    with pytest.raises(BudgetExceeded, match="party 'bank'"):
        _charge(again, 20)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(epsilon=-1.0), r"epsilon=-1.0 must be"),
        (dict(delta=1.5), r"delta=1.5 must be"),
        (dict(accountant="moments"), r"method='moments' is not supported; accepted values"),
    ],
)
def test_budget_rejects_bad_configuration(kwargs, pattern):
    args = dict(epsilon=1.0, delta=DELTA, accountant="exact")
    args.update(kwargs)
    with pytest.raises(ValueError, match=pattern):
        Budget(**args)


def test_ledger_rejects_bad_release():
    led = _ledger()
    with pytest.raises(ValueError, match=r"kind='predict' is not supported"):
        _charge(led, 0, "predict")
    with pytest.raises(ValueError, match=r"noise_multiplier=inf must be"):
        _charge(led, 0, z=math.inf)
    with pytest.raises(ValueError, match=r"mechanism\(s\) \['cauchy'\] are not supported"):
        _charge(led, 0, mechanism="cauchy")
    assert led.entries == []


def test_opacus_accountant_needs_opacus(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus", None)
    monkeypatch.setitem(sys.modules, "opacus.accountants", None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ImportError, match=r"pip install 'flower-vfl\[opacus\]'"):
        Budget(1.0, DELTA, "rdp")


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


def test_draws_are_fresh_without_a_seed_and_never_touch_global_state():
    np.random.seed(0)
    before = np.random.get_state()[1].copy()
    s = np.linspace(0, 1, 500)
    fresh = GaussianOutputMechanism(SIGMA, party_id=5)
    a, b = fresh.release(s, round=3, kind="eval"), fresh.release(s, round=3, kind="eval")
    assert not np.allclose(a, b)                   # OS entropy: the same (round, kind) never repeats
    seeded = GaussianOutputMechanism(SIGMA, party_id=5, seed=11)   # in-process experiments only
    np.testing.assert_array_equal(seeded.release(s, round=3, kind="eval"), seeded.release(s, round=3, kind="eval"))
    other = GaussianOutputMechanism(SIGMA, party_id=5, seed=12).release(s, round=3, kind="eval")
    assert not np.allclose(other, seeded.release(s, round=3, kind="eval"))
    np.testing.assert_array_equal(np.random.get_state()[1], before)
    assert not hasattr(fresh, "hashes") and not hasattr(fresh, "cached")   # it keeps no record: the ledger does


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
