"""Privacy accounting for repeated Gaussian releases ``s̃_m = D_m x_m + e``.

A party releases one vector per round (training *and* evaluation rounds). Each
release is a Gaussian mechanism with noise multiplier ``z = sigma / C`` where ``C``
is the L2 sensitivity of the released vector under the chosen neighbouring
relation. There is no subsampling: every round touches the whole local dataset.

Mechanisms record *what was done* (a list of noise multipliers, or a
``dp_accounting`` event); the functions here answer *how much it cost*. Methods:

``"exact"``
    ``T`` Gaussian releases with multipliers ``z_t`` are exactly one Gaussian
    mechanism with ``1 / z_eff**2 = sum_t 1 / z_t**2`` (``z / sqrt(T)`` when all are
    equal). Its ε at δ is the analytic Gaussian curve (Balle & Wang 2018), computed
    by ``dp_accounting.get_epsilon_gaussian``. Tight.
``"pld"``
    dp-accounting's privacy-loss-distribution accountant, for a ledger that mixes
    Laplace and Gaussian releases. Gaussian releases alone compose exactly into one
    Gaussian, whose PLD is the analytic curve: there ``"pld"`` answers with
    ``"exact"``'s closed form (bitwise), since a discretised PLD of small multipliers is
    unbounded work (measured: ε=100 over 10 releases, 74 s to calibrate and 11 s per
    ledger check; over 100 releases, more than 10 minutes). A mix is discretised at
    :func:`pld_interval` (``PLD_DISCRETIZATION``, coarser for large ε so that the work
    stays bounded; PLD's pessimistic rounding keeps the answer an upper bound).
``"paper"``
    Theorem 3 + Corollary 1 of the paper: per-round ``ε₀ = sqrt(2 ln(1.25/δ₀)) / z``
    (valid only for ``ε₀ <= 1``), composed with the advanced composition theorem
    ``ε = sqrt(2 T ln(1/δ')) ε₀ + T ε₀ (e^{ε₀} - 1)``, total ``δ = T δ₀ + δ'``.
    The total δ is split as ``δ' = δ/2`` and ``δ₀ = δ/(2T)``. (This split gives
    ε = 20.52 at z=10, T=20, δ=1e-5, the value quoted in the design notes.)
    Returns ``math.inf`` when ``ε₀ > 1``: Theorem 3 says nothing there.
``"rdp"``, ``"prv"``
    opacus' ``RDPAccountant`` (with orders extended well past opacus' default 63)
    and ``PRVAccountant`` at sample rate 1. opacus imports torch, so it is imported
    lazily and only for these two methods.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import numbers
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import dp_accounting

__all__ = [
    "METHODS",
    "MECHANISMS",
    "available_methods",
    "calibrate_sigma",
    "composed_event",
    "epsilon_for_events",
    "epsilon_for_releases",
    "epsilon_spent",
    "noise_multiplier_for",
    "paper_round_epsilon",
    "INTEGER_ORDERS",
    "epsilon_rdp",
    "noise_multiplier_rdp",
]


def dpa():
    """``dp_accounting``, imported on first use: with the scipy.stats it pulls in it is ~1 s of a
    process's start-up, which a party or a central node without privacy never needs (issue 24,
    item 5: the README's job starts a ClientApp per party)."""
    import dp_accounting
    return dp_accounting

METHODS = ("paper", "exact", "pld", "rdp", "prv")
_OPACUS_METHODS = ("rdp", "prv")
_OPACUS_HINT = "pip install 'flower-vfl[opacus]'"

# opacus' default RDP orders stop at 63; large effective multipliers need larger
# orders (the optimum is near z_eff * sqrt(2 ln(1/δ))).
RDP_ORDERS = tuple(
    [1.0 + x / 20.0 for x in range(1, 400)]  # 1.05 .. 20.95, a superset of opacus' fractions
    + list(range(21, 64))
    + [72, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 1024,
       1536, 2048, 3072, 4096]
)
PRV_EPS_ERROR = 1e-3
PLD_DISCRETIZATION = 1e-4


# ----------------------------------------------------------------------------
# validation at the boundary


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not supported; accepted values: {METHODS}")
    return method


