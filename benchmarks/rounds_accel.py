"""Rounds to a relative objective gap of 1e-4 and 1e-6 for each way of making ADMM's tail fast.

Options (all VerticalADMM, logistic, L2, intercept, default rho, tol=0):
  plain      acceleration='none' (the old default)
  anderson   type-II Anderson acceleration, memory 5 (the new default, core/accel.py)
  relax1.5   over-relaxation alpha = 1.5 (no acceleration)
  balance    residual-balancing rho (Boyd 3.4.1), no acceleration
  aa+balance Anderson with residual balancing (the memory restarts when rho changes)

Data sets: a9a (paper split, lam 1e-4), breast cancer (3 x 10 standardized columns, lam 1e-2),
a gisette-like wide dense set (6000 x 2 x 2000, lam 1e-3, benchmarks/_synth.py) and the sparse
binary set (N x (100, 200, 300) columns at 5 %, lam 1e-4; --sparse-rows, default 1,000,000).
f* = the smallest objective seen: scikit-learn lbfgs (tol 1e-12) on the pooled data or any
ADMM run. "rounds to g" = the first round from which the gap stays <= g. Writes
benchmarks/results/rounds_accel.{csv,json}.

    python benchmarks/rounds_accel.py [--sets a9a,breast,wide,sparse] [--sparse-rows 1000000]
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

OPTIONS = {
    "plain": dict(acceleration="none"),
    "anderson": dict(acceleration="anderson"),
    "relax1.5": dict(acceleration="none", alpha=1.5),
    "balance": dict(acceleration="none", adaptive_rho=True),
    "aa+balance": dict(acceleration="anderson", adaptive_rho=True),
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
    if name == "sparse":
        B, y = _synth.sparse_binary(n_rows=sparse_rows)
        return B, y, 1e-4, 150
    raise ValueError(f"unknown set {name!r}; choose from a9a, breast, wide, sparse")


def sklearn_objective(blocks, y, lam):
    X = sp.hstack(blocks).tocsr() if sp.issparse(blocks[0]) else np.hstack(blocks)
    n = y.size
    t0 = time.perf_counter()
    ref = LogisticRegression(C=1 / (n * lam), tol=1e-12, max_iter=20000).fit(X, y)
    secs = time.perf_counter() - t0
    f = ref.decision_function(X)
    w = ref.coef_.ravel()
    return float(np.mean(np.logaddexp(0, -y * f)) + lam / 2 * w @ w), secs


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
    ap.add_argument("--out", default=str(C.RESULTS / "rounds_accel"))
    args = ap.parse_args(argv)
    info = C.print_machine()
    rows = []
    for name in args.sets.split(","):
        blocks, y, lam, rounds = dataset(name, args.sparse_rows)
        f_sk, t_sk = sklearn_objective(blocks, y, lam)
        runs = {}
        for opt in args.options.split(","):
            t0 = time.perf_counter()
            m = VerticalADMM(lam=lam, max_rounds=rounds, tol=0, **OPTIONS[opt]).fit(blocks, y)
            wall = time.perf_counter() - t0
            runs[opt] = (np.array([h["objective"] for h in m.history_]),
                         np.array([h["elapsed_s"] for h in m.history_]), wall)
            print(f"{name} {opt}: {wall:.1f} s, final objective {runs[opt][0][-1]:.12f}", flush=True)
        f_star = min(f_sk, *(r[0].min() for r in runs.values()))
        for opt, (obj, el, wall) in runs.items():
            gap = (obj - f_star) / abs(f_star)
            k4, k6 = first_stays(gap, 1e-4), first_stays(gap, 1e-6)
            rows.append({"set": name, "option": opt, "rounds_1e-4": k4, "rounds_1e-6": k6,
                         "gap_final": float(gap[-1]), "rounds_run": int(obj.size),
                         "time_to_1e-4_s": None if k4 is None else float(el[k4 - 1]),
                         "sklearn_s": t_sk, "sklearn_gap": (f_sk - f_star) / abs(f_star),
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
