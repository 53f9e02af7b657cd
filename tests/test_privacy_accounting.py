"""Accounting for T Gaussian releases without subsampling, checked against references."""

import math
import subprocess
import sys

import dp_accounting
import pytest
from dp_accounting.pld import PLDAccountant
from scipy.stats import norm

from flower_vfl.privacy import accounting
from flower_vfl.privacy.accounting import (
    METHODS,
    available_methods,
    epsilon_for_releases,
    epsilon_spent,
    noise_multiplier_for,
)

DELTA = 1e-5


def _paper_closed_form(z, T, delta):
    """Theorem 3 + Corollary 1 with δ₀ = δ/(2T), δ' = δ/2, written out independently."""
    d0, dp = delta / (2 * T), delta / 2
    e0 = math.sqrt(2 * math.log(1.25 / d0)) / z
    assert e0 <= 1
    return math.sqrt(2 * T * math.log(1 / dp)) * e0 + T * e0 * (math.exp(e0) - 1)


def _gaussian_delta(eps, mu):
    """Balle & Wang (2018) Thm 8: δ(ε) of a Gaussian with sensitivity/σ = mu."""
    return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)


# ----------------------------------------------------------------------------- exact / pld


@pytest.mark.parametrize("z, T, expected", [(10, 20, 1.760), (2, 10, 7.511)])
def test_exact_reference_values(z, T, expected):
    assert epsilon_spent(z, T, DELTA, "exact") == pytest.approx(expected, abs=5e-3)
    assert epsilon_spent(z, T, DELTA) == epsilon_spent(z, T, DELTA, "exact")


@pytest.mark.parametrize("z, T", [(10, 20), (2, 10)])
def test_exact_solves_the_analytic_gaussian_curve(z, T):
    # T Gaussians at z are one Gaussian at z/sqrt(T): δ(ε_exact) must be the target δ.
    eps = epsilon_spent(z, T, DELTA, "exact")
    assert _gaussian_delta(eps, math.sqrt(T) / z) == pytest.approx(DELTA, rel=1e-6)


@pytest.mark.parametrize("z, T", [(10, 20), (2, 10)])
def test_exact_matches_pld_accountant(z, T):
    pld = PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), T))
    reference = pld.get_epsilon(DELTA)
    assert epsilon_spent(z, T, DELTA, "exact") == pytest.approx(reference, rel=1e-3)
    assert epsilon_spent(z, T, DELTA, "pld") == pytest.approx(reference, rel=1e-6)


def test_heterogeneous_multipliers_compose_to_one_gaussian():
    zs = [4.0, 8.0, 8.0, 16.0]
    z_eff = 1 / math.sqrt(sum(1 / z**2 for z in zs))
    expected = dp_accounting.get_epsilon_gaussian(z_eff, DELTA)
    assert epsilon_for_releases(zs, DELTA, "exact") == pytest.approx(expected, rel=1e-12)
    assert epsilon_for_releases(zs, DELTA, "pld") == pytest.approx(expected, rel=1e-3)
    # equal multipliers: the same as epsilon_spent
    assert epsilon_for_releases([10.0] * 20, DELTA) == pytest.approx(epsilon_spent(10, 20, DELTA))
    assert epsilon_for_releases([], DELTA) == 0.0


def test_monotone_in_noise_and_rounds():
    assert epsilon_spent(5, 10, DELTA) > epsilon_spent(6, 10, DELTA)
    assert epsilon_spent(5, 11, DELTA) > epsilon_spent(5, 10, DELTA)


# ----------------------------------------------------------------------------- paper


def test_paper_route_reproduces_design_value_and_closed_form():
    eps = epsilon_spent(10, 20, DELTA, "paper")
    assert eps == pytest.approx(_paper_closed_form(10, 20, DELTA), rel=1e-12)
    assert eps == pytest.approx(20.52, abs=0.01)  # DESIGN.md: "≈ 20.5"
    assert eps > epsilon_spent(10, 20, DELTA, "exact")


def test_paper_route_heterogeneous_closed_form():
    zs, T = [10.0, 20.0, 40.0], 3
    d0, dp = DELTA / (2 * T), DELTA / 2
    e = [math.sqrt(2 * math.log(1.25 / d0)) / z for z in zs]
    expected = math.sqrt(2 * math.log(1 / dp) * sum(x * x for x in e)) + sum(
        x * (math.exp(x) - 1) for x in e
    )
    assert epsilon_for_releases(zs, DELTA, "paper") == pytest.approx(expected, rel=1e-12)


def test_paper_route_is_inf_outside_theorem_3():
    # z=2: ε₀ = sqrt(2 ln(1.25·2T/δ))/2 ≈ 2.71 > 1
    assert epsilon_spent(2, 10, DELTA, "paper") == math.inf


def test_paper_inversion_refuses_when_eps0_above_one():
    with pytest.raises(ValueError, match=r"per-round ε₀ > 1"):
        noise_multiplier_for(500.0, DELTA, 10, "paper")


# ----------------------------------------------------------------------------- inversion


@pytest.mark.parametrize(
    "method, epsilon, T",
    [("exact", 1.76, 20), ("exact", 20.5, 20), ("exact", 7.5, 10), ("exact", 0.3, 1),
     ("pld", 1.76, 20), ("pld", 0.5, 3), ("paper", 20.5, 20), ("paper", 1.76, 20),
     ("paper", 40.0, 100)],
)
def test_noise_multiplier_for_inverts_epsilon_spent(method, epsilon, T):
    try:
        z = noise_multiplier_for(epsilon, DELTA, T, method)
    except ValueError:
        assert method == "paper" and epsilon < 20  # too small a z for Theorem 3
        return
    spent = epsilon_spent(z, T, DELTA, method)
    assert spent <= epsilon
    assert spent == pytest.approx(epsilon, rel=1e-3)


