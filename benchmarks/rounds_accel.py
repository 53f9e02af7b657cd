"""Rounds to a relative objective gap of 1e-4 and 1e-6 for each way of making ADMM's tail fast.

Options (all VerticalADMM, logistic, intercept, default rho unless said, tol=0):
  plain      acceleration='none' (the old default; theta follows the releases, variant 'sharing')
  plain-fixed  acceleration='none', variant='sharing-fixed' (theta = 1/M throughout: before session 38)
  anderson   type-II Anderson acceleration, memory 5 (the default for L2, core/accel.py)
  spectral   spectral (BB) adaptive rho, Xu et al. 2017 (core/accel.py SpectralRho)
  aa+spectral  both (Anderson's memory restarts when rho changes)
  relax1.5   over-relaxation alpha = 1.5 (no acceleration)
  balance    residual-balancing rho (Boyd 3.4.1), no acceleration
  aa+balance Anderson with residual balancing (the memory restarts when rho changes)
  rho1, rho/4, rho/8, rho/16   plain with rho = 0.2 c/N (the L2 default) / 1, 4, 8, 16; the
             default for L1 / elastic net is 0.2 c/(8N) (rho/8) since issue 9
  rho*2, rho*3   plain with rho = 0.2 c/N x 2, x 3
  relax1.5*2, relax1.5*3   over-relaxation alpha = 1.5 with rho = 0.2 c/N x 2, x 3
  auto       the default acceleration ('auto': Anderson for L2, spectral rho otherwise)

Data sets: a9a (paper split, lam 1e-4), breast cancer (3 x 10 standardized columns, lam 1e-2),
a wide dense set (6000 x 2 x 2000, lam 1e-3, benchmarks/_synth.py), the gisette-like set
(flower_vfl/datasets/gisette_like.py, 6000 x (2000, 2000, 1000), lam 1e-3) and the sparse
binary set (N x (100, 200, 300) columns at 5 %, lam 1e-4; --sparse-rows, default 1,000,000).
--penalty l1 (or elasticnet, l1_ratio 0.5) runs that problem with the same lam. f* = the
smallest objective seen: any ADMM run, and scikit-learn on the pooled data (lbfgs tol 1e-12 for
L2; for L1 saga tol 1e-10 with --l1-sklearn: on a9a that took minutes and gave 0.326837405155,
the same 12 digits at tol 1e-8, 1e-10 and 1e-12, and the ADMM runs reach it to 1e-12). "rounds to g" = the first round from which the gap stays <= g. Writes
benchmarks/results/rounds_accel.{csv,json}.

    python benchmarks/rounds_accel.py [--sets a9a,breast,wide,gisette,sparse] [--penalty l1|elasticnet]
        [--options plain,anderson,...] [--rounds N] [--sparse-rows 1000000]
"""

from __future__ import annotations

import argparse
import csv
import json
import time

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

import _common as C
import _synth
from flower_vfl import VerticalADMM
from flower_vfl.estimator.engine import default_rho
from flower_vfl.core.losses import get_loss

OPTIONS = {
    "plain": dict(acceleration="none"),
    "plain-fixed": dict(acceleration="none", variant="sharing-fixed"),
    "anderson": dict(acceleration="anderson"),
    "relax1.5": dict(acceleration="none", alpha=1.5),
    "balance": dict(acceleration="none", adaptive_rho=True),
    "aa+balance": dict(acceleration="anderson", adaptive_rho=True),
    "spectral": dict(acceleration="spectral"),
    "aa+spectral": dict(acceleration="anderson+spectral"),
    "auto": dict(acceleration="auto"),
    "rho1": dict(acceleration="none", rho_scale=1.0),
    "rho/4": dict(acceleration="none", rho_scale=0.25),
    "rho/8": dict(acceleration="none", rho_scale=0.125),
    "rho/16": dict(acceleration="none", rho_scale=0.0625),
    "rho*2": dict(acceleration="none", rho_scale=2.0),
    "rho*3": dict(acceleration="none", rho_scale=3.0),
    "relax1.5*2": dict(acceleration="none", alpha=1.5, rho_scale=2.0),
    "relax1.5*3": dict(acceleration="none", alpha=1.5, rho_scale=3.0),
}