def _check_rounds(rounds) -> int:
    if isinstance(rounds, bool) or not isinstance(rounds, numbers.Integral) or rounds < 1:
        raise ValueError(f"rounds={rounds!r} must be an integer >= 1")
    return int(rounds)


def check_delta(delta) -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta={delta!r} must be a real number with 0 < delta < 1")
    return float(delta)


def check_positive(name: str, value) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value <= 0.0
    ):
        raise ValueError(f"{name}={value!r} must be a finite real number > 0")
    return float(value)


def available_methods() -> tuple[str, ...]:
    """Methods usable here; ``"rdp"``/``"prv"`` only if opacus is installed (not imported)."""
    if importlib.util.find_spec("opacus") is None:
        return tuple(m for m in METHODS if m not in _OPACUS_METHODS)
    return METHODS


def import_opacus_accountants():
    try:
        from opacus.accountants import PRVAccountant, RDPAccountant
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"the 'rdp' and 'prv' accounting methods need opacus; install it with "
            f"`{_OPACUS_HINT}`"
        ) from exc
    return RDPAccountant, PRVAccountant


# ----------------------------------------------------------------------------
# events: what was done


def composed_event(noise_multipliers: Iterable[float]) -> dp_accounting.DpEvent:
    """The dp-accounting event for a sequence of Gaussian releases (no subsampling)."""
    counts = Counter(float(z) for z in noise_multipliers)
    parts = [
        dpa().SelfComposedDpEvent(dpa().GaussianDpEvent(z), n)
        for z, n in sorted(counts.items())
    ]
    if len(parts) == 1:
        return parts[0]
    return dpa().ComposedDpEvent(parts)


# ----------------------------------------------------------------------------
# accountants: how much it cost


def paper_round_epsilon(noise_multiplier: float, delta0: float) -> float:
    """Theorem 3 per-round ε₀ = sqrt(2 ln(1.25/δ₀)) / z; ``math.inf`` if ε₀ > 1 (invalid)."""
    eps0 = math.sqrt(2.0 * math.log(1.25 / delta0)) / noise_multiplier
    return eps0 if eps0 <= 1.0 else math.inf


def _paper_split(delta: float, rounds: int) -> tuple[float, float]:
    """(δ₀, δ'): δ' = δ/2 for advanced composition, δ/2 shared by the T rounds."""
    return delta / (2.0 * rounds), delta / 2.0


def _eps_paper(zs: Sequence[float], delta: float) -> float:
    # Advanced composition (Dwork, Rothblum & Vadhan 2010), in the heterogeneous form
    # sqrt(2 ln(1/δ') Σ ε_t²) + Σ ε_t (e^{ε_t} - 1); equals Corollary 1 for equal ε_t.
    delta0, delta_prime = _paper_split(delta, len(zs))
    eps0 = [paper_round_epsilon(z, delta0) for z in zs]
    if any(math.isinf(e) for e in eps0):
        return math.inf
    return math.sqrt(2.0 * math.log(1.0 / delta_prime) * sum(e * e for e in eps0)) + sum(
        e * math.expm1(e) for e in eps0
    )


def _eps_exact(zs: Sequence[float], delta: float) -> float:
    z_eff = 1.0 / math.sqrt(sum(1.0 / (z * z) for z in zs))
    return float(dpa().get_epsilon_gaussian(z_eff, delta))


def _eps_pld(zs: Sequence[float], delta: float) -> float:
    # Gaussians compose exactly into one Gaussian (z_eff), whose privacy-loss distribution is
    # the analytic curve: the discretised PLD only approximates it, at a cost that grows as
    # 1/z_eff^2 (module docstring). The closed form is the PLD's exact value.
    return _eps_exact(zs, delta)


#: points a mixed (Laplace + Gaussian) privacy-loss distribution may span, about: the
#: discretisation interval is widened past PLD_DISCRETIZATION to keep under it
PLD_MAX_POINTS = 2e5


