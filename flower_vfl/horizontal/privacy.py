"""The agent's noise draws and privacy accounting for DP inexact ADMM.

Noise: a Flower agent draws every iteration from OS entropy (:func:`fresh_draw`); it has no
seed, so no two runs share noise. The in-process engine, for experiments, draws iteration t
of run ``stream`` from ``Generator(PCG64(SeedSequence(seed, spawn_key=(stream, t))))``
(``(t,)`` for stream 0; :func:`standard_draw`): the figures reproduce, and a test can give a
Flower agent object the same seed to compare the two paths draw for draw. Global numpy state
is never touched.

Accounting (dp-accounting): one row per iteration records the mechanism, its noise scale and
the sensitivity it was calibrated to. The paper's guarantee is eps_bar-DP *per iteration*
(Theorem 1, eq. 11); a run's privacy is the composition over its T iterations (:func:`account`,
PLD, with basic composition T * eps_bar alongside). A Flower agent charges every release, of
every run, split and variant, in its one :class:`~flower_vfl.privacy.ledger.Ledger` at the
multiplier :func:`noise_multiplier`, where Laplace and Gaussian releases compose in one
privacy-loss distribution against its ``dp-max-epsilon``.
"""

from __future__ import annotations

import bisect
import functools
import math
import secrets
from collections import Counter

import numpy as np

__all__ = ["agent_rng", "fresh_draw", "standard_draw", "ledger_entry", "noise_multiplier", "account",
           "eps_bar_for_total"]

#: a ledger's noise multipliers are composed floored to this many significant digits, and
#: those within MULTIPLIER_RTOL (relative) above the smallest of a group at that smallest one
MULTIPLIER_DIGITS = 7
MULTIPLIER_RTOL = 1e-6


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


def fresh_draw(shape, variant: str) -> np.ndarray:
    """Standard Laplace (ObjP/ObjT) or standard normal (OutP) noise from OS entropy: what a
    Flower agent draws (no seed, nothing to repeat in another run)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(secrets.randbits(128))))
    return rng.standard_normal(shape) if variant == "outp" else rng.laplace(0.0, 1.0, shape)


def noise_multiplier(scale: float, sensitivity: float) -> float:
    """The multiplier ``scale / sensitivity`` a release is charged at, floored to
    MULTIPLIER_DIGITS significant digits (never less privacy cost than the draw; every
    iteration of a calibration gets the same value, so a ledger composes few distinct events)."""
    return _floor_sig(float(scale) / float(sensitivity))


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
