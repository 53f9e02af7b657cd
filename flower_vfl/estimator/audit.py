"""Sensitivity audit: search for neighbouring datasets that maximize ||s - s'||.

For a party's x-update at a recorded target v (from the rounds of a real run), the
audit builds neighbours D' of the party's (normalized) block D, re-solves the x-update
for both, and compares the change of the release with a calibration's C:

- ``strict`` (sample-level): one row replaced by another of norm <= 1; release
  s = clip(D x, c_s); also the parameter change ||x - x'|| against C_x (eval releases).
- ``paper`` (feature-level, Definition 2): one column changed by u with ||u|| <= 1;
  release s = D x (no clipping in the paper); C from Lemma 1.

Neighbours: random replacements, structured ones (negated row, row along +-x, the
column of largest weight) and an adversarial hill-climb on the unit sphere starting
from the best found. Ratios > 1 are violations of the calibration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from flower_vfl.core.penalties import Ball, L2
from flower_vfl.core.xsolve import XSolver
from flower_vfl.privacy.sensitivity import paper_sensitivity, strict_param_sensitivity, strict_sensitivity

__all__ = ["AuditResult", "audit_targets", "audit_private_run"]


@dataclass
class AuditResult:
    relation: str
    C: float
    max_ratio: float = 0.0
    max_param_ratio: float = 0.0
    n_neighbours: int = 0
    worst: dict = field(default_factory=dict)

    def to_dict(self):
        return {"relation": self.relation, "C": self.C, "max_ratio": self.max_ratio,
                "max_param_ratio": self.max_param_ratio, "n_neighbours": self.n_neighbours,
                "worst": self.worst}


def _solve(D, v, lam, rho_x, b1):
    return XSolver(D, L2(), lam, Ball(b1), method="gram").solve(v, rho_x)     # the private party's exact solve


def _unit(u):
    n = np.linalg.norm(u)
    return u / n if n > 0 else u


def audit_targets(D, targets, lam, rho_x, b1, c_v, c_s, relation="strict", n_random=20,
                  n_climb=30, n_parties=2, rho=None, seed=0):
    """Audit one party's block D (rows normalized) at the x-update targets ``targets``.

    Returns an :class:`AuditResult` with the largest ||s - s'|| / C found (and for
    ``strict`` the largest ||x - x'|| / C_x).
    """
    rng = np.random.default_rng(seed)
    D = D.toarray() if sp.issparse(D) else np.array(D, dtype=float)
    n, d = D.shape
    if relation == "strict":
        C = strict_sensitivity(rho_x, lam, b1, c_v, c_s)
        Cx = strict_param_sensitivity(rho_x, lam, b1, c_v)
    elif relation == "paper":
        C = paper_sensitivity(d, rho if rho is not None else rho_x, lam, b1, n_parties)
        Cx = None
    else:
        raise ValueError(f"relation={relation!r}; choose 'strict' or 'paper'")
    res = AuditResult(relation, C)

    for t_idx, v in enumerate(targets):
        v = np.clip(np.asarray(v, dtype=float), -c_v, c_v)
        x = _solve(D, v, lam, rho_x, b1)
        s = np.clip(D @ x, -c_s, c_s) if relation == "strict" else D @ x

        def gap(Dp):
            xp = _solve(Dp, v, lam, rho_x, b1)
            sp_ = np.clip(Dp @ xp, -c_s, c_s) if relation == "strict" else Dp @ xp
            return np.linalg.norm(s - sp_), np.linalg.norm(x - xp)

        def neighbour(idx, u):
            Dp = D.copy()
            if relation == "strict":
                Dp[idx, :] = _unit(u)
            else:
                Dp[:, idx] = D[:, idx] + _unit(u)
            return Dp

        # candidate (index, direction) pairs
        if relation == "strict":
            big = np.argsort(-np.abs(D @ x))[:3]
            cands = [(i, rng.standard_normal(d)) for i in rng.integers(0, n, n_random)]
            cands += [(i, -D[i]) for i in big] + [(i, s_ * x) for i in big for s_ in (1, -1)]
        else:
            j_big = int(np.argmax(np.abs(x)))
            cands = [(j, rng.standard_normal(n)) for j in rng.integers(0, d, n_random)]
            cands += [(j_big, s_ * np.sign(D @ x + 1e-12)) for s_ in (1, -1)]
            cands += [(j_big, s_ * v) for s_ in (1, -1)]
        best = (-1.0, None, None)
        for idx, u in cands:
            g, gx = gap(neighbour(idx, u))
            res.n_neighbours += 1
            if Cx is not None:
                res.max_param_ratio = max(res.max_param_ratio, gx / Cx)
            if g > best[0]:
                best = (g, idx, _unit(u))
        # adversarial hill-climb on the sphere around the best direction
        g0, idx, u = best
        step = 0.5
        for _ in range(n_climb):
            cand = _unit(u + step * rng.standard_normal(u.shape))
            g, gx = gap(neighbour(idx, cand))
            res.n_neighbours += 1
            if Cx is not None:
                res.max_param_ratio = max(res.max_param_ratio, gx / Cx)
            if g > g0:
                g0, u = g, cand
            else:
                step *= 0.8
        if g0 / C > res.max_ratio:
            res.max_ratio = g0 / C
            res.worst = {"target": t_idx, "index": int(idx), "gap": float(g0)}
    return res


def audit_private_run(X_blocks, y, party, lam, privacy, rounds=5, relation="strict",
                      n_random=20, n_climb=30, seed=0, **engine_kw):
    """Run a real private fit for ``rounds`` and audit ``party`` at every round's target."""
    from flower_vfl.estimator.engine import VerticalADMM

    targets = []

    def record(k, model):
        # the private party is idle during the warm start (no x-update, no target)
        t = getattr(model._parties[party].update, "last_target", None)
        if t is not None and (not targets or t is not targets[-1]):
            targets.append(t)

    model = VerticalADMM(lam=lam, max_rounds=rounds, tol=0, privacy=privacy, callback=record,
                         **engine_kw).fit(X_blocks, y)
    p = model._parties[party]
    record(None, model)               # the final, unreleased x-update (evaluation releases use it)
    c, rho = p.config, model._central.rho
    rho_x = rho / model._central.theta
    return audit_targets(p.D, targets, lam, rho_x, c.b1, c.c_v, c.c_s, relation=relation,
                         n_random=n_random, n_climb=n_climb, n_parties=len(X_blocks), rho=rho,
                         seed=seed)
