"""A paper-style ADMM sharing round (Hu et al., Sec. 3 and 5) and a check that ours computes the same round.

The paper's prototype "use[s] optimization library from scipy [...] L-BFGS-B algorithm to do
the x update in (6) and entry-wise optimization for z in (7)". This file implements exactly that
on our problem (logistic loss averaged over N, L2 with lam, no intercept, the paper's eq. 6-8
verbatim, i.e. ``variant="paper"`` semantics: theta = 1, alpha = 1):

- party m (Alg. 1 l. 3-6): pull r = sum_k s_k - z and y, subtract its cached s_m, and solve
  eq. (6) ``min_x lam/2 ||x||^2 + <y, D_m x> + rho/2 ||r_{-m} + D_m x - z||^2`` with
  ``scipy.optimize.minimize(method="L-BFGS-B", jac=True)`` warm-started at its last x_m;
  push s_m = D_m x_m.
- central node (l. 8-12): for every sample i, in a Python loop,
  ``scipy.optimize.minimize_scalar`` of ``(1/N) log(1 + e^{-t_i z}) - y_i z + rho/2 (z - a_i)^2``
  (eq. 7), then y <- y + rho (a - z) (eq. 8).

``python benchmarks/paper_style.py`` runs one such round and one round of
``PartyUpdate.step(..., theta=1.0)`` + ``CentralUpdate(fit_intercept=False).step`` from the same
mid-run a9a state and prints the largest differences (exit status 1 if they exceed 1e-6).
``--quick`` does the same on the first 4000 training rows.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from scipy.optimize import minimize, minimize_scalar

import _common as C

#: L-BFGS-B tolerances tight enough that the x-update is solved to ~1e-9 in s_m = D_m x_m. The
#: subproblem's values are O(1/N) and O(rho) (1e-5 .. 1e-6), so scipy's defaults (ftol=2.2e-9
#: on max(|f|, 1), gtol=1e-5) stop early; both are measured in bench_round.py.
LBFGSB_TIGHT = {"ftol": 0.0, "gtol": 1e-12, "maxiter": 15000}
LBFGSB_DEFAULT: dict = {}
TOL = 1e-6


class PaperParty:
    """One party: eq. (6) by scipy L-BFGS-B (Alg. 1, lines 3-6)."""

    def __init__(self, D, lam, options=None):
        self.D, self.lam = D, float(lam)
        self.options = LBFGSB_TIGHT if options is None else options
        self.x = np.zeros(D.shape[1])
        self.s = np.zeros(D.shape[0])
        self.nit = 0

    def step(self, r, y, rho):
        """``r`` = sum_k D_k x_k - z as pulled from the central node; returns s_m = D_m x_m."""
        D, lam = self.D, self.lam
        c = r - self.s                       # sum_{k != m} D_k x_k - z   (Alg. 1, line 4)

        def fg(x):
            Dx = D @ x
            u = c + Dx
            f = 0.5 * lam * (x @ x) + y @ Dx + 0.5 * rho * (u @ u)
            g = lam * x + D.T @ (y + rho * u)
            return f, g

        res = minimize(fg, self.x, jac=True, method="L-BFGS-B", options=self.options)
        self.nit += res.nit
        self.x = res.x
        self.s = D @ self.x
        return self.s


def _softplus(u):
    """log(1 + e^u) without overflow (scalar)."""
    return u + math.log1p(math.exp(-u)) if u > 0 else math.log1p(math.exp(u))


class PaperCentral:
    """The central node: eq. (7) entry-wise by scipy minimize_scalar, then eq. (8)."""

    def __init__(self, t, rho):
        self.t = np.asarray(t, dtype=float)
        self.n = self.t.size
        self.rho = float(rho)
        self.z = np.zeros(self.n)
        self.y = np.zeros(self.n)
        self.s_sum = np.zeros(self.n)

    def residual(self):
        """What is distributed (Alg. 1, line 12): sum_k D_k x_k - z."""
        return self.s_sum - self.z

    def step(self, s_sum):
        n, rho = self.n, self.rho
        inv_n = 1.0 / n
        z = np.empty(n)
        for i in range(n):                   # entry-wise optimization, as in the paper
            ti, yi, ai = float(self.t[i]), float(self.y[i]), float(s_sum[i])

            def phi(v, ti=ti, yi=yi, ai=ai):
                return inv_n * _softplus(-ti * v) - yi * v + 0.5 * rho * (v - ai) ** 2

            z[i] = minimize_scalar(phi).x
        self.z = z
        self.y = self.y + rho * (s_sum - z)
        self.s_sum = np.asarray(s_sum, dtype=float)
        return self.z


def paper_round(parties, central):
    r = central.residual()
    y = central.y
    s_sum = sum(p.step(r, y, central.rho) for p in parties)
    central.step(s_sum)


# --------------------------------------------------------------- ours, same semantics
def paper_semantics_state(blocks, state_parties, state_central):
    """The state with q = sum_k s_k - z (what Alg. 1 distributes) and no intercept."""
    sc = dict(state_central)
    sc["q"] = sum(st["s"] for st in state_parties) - sc["z"]
    sc["b"] = 0.0
    return sc


def make_ours(blocks, t, state_parties, state_central):
    """PartyUpdate / CentralUpdate at the state, paper semantics (theta = alpha = 1, no intercept)."""
    sc = paper_semantics_state(blocks, state_parties, state_central)
    return C.build_ours(blocks, t, state_parties, sc, theta=1.0, alpha=1.0, fit_intercept=False)


our_round = C.our_round


def make_paper(blocks, t, state_parties, state_central, lam=C.LAM, options=None):
    parties = []
    for D, st in zip(blocks, state_parties):
        p = PaperParty(D, lam, options)
        p.x, p.s = st["x"].copy(), st["s"].copy()
        parties.append(p)
    c = PaperCentral(t, state_central["rho"])
    c.z, c.y = state_central["z"].copy(), state_central["y"].copy()
    c.s_sum = sum(p.s for p in parties)
    return parties, c


def round_state(blocks, y, rounds=10):
    """A mid-run state of the no-intercept problem (the engine's default variant, 10 rounds)."""
    return C.mid_run_state(blocks, y, rounds=rounds, fit_intercept=False)


def lstsq_x_update(D, party, y, rho, r, lam=C.LAM):
    """Eq. (6) as the least-squares problem [sqrt(rho) D; sqrt(lam) I] x ~ [sqrt(rho) v; 0],
    v = z - r_{-m} - y/rho: an independent reference for both x-updates."""
    v = -(r - party.s) - y / rho
    A = np.vstack([math.sqrt(rho) * D.toarray(), math.sqrt(lam) * np.eye(D.shape[1])])
    rhs = np.concatenate([math.sqrt(rho) * v, np.zeros(D.shape[1])])
    return np.linalg.lstsq(A, rhs, rcond=None)[0]


def compare(ours, paper):
    """Largest absolute differences after one round (and y relative to max |y|)."""
    (op, oc), (pp, pc) = ours, paper
    out = {}
    for m, (a, b) in enumerate(zip(op, pp)):
        out[f"x_{m + 1}"] = float(np.max(np.abs(a.x - b.x)))
        out[f"s_{m + 1}"] = float(np.max(np.abs(a.s - b.s)))
    out["z"] = float(np.max(np.abs(oc.z - pc.z)))
    out["y"] = float(np.max(np.abs(oc.y - pc.y)))
    out["y_rel"] = out["y"] / float(np.max(np.abs(pc.y)))
    out["residual"] = float(np.max(np.abs(oc.q - pc.residual())))
    return out


def check(blocks, y, options=None, verbose=True):
    """Run one round both ways from the same state; return the differences dict."""
    t = np.where(y > 0, 1.0, -1.0)
    sp_, sc = round_state(blocks, y)
    ours = make_ours(blocks, t, sp_, sc)
    paper = make_paper(blocks, t, sp_, sc, options=options)
    x_ref = [lstsq_x_update(D, pr, sc["y"], sc["rho"], sum(q.s for q in ours[0]) - sc["z"])
             for D, pr in zip(blocks, ours[0])]
    our_round(*ours)
    paper_round(*paper)
    diffs = compare(ours, paper)
    ref = {f"x_{m + 1}": (float(np.max(np.abs(o.x - r))), float(np.max(np.abs(q.x - r))))
           for m, (o, q, r) in enumerate(zip(ours[0], paper[0], x_ref))}
    if verbose:
        print(f"N={t.size}, rho={sc['rho']:.6g}, L-BFGS-B iterations per party: "
              f"{[p.nit for p in paper[0]]}")
        print("max |ours - paper-style| after one round from the same state:")
        for k, v in diffs.items():
            print(f"  {k:9s} {v:.3e}")
        print("x-update vs an independent dense least-squares solve (numpy lstsq, no normal "
              "equations):")
        for k, (o, q) in ref.items():
            print(f"  {k:9s} ours {o:.3e}   paper-style L-BFGS-B {q:.3e}")
    return diffs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="first 4000 training rows only")
    args = ap.parse_args(argv)
    C.print_machine()
    blocks, y, _, _ = C.load_a9a()
    if args.quick:
        blocks, y = [D[:4000] for D in blocks], y[:4000]
    diffs = check(blocks, y)
    worst = max(v for k, v in diffs.items() if k != "y")
    ok = worst <= TOL and diffs["y_rel"] <= TOL
    print(f"same round to {TOL:g}: {'yes' if ok else 'NO'} (largest abs difference {worst:.3e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