def pld_interval(groups) -> float:
    """The PLD discretisation interval for ((mechanism, z), count) groups: PLD_DISCRETIZATION,
    widened so that an upper bound on the composed loss (basic composition of the Laplace
    parts' ε = 1/z each, plus the Gaussian parts' exact ε at δ = 1e-12) spans at most
    PLD_MAX_POINTS intervals. Coarser intervals only round the loss up (pessimistic)."""
    lap = sum(n / z for (m, z), n in groups if m == "laplace")
    gz = [z for (m, z), n in groups if m == "gaussian" for _ in range(n)]
    bound = lap + (_eps_exact(gz, 1e-12) if gz else 0.0)
    return max(PLD_DISCRETIZATION, bound / PLD_MAX_POINTS)


def _opacus_history(zs: Sequence[float]) -> list[tuple[float, float, int]]:
    return [(z, 1.0, n) for z, n in sorted(Counter(float(z) for z in zs).items())]


def _eps_rdp(zs: Sequence[float], delta: float) -> float:
    RDPAccountant, _ = import_opacus_accountants()
    accountant = RDPAccountant()
    accountant.history = _opacus_history(zs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "optimal order is the largest alpha"
        return float(accountant.get_epsilon(delta, alphas=list(RDP_ORDERS)))


def _eps_prv(zs: Sequence[float], delta: float) -> float:
    _, PRVAccountant = import_opacus_accountants()
    accountant = PRVAccountant()
    accountant.history = _opacus_history(zs)
    # sample rate 1 makes opacus take log(1 - q) = -inf; that branch is handled
    # correctly by np.where, only the warning is noise.
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")
        return float(accountant.get_epsilon(delta, eps_error=PRV_EPS_ERROR))


_EPSILON = {
    "paper": _eps_paper,
    "exact": _eps_exact,
    "pld": _eps_pld,
    "rdp": _eps_rdp,
    "prv": _eps_prv,
}


def epsilon_for_releases(
    noise_multipliers: Sequence[float], delta: float, method: str = "exact"
) -> float:
    """Total ε at ``delta`` after Gaussian releases with the given multipliers.

    Parameters
    ----------
    noise_multipliers : sequence of float
        One ``z_t = sigma_t / C_t`` per release; may differ between releases.
        An empty sequence costs ε = 0.
    delta : float
        Total δ, ``0 < delta < 1``.
    method : str, default="exact"
        One of ``METHODS``; see the module docstring.
    """
    check_method(method)
    delta = check_delta(delta)
    zs = [check_positive("noise_multiplier", z) for z in noise_multipliers]
    if not zs:
        return 0.0
    return _EPSILON[method](zs, delta)


#: the mechanisms a ledger composes (a release's ``mechanism`` column)
#: "skellam": a distributed release in the integer domain (flower_vfl.privacy.distributed), stored with
#: the multiplier of a Gaussian RDP curve that bounds its RDP at every integer order (composed by RDP)
MECHANISMS = ("gaussian", "laplace", "skellam")


def epsilon_for_events(events: Sequence[tuple[str, float]], delta: float, method: str = "exact") -> float:
    """Total ε at ``delta`` of releases ``(mechanism, noise multiplier)`` in any mix.

    Gaussian releases alone go to :func:`epsilon_for_releases` with ``method``. A mix with
    Laplace releases (``scale / sensitivity`` as the multiplier) is composed in one
    privacy-loss distribution (dp-accounting's ``PLDAccountant``), whatever ``method`` says
    among ``"exact"``/``"pld"``; the other methods have no Laplace curve and refuse.
    """
    check_method(method)
    delta = check_delta(delta)
    events = [(str(m), check_positive("noise_multiplier", z)) for m, z in events]
    bad = sorted({m for m, _ in events} - set(MECHANISMS))
    if bad:
        raise ValueError(f"mechanism(s) {bad} are not supported; accepted values: {MECHANISMS}")
    if all(m == "gaussian" for m, _ in events):
        return epsilon_for_releases([z for _, z in events], delta, method)
    if any(m == "skellam" for m, _ in events):      # distributed releases: RDP, whatever the method
        return epsilon_rdp(events, delta)
    if method not in ("exact", "pld"):
        raise ValueError(f"method={method!r} cannot compose Laplace releases; use 'pld' (or 'exact', "
                         "which composes a mix in one privacy-loss distribution)")
    return _eps_mixed(tuple(sorted(Counter(events).items())), delta)


@functools.lru_cache(maxsize=1024)
def _eps_mixed(groups, delta: float) -> float:
    """PLD ε of ((mechanism, z), count) groups (cached: a ledger is re-checked on every release,
    and a refused request asks again about the same releases)."""
    from dp_accounting.pld import PLDAccountant

    accountant = PLDAccountant(value_discretization_interval=pld_interval(groups))
    for (mech, z), n in groups:
        ev = dpa().LaplaceDpEvent(z) if mech == "laplace" else dpa().GaussianDpEvent(z)
        accountant.compose(dpa().SelfComposedDpEvent(ev, n))
    return float(accountant.get_epsilon(delta))


def epsilon_spent(noise_multiplier, rounds, delta, method="exact") -> float:
    """ε at ``delta`` after ``rounds`` Gaussian releases with multiplier ``z = sigma/C``.

    Parameters
    ----------
    noise_multiplier : float
        ``z = sigma / C`` (> 0).
    rounds : int
        Number of releases ``T >= 1`` (training and evaluation rounds alike).
    delta : float
        Total δ, ``0 < delta < 1``.
    method : {"exact", "pld", "paper", "rdp", "prv"}, default="exact"
        ``"paper"`` returns ``math.inf`` when the Theorem 3 per-round ε₀ exceeds 1.

    Returns
    -------
    float
        The total ε.
    """
    check_method(method)
    z = check_positive("noise_multiplier", noise_multiplier)
    rounds = _check_rounds(rounds)
    delta = check_delta(delta)
    if method in ("exact", "pld"):  # one Gaussian at z / sqrt(T) (module docstring)
        return float(dpa().get_epsilon_gaussian(z / math.sqrt(rounds), delta))
    return _EPSILON[method]([z] * rounds, delta)


# ----------------------------------------------------------------------------
# calibration: the inverse


def _paper_noise_multiplier(epsilon: float, delta: float, rounds: int) -> float:
    delta0, delta_prime = _paper_split(delta, rounds)
    log_term = math.log(1.0 / delta_prime)

    def total(eps0: float) -> float:  # Corollary 1
        return math.sqrt(2.0 * rounds * log_term) * eps0 + rounds * eps0 * math.expm1(eps0)

    if total(1.0) < epsilon:
        z_min = math.sqrt(2.0 * math.log(1.25 / delta0))
        raise ValueError(
            f"epsilon={epsilon!r} cannot be met by the 'paper' method with rounds={rounds}, "
            f"delta={delta!r}: it needs a per-round ε₀ > 1, where Theorem 3 does not hold "
            f"(ε₀ = 1, i.e. z = {z_min:.4g}, already gives ε = {total(1.0):.4g}); use "
            f"method='exact' or a smaller epsilon"
        )
    import scipy.optimize                     # here: a party's message without privacy never needs it
    eps0 = scipy.optimize.brentq(lambda e: total(e) - epsilon, 1e-300, 1.0, xtol=1e-15, rtol=1e-12)
    return math.sqrt(2.0 * math.log(1.25 / delta0)) / eps0


def _invert(f, target: float, z0: float) -> float:
    """Solve f(z) = target for z > 0 (f decreasing), bracketing geometrically around z0."""
    # z0 (the exact calibration) is usually within a few percent: widen the bracket
    # slowly so that slow accountants (PLD, PRV) need only a handful of evaluations.
    lo = hi = z0
    factor = 1.005
    while f(lo) < target:
        hi, lo = lo, lo / factor
        factor *= factor
    factor = 1.005
    while f(hi) > target:
        lo, hi = hi, hi * factor
        factor *= factor
    if lo == hi:
        return lo
    import scipy.optimize
    log_z = scipy.optimize.brentq(
        lambda u: f(math.exp(u)) - target, math.log(lo), math.log(hi), xtol=1e-5
    )
    return math.exp(log_z)


def calibrate_sigma(epsilon, delta, rounds, sensitivity, method="exact") -> float:
    """σ = z·C with z = :func:`noise_multiplier_for` (epsilon, delta, rounds, method)."""
    sensitivity = check_positive("sensitivity", sensitivity)
    return noise_multiplier_for(epsilon, delta, rounds, method) * sensitivity


def noise_multiplier_for(epsilon, delta, rounds, method="exact") -> float:
    """Smallest-ish ``z = sigma/C`` such that ``rounds`` releases cost at most ``epsilon``.

    The result satisfies ``epsilon_spent(z, rounds, delta, method) <= epsilon`` and is
    within 1e-3 relative of equality.

    Parameters
    ----------
    epsilon : float
        Target total ε (> 0).
    delta : float
        Target total δ, ``0 < delta < 1``.
    rounds : int
        Number of planned releases ``T >= 1``, evaluation rounds included.
    method : {"exact", "pld", "paper", "rdp", "prv"}, default="exact"

    Raises
    ------
    ValueError
        On bad input, or for ``"paper"`` when the target needs a per-round ε₀ > 1.
    """
    check_method(method)
    epsilon = check_positive("epsilon", epsilon)
    delta = check_delta(delta)
    rounds = _check_rounds(rounds)

    def spent(z: float) -> float:
        return epsilon_spent(z, rounds, delta, method)

    if method == "paper":
        z = _paper_noise_multiplier(epsilon, delta, rounds)
    else:
        # dp-accounting's own calibration for one Gaussian, scaled by sqrt(T)
        z = float(dpa().get_sigma_gaussian(epsilon, delta)) * math.sqrt(rounds)
        if method not in ("exact", "pld"):        # "pld" of Gaussians is the closed form
            z = _invert(spent, epsilon, z)
    # Round towards privacy: never hand back a z that overspends the target.
    step = 1e-6
    while spent(z) > epsilon:
        z *= 1.0 + step
        step *= 2.0
    return z


# ----------------------------------------------------------------------------
# RDP at integer orders: ledgers that hold distributed (Skellam) releases


#: integer Renyi orders only: the Skellam bound (Agarwal, Kairouz & Liu 2021, Corollary 3.6) is proved for
#: integer alpha > 1, so no fractional order may enter a composition that holds a Skellam release
INTEGER_ORDERS = tuple(range(2, 257)) + (288, 320, 384, 448, 512, 640, 768, 1024, 1536, 2048, 4096, 8192)


def epsilon_rdp(events: Sequence[tuple[str, float]], delta: float) -> float:
    """Total epsilon at ``delta`` of ``(mechanism, z)`` releases composed by Renyi DP at integer orders.

    ``"gaussian"`` and ``"skellam"`` entries are Gaussian RDP curves alpha / (2 z^2) (exact for a Gaussian;
    for a Skellam release, ``z`` is :func:`flower_vfl.privacy.distributed.dominating_multiplier`, whose curve
    bounds the paper's RDP bound at every integer order); ``"laplace"`` entries are dp-accounting's Laplace
    RDP. dp-accounting's ``RdpAccountant`` composes them and converts to (epsilon, delta)."""
    delta = check_delta(delta)
    from dp_accounting.rdp import RdpAccountant     # local: the module's import lines are shared
    accountant = RdpAccountant(orders=list(INTEGER_ORDERS))
    for (mech, z), n in sorted(Counter((str(m), check_positive("noise_multiplier", z)) for m, z in events).items()):
        if mech not in MECHANISMS:
            raise ValueError(f"mechanism {mech!r} is not supported; accepted values: {MECHANISMS}")
        ev = dpa().LaplaceDpEvent(z) if mech == "laplace" else dpa().GaussianDpEvent(z)
        accountant.compose(ev, n)
    return float(accountant.get_epsilon(delta)) if events else 0.0


def noise_multiplier_rdp(epsilon, delta, rounds) -> float:
    """Smallest-ish z such that ``rounds`` Gaussian-RDP releases at z cost at most ``epsilon`` under
    :func:`epsilon_rdp` (within 1e-6 relative of equality)."""
    epsilon = check_positive("epsilon", epsilon)
    delta = check_delta(delta)
    rounds = _check_rounds(rounds)

    def spent(z):
        return epsilon_rdp([("gaussian", z)] * rounds, delta)

    lo = hi = float(dpa().get_sigma_gaussian(epsilon, delta)) * math.sqrt(rounds)
    while spent(hi) > epsilon:
        hi *= 1.5
    while spent(lo) <= epsilon:
        lo /= 1.5
    for _ in range(60):                      # bisection on log z: spent is decreasing in z
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if spent(mid) <= epsilon else (mid, hi)
        if hi / lo < 1 + 1e-7:
            break
    return hi