def test_noise_multiplier_reference():
    assert noise_multiplier_for(1.760, DELTA, 20) == pytest.approx(10.0, rel=5e-3)
    assert noise_multiplier_for(7.511, DELTA, 10) == pytest.approx(2.0, rel=5e-3)
    assert noise_multiplier_for(20.52297, DELTA, 20, "paper") == pytest.approx(10.0, rel=1e-4)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(noise_multiplier=1.0, rounds=0, delta=DELTA), r"rounds=0 must be an integer >= 1"),
        (dict(noise_multiplier=1.0, rounds=2.5, delta=DELTA), r"rounds=2.5 must be an integer"),
        (dict(noise_multiplier=1.0, rounds=True, delta=DELTA), r"rounds=True must be an integer"),
        (dict(noise_multiplier=1.0, rounds=3, delta=0.0), r"delta=0.0 must be .* 0 < delta < 1"),
        (dict(noise_multiplier=1.0, rounds=3, delta=1.0), r"delta=1.0 must be"),
        (dict(noise_multiplier=0.0, rounds=3, delta=DELTA), r"noise_multiplier=0.0 must be .*> 0"),
        (dict(noise_multiplier=-2, rounds=3, delta=DELTA), r"noise_multiplier=-2 must be"),
        (dict(noise_multiplier=math.nan, rounds=3, delta=DELTA), r"noise_multiplier=nan"),
        (dict(noise_multiplier=1.0, rounds=3, delta=DELTA, method="gdp"),
         r"method='gdp' is not supported; accepted values: \('paper', 'exact', 'pld', 'rdp', 'prv'\)"),
    ],
)
def test_epsilon_spent_rejects_bad_input(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        epsilon_spent(**kwargs)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(epsilon=0.0, delta=DELTA, rounds=3), r"epsilon=0.0 must be .*> 0"),
        (dict(epsilon=math.inf, delta=DELTA, rounds=3), r"epsilon=inf must be a finite"),
        (dict(epsilon=1.0, delta=2.0, rounds=3), r"delta=2.0 must be"),
        (dict(epsilon=1.0, delta=DELTA, rounds=-1), r"rounds=-1 must be"),
        (dict(epsilon=1.0, delta=DELTA, rounds=3, method="RDP"), r"method='RDP' is not supported"),
    ],
)
def test_noise_multiplier_for_rejects_bad_input(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        noise_multiplier_for(**kwargs)


# ----------------------------------------------------------------------------- opacus


def test_missing_opacus_raises_helpful_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus.accountants", None)
    monkeypatch.setitem(sys.modules, "opacus", None)
    for method in ("rdp", "prv"):
        with pytest.raises(ImportError, match=r"pip install 'flower-vfl\[opacus\]'"):
            epsilon_spent(10, 20, DELTA, method)


def test_available_methods_without_opacus(monkeypatch):
    monkeypatch.setattr(accounting.importlib.util, "find_spec", lambda name: None)
    assert available_methods() == ("paper", "exact", "pld")


def test_import_pulls_in_neither_torch_nor_flwr():
    code = (
        "import sys, flower_vfl.privacy as p;"
        "p.Ledger(p.PartyStore(':memory:'), 's', p.Budget(1.0, 1e-5), 0).totals();"
        "print(sorted(m for m in ('torch', 'opacus', 'flwr') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_rdp_reference_value():
    pytest.importorskip("opacus")
    assert epsilon_spent(10, 20, DELTA, "rdp") == pytest.approx(1.914, abs=0.01)
    # RDP is an upper bound on the exact curve
    assert epsilon_spent(2, 10, DELTA, "rdp") > epsilon_spent(2, 10, DELTA, "exact")


def test_rdp_uses_orders_beyond_63():
    pytest.importorskip("opacus")
    from opacus.accountants import RDPAccountant

    default = RDPAccountant()
    default.history = [(100.0, 1.0, 1)]
    with pytest.warns(UserWarning, match="largest alpha"):
        eps_default = default.get_epsilon(DELTA)  # optimum sits on order 63
    eps = epsilon_spent(100, 1, DELTA, "rdp")
    exact = epsilon_spent(100, 1, DELTA, "exact")
    assert exact < eps < 1.2 * exact  # 0.0272 < 0.0309
    assert eps < eps_default / 3  # opacus' default orders give 0.106


@pytest.mark.parametrize("z, T", [(10, 20), (2, 10)])
def test_prv_matches_exact(z, T):
    pytest.importorskip("opacus")
    assert epsilon_spent(z, T, DELTA, "prv") == pytest.approx(
        epsilon_spent(z, T, DELTA, "exact"), abs=5e-3
    )


@pytest.mark.parametrize("method", ["rdp", "prv"])
def test_opacus_inversion(method):
    pytest.importorskip("opacus")
    z = noise_multiplier_for(1.76, DELTA, 20, method)
    spent = epsilon_spent(z, 20, DELTA, method)
    assert spent <= 1.76 and spent == pytest.approx(1.76, rel=1e-3)


def test_methods_constant():
    assert METHODS == ("paper", "exact", "pld", "rdp", "prv")