def dataset(name, sparse_rows):
    if name == "a9a":
        tr, y, _, _ = C.load_a9a()
        return tr, y, 1e-4, 400
    if name == "breast":
        X, y = load_breast_cancer(return_X_y=True)
        X = StandardScaler().fit_transform(X)
        return [X[:, :10], X[:, 10:20], X[:, 20:]], np.where(y == 1, 1.0, -1.0), 1e-2, 3000
    if name == "wide":
        B, y = _synth.wide_dense()
        return B, y, 1e-3, 400
    if name == "gisette":
        from flower_vfl.datasets.gisette_like import GISETTE_SPLIT, load_gisette_like
        X, y = load_gisette_like()[:2]
        return [np.ascontiguousarray(X[:, a:b]) for a, b in GISETTE_SPLIT], np.asarray(y, float), 1e-3, 400
    if name == "sparse":
        B, y = _synth.sparse_binary(n_rows=sparse_rows)
        return B, y, 1e-4, 150
    raise ValueError(f"unknown set {name!r}; choose from a9a, breast, wide, sparse")


def sklearn_objective(blocks, y, lam, penalty="l2"):
    X = sp.hstack(blocks).tocsr() if sp.issparse(blocks[0]) else np.hstack(blocks)
    n = y.size
    t0 = time.perf_counter()
    if penalty == "l1":
        ref = LogisticRegression(C=1 / (n * lam), l1_ratio=1.0, solver="saga", tol=1e-10,
                                 max_iter=100000).fit(X, y)
    else:
        ref = LogisticRegression(C=1 / (n * lam), tol=1e-12, max_iter=20000).fit(X, y)
    secs = time.perf_counter() - t0
    f = ref.decision_function(X)
    w = ref.coef_.ravel()
    pen = lam * np.abs(w).sum() if penalty == "l1" else lam / 2 * w @ w
    return float(np.mean(np.logaddexp(0, -y * f)) + pen), secs


def first_stays(gap, g):
    ok = gap <= g
    bad = np.flatnonzero(~ok)
    k = 0 if bad.size == 0 else bad[-1] + 1
    return int(k + 1) if k < gap.size else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="a9a,breast,wide,sparse")
    ap.add_argument("--options", default=",".join(OPTIONS))
    ap.add_argument("--sparse-rows", type=int, default=1_000_000)
    ap.add_argument("--penalty", default="l2", choices=("l2", "l1", "elasticnet"))
    ap.add_argument("--rounds", type=int, default=0, help="rounds per run (0: the set's default)")
    ap.add_argument("--l1-sklearn", action="store_true", help="also run saga (slow) for the L1 f*")
    ap.add_argument("--out", default=str(C.RESULTS / "rounds_accel"))
    args = ap.parse_args(argv)
    info = C.print_machine()
    rows = []
    for name in args.sets.split(","):
        blocks, y, lam, rounds = dataset(name, args.sparse_rows)
        rounds = args.rounds or rounds
        f_sk, t_sk = (sklearn_objective(blocks, y, lam, args.penalty)
                      if args.penalty == "l2" or args.l1_sklearn else (np.inf, None))
        runs = {}
        for opt in args.options.split(","):
            kw = dict(OPTIONS[opt])
            if "rho_scale" in kw:
                kw["rho"] = kw.pop("rho_scale") * default_rho(get_loss("logistic"), y.size)
            t0 = time.perf_counter()
            m = VerticalADMM(lam=lam, penalty=args.penalty, max_rounds=rounds, tol=0, **kw).fit(blocks, y)
            wall = time.perf_counter() - t0
            runs[opt] = (np.array([h["objective"] for h in m.history_]),
                         np.array([h["elapsed_s"] for h in m.history_]), wall,
                         np.array([h["rho"] for h in m.history_]))
            print(f"{name} {opt}: {wall:.1f} s, final objective {runs[opt][0][-1]:.12f}, "
                  f"final rho / default {runs[opt][3][-1] / default_rho(get_loss('logistic'), y.size):.3g}",
                  flush=True)
        f_star = min(f_sk, *(r[0].min() for r in runs.values()))
        for opt, (obj, el, wall, rhos) in runs.items():
            gap = (obj - f_star) / abs(f_star)
            k4, k6 = first_stays(gap, 1e-4), first_stays(gap, 1e-6)
            rows.append({"set": name, "penalty": args.penalty, "option": opt, "rounds_1e-4": k4,
                         "rounds_1e-6": k6, "rho_final_over_default":
                         float(rhos[-1] / default_rho(get_loss("logistic"), y.size)),
                         "gap_final": float(gap[-1]), "rounds_run": int(obj.size),
                         "time_to_1e-4_s": None if k4 is None else float(el[k4 - 1]),
                         "sklearn_s": t_sk, "sklearn_gap": None if not np.isfinite(f_sk)
                         else (f_sk - f_star) / abs(f_star), "f_star": f_star,
                         "wall_s": wall})
            print(rows[-1], flush=True)
    with open(args.out + ".csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(args.out + ".json", "w") as fh:
        json.dump({"machine": info, "command": "python benchmarks/rounds_accel.py " + " ".join(argv or []),
                   "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
