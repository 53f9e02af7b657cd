"""The agent's noise draws and privacy accounting for DP inexact ADMM.

Noise: iteration t of run ``stream`` of an agent draws from
``Generator(PCG64(SeedSequence(seed, spawn_key=(stream, t))))`` (``(t,)`` for stream 0) where ``seed`` is the agent's
own secret (its node config, or OS entropy kept on its disk). A draw depends only on
(seed, stream, t): the in-process engine and a Flower agent with the same seed and run id
draw the same noise, a replayed iteration can only reproduce the draw it already made
(never a second, independent one), and two runs never share noise. Global numpy state is
never touched.

Accounting (dp-accounting): an agent's ledger records, per iteration, the mechanism, its
noise scale and the sensitivity it was calibrated to. The paper's guarantee is eps_bar-DP
*per iteration* (Theorem 1, eq. 11); the run's privacy is the composition over the T
iterations, computed here with the PLD accountant (and basic composition T * eps_bar
alongside). OutP's iterations are Gaussian mechanisms (Huang et al.), composed the same way.
"""

from __future__ import annotations

import bisect
import functools
import math
import secrets
from collections import Counter

import numpy as np

__all__ = ["new_agent_seed", "agent_rng", "standard_draw", "ledger_entry", "account", "eps_bar_for_total"]

#: a ledger's noise multipliers are composed floored to this many significant digits, and
#: those within MULTIPLIER_RTOL (relative) above the smallest of a group at that smallest one
MULTIPLIER_DIGITS = 7
MULTIPLIER_RTOL = 1e-6


def new_agent_seed() -> int:
    """A 128-bit seed from OS entropy (for an agent without a configured seed)."""
    return secrets.randbits(128)


def agent_rng(seed: int, t: int, stream: int = 0) -> np.random.Generator:
    """The generator of iteration ``t`` of run ``stream`` of the agent with secret ``seed``."""
    if seed is None or int(seed) < 0:
        raise ValueError(f"seed={seed!r}; give a non-negative int (the agent's own secret)")
    # stream 0 (the in-process engine's default) keeps the one-element key of the first
    # version, so the committed simulation results reproduce draw for draw
    key = (int(t),) if int(stream) == 0 else (int(stream), int(t))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=key)))


def standard_draw(seed: int, t: int, shape, variant: str, stream: int = 0) -> np.ndarray:
    """Standard Laplace (ObjP/ObjT, eq. 11a with unit scale) or standard normal (OutP) noise."""
    rng = agent_rng(seed, t, stream)
    if variant == "outp":
        return rng.standard_normal(shape)
    return rng.laplace(0.0, 1.0, shape)


def ledger_entry(t: int, variant: str, eps_bar: float, delta_bar: float, scale: float,
                 sensitivity: float) -> dict:
    """What one iteration released and how it was calibrated (one row of an agent's ledger)."""
    return {"t": int(t), "mechanism": "gaussian" if variant == "outp" else "laplace",
            "eps_bar": float(eps_bar), "delta_bar": float(delta_bar) if variant == "outp" else 0.0,
            "scale": float(scale), "sensitivity": float(sensitivity)}


def _floor_sig(x: float, digits: int = MULTIPLIER_DIGITS) -> float:
    """``x > 0`` rounded *down* to ``digits`` significant digits (never above ``x``)."""
    q = 10.0 ** (digits - 1 - math.floor(math.log10(x)))
    v = math.floor(x * q) / q
    while v > x:                      # x * q may have rounded up across an integer
        v = math.nextafter(v, 0.0)
    return v


def _events(entries):
    """The ledger as ((mechanism, noise multiplier), count) groups, rounded so as never to
    understate the privacy cost.

    Multipliers (scale / sensitivity) within a relative MULTIPLIER_RTOL above the smallest
    of a group are all charged at that smallest one, floored to MULTIPLIER_DIGITS significant
    digits: a smaller multiplier is less noise, so the composition of these events bounds
    that of the drawn ones from above (by at most ~2e-6 relative in epsilon). Without it a
    float32 run, whose scale and sensitivity are rounded separately, gives hundreds of
    multipliers that differ in the 8th digit, each composed on its own (tens of seconds per
    agent at T = 1000 instead of one cached composition).
    """
    by_mech = {}
    for e in entries:
        if e["sensitivity"] > 0:
            by_mech.setdefault(e["mechanism"], []).append(e["scale"] / e["sensitivity"])
    out = Counter()
    for mech, ms in by_mech.items():
        ms.sort()
        i = 0
        while i < len(ms):
            j = bisect.bisect_right(ms, ms[i] * (1.0 + MULTIPLIER_RTOL), i)
            out[(mech, _floor_sig(ms[i]))] += j - i
            i = j
    return tuple(sorted(out.items()))


