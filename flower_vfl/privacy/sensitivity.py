"""L2 sensitivity of a party's releases: the paper's Lemma 1 and our strict bound.

Both are pure functions of public configuration (never of the data), so printing or
sending them leaks nothing. The derivation of ``strict`` is in docs/privacy.md; the
audit (:mod:`flower_vfl.estimator.audit`) searches for neighbours that violate either.

Notation: the party's x-update (eq. 6, completed square) is

    x = argmin_{||x|| <= b1}  lam/2 ||x||^2 + rho_x/2 ||D x - v||^2,

with rows of D normalized (||D_i|| <= 1), the target v clipped entry-wise to
[-c_v, c_v] by the party, and the released values clipped to [-c_s, c_s].
"""

from __future__ import annotations

import math

__all__ = ["paper_sensitivity", "strict_sensitivity", "strict_param_sensitivity",
           "NEIGHBOURING_RELATIONS"]

NEIGHBOURING_RELATIONS = {
    "paper": "feature-level: D_m and D'_m differ in one feature column with ||D_m - D'_m|| <= 1 "
             "(paper Definition 2)",
    "strict": "sample-level: D_m and D'_m differ in one sample's row (both rows of norm <= 1); "
              "the rest of the transcript is fixed (adaptive composition)",
}


def paper_sensitivity(d_m: int, rho: float, lam: float, b1: float, n_parties: int,
                      c1: float = 1.0) -> float:
    """Lemma 1: C = 3/(d_m rho) [lam c1 + (1 + M rho) b1] (feature-level relation).

    Reproduced for comparison only; the audit finds neighbours that exceed it (the step
    ||(D^T D)^{-1}|| = 1/d_m does not follow from unit rows). See docs/privacy.md.
    """
    _positive(d_m=d_m, rho=rho, b1=b1, n_parties=n_parties)
    if lam < 0 or c1 < 0:
        raise ValueError(f"lam and c1 must be >= 0; got lam={lam!r}, c1={c1!r}")
    return 3.0 / (d_m * rho) * (lam * c1 + (1.0 + n_parties * rho) * b1)


def strict_sensitivity(rho_x: float, lam: float, b1: float, c_v: float, c_s: float) -> float:
    """Sample-level L2 sensitivity of one training release s = clip(D x, c_s).

    ||s - s'||^2 <= (2 A / sqrt(lam rho_x))^2 + (2 min(b1, c_s))^2,  A = rho_x (b1 + c_v):
    the first term bounds the N-1 unchanged rows through the H-norm of x - x'
    (H = lam I + rho_x D_{-i}^T D_{-i}), the second the changed row itself.
    """
    _positive(rho_x=rho_x, lam=lam, b1=b1, c_v=c_v, c_s=c_s)
    A = rho_x * (b1 + c_v)
    return math.sqrt(4.0 * A * A / (lam * rho_x) + 4.0 * min(b1, c_s) ** 2)


def strict_param_sensitivity(rho_x: float, lam: float, b1: float, c_v: float) -> float:
    """Sample-level L2 sensitivity of x itself: ||x - x'|| <= 2 rho_x (b1 + c_v) / lam.

    Used for evaluation releases: the party perturbs x (x~ = x + N(0, sigma^2 I)) and
    releases D_test x~, a post-processing of x~ since D_test is the same for both
    neighbours (the relation changes a training row).
    """
    _positive(rho_x=rho_x, lam=lam, b1=b1, c_v=c_v)
    return 2.0 * rho_x * (b1 + c_v) / lam


def _positive(**kw):
    for k, v in kw.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{k} must be a finite number > 0; got {k}={v!r}")
    if "lam" in kw and "rho_x" in kw and not kw["lam"] * kw["rho_x"] > 0.0:
        # a subnormal rho (5e-324) makes lam * rho_x round to 0: no finite bound, not a ZeroDivisionError
        raise ValueError(f"lam * rho_x underflows to 0 (lam={kw['lam']!r}, rho_x={kw['rho_x']!r}); no finite "
                         "sensitivity")
