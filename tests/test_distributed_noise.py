"""Distributed noise (issue 21 item 3): the Skellam share mechanism and its accounting, in-process.

The accounting (Agarwal, Kairouz & Liu 2021 bound, dominated by a Gaussian RDP curve, composed and
converted by dp-accounting at integer orders) is checked against an independent computation: the
Renyi divergence and the (eps, delta) hockey-stick curve summed directly over scipy's Skellam pmf.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import skellam

from flower_vfl.privacy.accounting import (INTEGER_ORDERS, epsilon_for_events, epsilon_rdp,
                                           noise_multiplier_rdp)
from flower_vfl.privacy.distributed import (DistributedNoise, DistributedParty, DistributedRefused,
                                            dominating_multiplier, integer_sensitivity, noise_bits, skellam_noise,
                                            skellam_rdp, variance_for)
from flower_vfl.privacy.ledger import BudgetExceeded
from flower_vfl.privacy.party import PlanExceeded, PrivacyConfig
from flower_vfl.secagg.quantize import FixedPoint


# ---------------------------------------------------------------- independent computations over the pmf
def _support(v, d):
    half = int(14 * math.sqrt(v)) + abs(d) + 5                # the pmf beyond 14 sd is < 1e-40
    k = np.arange(-half, half + 1)
    lp, lq = skellam.logpmf(k - d, v / 2, v / 2), skellam.logpmf(k, v / 2, v / 2)
    ok = np.isfinite(lp) & np.isfinite(lq)
    return lp[ok], lq[ok]


def renyi_numeric(v, d, alpha):
    """D_alpha(Sk(v) + d || Sk(v)) summed over the pmf."""
    lp, lq = _support(v, d)
    return float(logsumexp(alpha * lp + (1 - alpha) * lq) / (alpha - 1))


def epsilon_numeric(v, d, delta):
    """The exact epsilon at delta of one release Sk(v) + d vs Sk(v), both directions, from the pmf."""
    lp, lq = _support(v, d)
    p, q = np.exp(lp), np.exp(lq)

    def hockey(e):
        return max(np.sum(np.maximum(0.0, p - math.exp(e) * q)), np.sum(np.maximum(0.0, q - math.exp(e) * p)))

    lo, hi = 0.0, 60.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if hockey(mid) > delta else (lo, mid)
    return hi


# ---------------------------------------------------------------- the bound
@pytest.mark.parametrize("v,d", [(100.0, 3), (2500.0, 15), (1e4, 30)])
def test_skellam_bound_is_above_the_numeric_renyi_divergence_and_close_to_it(v, d):
    for alpha in (2, 3, 5, 10):
        exact = renyi_numeric(v, d, alpha)
        bound = skellam_rdp(alpha, d, d, v)
        assert exact <= bound * (1 + 1e-12)
        # tight for large v: the extra terms vanish as 1/v^2 relative to the Gaussian term
        assert bound <= exact * (1 + (0.05 if v <= 100 else 0.005)), (alpha, exact, bound)


def test_dominating_multiplier_bounds_the_skellam_rdp_at_every_integer_order():
    for l1, l2, v in [(3, 3, 100.0), (3e3, 30, 1e4), (6e5, 2.7e4, 3.7e10), (1, 1, 0.5)]:
        z = dominating_multiplier(l1, l2, v)
        for a in INTEGER_ORDERS:
            assert a / (2 * z * z) >= skellam_rdp(a, l1, l2, v) * (1 - 1e-12)
        # and equals the Gaussian curve of the same variance to the order of 1/v
        assert z == pytest.approx(math.sqrt(v) / l2, rel=2.0 / v + 4 * l1 / (l2 * l2 * v) + 1e-12)
        assert dominating_multiplier(l1, l2, variance_for(z, l1, l2)) >= z
        assert variance_for(z, l1, l2) == pytest.approx(v, rel=1e-9)


@pytest.mark.parametrize("v,d", [(100.0, 3), (1e4, 30)])
def test_accounted_epsilon_matches_the_pmf_epsilon_to_the_stated_tolerance(v, d):
    """One release: accountant (RDP at integer orders) >= the exact pmf epsilon, and at most 13 % above it
    (the RDP -> (eps, delta) conversion); the pmf epsilon equals the analytic Gaussian's of the same
    variance to 2 %."""
    acc = epsilon_rdp([("skellam", dominating_multiplier(d, d, v))], 1e-5)
    exact = epsilon_numeric(v, d, 1e-5)
    gauss = float(dp_accounting.get_epsilon_gaussian(math.sqrt(v) / d, 1e-5))
    assert exact <= acc <= 1.13 * exact, (exact, acc)
    assert exact == pytest.approx(gauss, rel=0.02)


def test_composition_of_two_releases_matches_the_pmf_of_the_composed_loss():
    """Two releases (one shift in each of 2 entries) compose in RDP; the exact epsilon of the product
    mechanism is that of the convolution of the two privacy-loss distributions (pmf-level, dp-accounting's
    from_two_probability_mass_functions), and the accountant is above it, within 13 %."""
    from dp_accounting.pld import privacy_loss_distribution as pld
    v, d = 400.0, 6
    lp, lq = _support(v, d)
    one = pld.from_two_probability_mass_functions(dict(enumerate(lp)), dict(enumerate(lq)),
                                                  value_discretization_interval=1e-5)
    exact2 = one.compose(one).get_epsilon_for_delta(1e-5)
    z = dominating_multiplier(d, d, v)
    acc2 = epsilon_for_events([("skellam", z), ("skellam", z)], 1e-5)
    assert exact2 <= acc2 <= 1.13 * exact2, (exact2, acc2)


def test_rdp_calibration_and_ledger_mix():
    z = noise_multiplier_rdp(1.0, 1e-5, 3)
    assert epsilon_rdp([("gaussian", z)] * 3, 1e-5) == pytest.approx(1.0, abs=1e-6)
    assert epsilon_rdp([("gaussian", z)] * 3, 1e-5) <= 1.0
    # a ledger with a Skellam entry composes by RDP (never the Gaussian closed form, which is below it)
    mixed = epsilon_for_events([("gaussian", z), ("skellam", z), ("gaussian", z)], 1e-5, "exact")
    assert mixed == pytest.approx(1.0, abs=1e-6)
    assert epsilon_for_events([("gaussian", z)] * 3, 1e-5, "exact") < 0.95


# ---------------------------------------------------------------- the integer domain
def test_a_sum_of_skellam_shares_is_the_skellam_of_the_summed_variance():
    k = np.arange(-400, 401)
    conv = np.convolve(skellam.pmf(k, 30, 30), skellam.pmf(k, 20, 20))[400:1201]
    np.testing.assert_allclose(conv, skellam.pmf(k, 50, 50), atol=1e-15)
    rng = np.random.default_rng(3)
    total = sum(skellam_noise(rng, 250.0, 200_000) for _ in range(4))
    assert total.dtype == np.int64
    assert total.var() == pytest.approx(1000.0, rel=0.01)
    assert abs(total.mean()) < 0.2


def test_integer_sensitivity_holds_for_worst_case_rounding():
    rng = np.random.default_rng(0)
    n, C, gamma = 64, 0.7, 2.0 ** 6
    l1, l2 = integer_sensitivity(C, gamma, n)
    worst = 0.0
    for _ in range(2000):
        s = (rng.integers(-50, 50, n) + 0.5 - 1e-9) / gamma          # each entry just below a rounding edge
        step = rng.normal(size=n)
        s2 = s + C * step / np.linalg.norm(step) * rng.uniform(0.5, 1.0)
        diff = np.rint(gamma * s) - np.rint(gamma * s2)
        assert np.linalg.norm(diff) <= l2 and np.abs(diff).sum() <= l1
        worst = max(worst, np.linalg.norm(diff) / l2)
    assert worst > 0.6                                                  # the bound is not vacuous
    assert noise_bits(C, n, 60) == math.ceil(math.log2(2 ** 10 * 8 / C))
    assert noise_bits(C, n, 5) == 5                                     # capped at the roster's exponent


def test_modular_sum_of_integer_releases_decodes_exactly():
    fp = FixedPoint([1e4, 1e4, 1e4])
    bits = 20
    rng = np.random.default_rng(1)
    r = [rng.integers(-2 ** 30, 2 ** 30, 1000).astype(np.int64) + skellam_noise(rng, 1e12, 1000) for _ in range(3)]
    total = fp.encode_integer(r[0], bits) + fp.encode_integer(r[1], bits) + fp.encode_integer(r[2], bits)
    np.testing.assert_array_equal(fp.decode_sum(total) * 2.0 ** bits, (r[0] + r[1] + r[2]).astype(float))


# ---------------------------------------------------------------- the plan and the two guarantees
def test_plan_shares_and_the_two_guarantees():
    base = dict(n=32561, sensitivity=8.0, z=5.0, bits=15)
    alone = DistributedNoise(adders=1, colluders=0, **base)
    two = DistributedNoise(adders=2, colluders=0, **base)
    three_k1 = DistributedNoise(adders=3, colluders=1, **base)
    # k = 0, 2 parties: each adds half; the sum carries the noise one party alone would
    assert two.share == pytest.approx(alone.share / 2, rel=1e-12)
    assert 2 * two.share == pytest.approx(alone.variance, rel=1e-12)
    assert two.z_colluding >= 5.0 and two.z_colluding == pytest.approx(5.0, rel=1e-9)
    assert two.z_own == pytest.approx(5.0 / math.sqrt(2), rel=1e-6)
    # k = 1 of 3: two honest shares carry the target; the central node alone faces all three
    assert three_k1.honest == 2 and three_k1.share == pytest.approx(alone.variance / 2, rel=1e-12)
    assert three_k1.z_colluding == pytest.approx(5.0, rel=1e-9)
    assert three_k1.z_server == pytest.approx(5.0 * math.sqrt(1.5), rel=1e-6)
    # k >= A - 1: no noise saved
    assert DistributedNoise(adders=2, colluders=1, **base).share == pytest.approx(alone.variance, rel=1e-12)
    # the rounding inflation is below 0.1 % of gamma C
    l1, l2 = two.l1_l2
    assert l2 / (two.gamma * 8.0) - 1 <= 2 ** -10 * 1.0001 or two.bits == 15


def _party(colluders=0, T=2, eps=1.0, **kw):
    rng = np.random.default_rng(0)
    D = rng.normal(size=(400, 5))
    cfg = PrivacyConfig(epsilon=eps, delta=1e-5, train_rounds=T, eval_rounds=1, b1=2.0, c_v=1.0, c_s=1.0,
                        lam=1e-2, seed=kw.pop("seed", 7))
    return DistributedParty(D, None, 1e-2, cfg, colluders=colluders, **kw), rng


def test_distributed_party_spends_exactly_its_budget_and_records_both_guarantees():
    p, rng = _party(colluders=1)
    n = p.D.shape[0]
    q, y = np.zeros(n), rng.normal(size=n) * 1e-3
    s1 = p.distributed_release(1, q, y, 1.0 / n, adders=3, max_bits=38)
    assert s1.dtype == np.int64
    # an identical re-send: the stored vector, no second draw, no second charge
    np.testing.assert_array_equal(p.distributed_release(1, q, y, 1.0 / n, adders=3, max_bits=38), s1)
    p.distributed_release(2, q, y, 1.0 / n, adders=3, max_bits=38)
    with pytest.raises(PlanExceeded):
        p.distributed_release(3, q, y, 1.0 / n, adders=3, max_bits=38)
    p.release_model(4)
    entries = p.ledger.entries
    assert [e.mechanism for e in entries] == ["skellam", "skellam", "gaussian"]
    assert p.ledger.spent() <= 1.0 and p.ledger.spent() == pytest.approx(1.0, abs=1e-6)
    rep = p.report()["distributed"]
    assert [r["adders"] for r in rep["releases"]] == [3, 3] and rep["releases"][0]["colluders"] == 1
    assert rep["epsilon_charged_colluding"] == pytest.approx(p.ledger.spent(), rel=1e-9)
    # against the central node alone: the two training releases carry 3 shares (z * sqrt(3/2))
    expect = epsilon_rdp([("gaussian", p.z * math.sqrt(1.5))] * 2 + [("gaussian", p.z)], 1e-5)
    assert rep["epsilon_server_alone"] == pytest.approx(expect, rel=1e-6)
    assert rep["epsilon_server_alone"] < 0.9 * rep["epsilon_charged_colluding"]
    # the share is half of what a party alone adds (2 honest shares of 3)
    plan = p.last_plan
    assert plan.share == pytest.approx(variance_for(p.z, *plan.l1_l2) / 2, rel=1e-12)


def test_distributed_party_noise_is_its_share_only():
    """The integer release minus round(gamma s) has the share's variance (k = 0, A = 2: half)."""
    p, rng = _party(colluders=0, T=1)
    n = p.D.shape[0]
    q, y = np.zeros(n), rng.normal(size=n) * 1e-3
    s_int = p.distributed_release(1, q, y, 1.0 / n, adders=2, max_bits=38)
    plan = p.last_plan
    s_clean = np.rint(np.clip(p.D @ p.update.x, -1, 1) * plan.gamma)
    noise = s_int - s_clean
    assert noise.var() == pytest.approx(plan.share, rel=0.2)          # 400 draws
    assert plan.share == pytest.approx(plan.variance / 2, rel=1e-12)


def test_distributed_party_refuses_a_clear_release_and_an_overspend():
    p, rng = _party()
    n = p.D.shape[0]
    with pytest.raises(DistributedRefused, match="secure sum only"):
        p.train_release(1, np.zeros(n), np.zeros(n), 1.0 / n)
    # a central node that claims more adders than exist cannot overspend: the charge is per release, and a
    # plan of more releases than the budget's is refused by the ledger (another run on the same source)
    from flower_vfl.privacy.store import PartyStore
    store = PartyStore(":memory:")
    a, _ = _party(store=store, run="a", source="src")
    a.distributed_release(1, np.zeros(n), rng.normal(size=n) * 1e-3, 1.0 / n, adders=2, max_bits=38)
    b, _ = _party(store=store, run="b", source="src")
    b.distributed_release(1, np.zeros(n), rng.normal(size=n) * 1e-3, 1.0 / n, adders=2, max_bits=38)
    b.distributed_release(2, np.zeros(n), rng.normal(size=n) * 1e-3, 1.0 / n, adders=2, max_bits=38)
    with pytest.raises(BudgetExceeded):
        b.release_model(3)