@functools.lru_cache(maxsize=4096)
def _pld_epsilon(events, delta: float) -> float:
    """PLD epsilon of the composition ``events`` ((mechanism, multiplier), count) at delta
    (cached: every agent of a run usually has the same ledger signature)."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant
    acc = PLDAccountant(value_discretization_interval=1e-3)
    for (mech, z), n in events:
        ev = dp_accounting.LaplaceDpEvent(z) if mech == "laplace" else dp_accounting.GaussianDpEvent(z)
        acc.compose(dp_accounting.SelfComposedDpEvent(ev, n))
    return float(acc.get_epsilon(delta))


def account(entries, delta: float = 1e-5) -> dict:
    """Total privacy of one agent over the iterations in ``entries`` (its ledger).

    Returns per-iteration eps_bar (as configured), the number of releases, the PLD total
    (epsilon at ``delta``), and basic composition (sum of the per-iteration eps_bar, with
    sum of delta_bar for OutP). Iterations with a zero sensitivity (an agent whose
    residuals vanished) release nothing data-dependent and cost nothing.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta={delta!r}; must lie in (0, 1)")
    entries = list(entries)
    out = {"releases": len(entries), "delta": delta}
    if not entries:
        return {**out, "eps_bar": None, "epsilon_pld": 0.0, "epsilon_basic": 0.0, "delta_basic": 0.0}
    out["eps_bar"] = float(entries[-1]["eps_bar"])
    out["epsilon_basic"] = float(sum(e["eps_bar"] for e in entries))
    out["delta_basic"] = float(sum(e["delta_bar"] for e in entries))
    eps = _pld_epsilon(_events(entries), float(delta))
    out["epsilon_pld"] = float(eps) if math.isfinite(eps) else math.inf
    return out


def eps_bar_for_total(total_epsilon: float, T: int, delta: float = 1e-5, variant: str = "objt",
                      delta_bar: float = 1e-6) -> float:
    """The per-iteration eps_bar whose T-fold composition costs ``total_epsilon`` at ``delta``.

    ObjP/ObjT: T Laplace mechanisms with noise multiplier 1/eps_bar, composed by the PLD
    accountant (:func:`account`); eps_bar lies in [total/T, total] (basic composition and a
    single release bound it). OutP: T Gaussians with multiplier z = sqrt(2 ln(1.25/delta_bar))
    / eps_bar are exactly one Gaussian with z/sqrt(T) (dp_accounting.get_epsilon_gaussian).
    Solved with scipy's brentq (the totals are monotone in eps_bar).
    """
    import dp_accounting
    import scipy.optimize
    if not (total_epsilon > 0 and int(T) >= 1):
        raise ValueError(f"total_epsilon={total_epsilon!r}, T={T!r}; need total_epsilon > 0 and T >= 1")
    T = int(T)
    if variant == "outp":
        c = math.sqrt(2 * math.log(1.25 / delta_bar))

        def gap(log_eb):
            z = c / math.exp(log_eb) / math.sqrt(T)
            return dp_accounting.get_epsilon_gaussian(z, delta) - total_epsilon

        lo, hi = math.log(1e-6), math.log(1e4)
    else:
        def gap(log_eb):
            eb = math.exp(log_eb)
            e = {"mechanism": "laplace", "scale": 1.0 / eb, "sensitivity": 1.0, "eps_bar": eb, "delta_bar": 0.0}
            return account([e] * T, delta)["epsilon_pld"] - total_epsilon

        lo, hi = math.log(total_epsilon / T * 0.999), math.log(total_epsilon * 1.001)
        if T == 1:
            return float(total_epsilon)
    return float(math.exp(scipy.optimize.brentq(gap, lo, hi, xtol=1e-4)))
