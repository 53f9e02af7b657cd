"""Which rho does plain vertical ADMM want? Rounds to a relative gap of 1e-4 / 1e-6 against rho,
beside the curvature of the problem at its solution (issue 24, the "data-based rho" question).

For logistic L2 (intercept, acceleration='none', alpha = 1, tol = 0) and each set, the script
1. solves the pooled problem with scikit-learn (lbfgs, tol 1e-12): f*, the scores s and the
   loss curvature h_i = p_i (1 - p_i) at the solution;
2. computes the generalized eigenvalues mu of (D^T H D, D^T D) on the centred columns (the
   intercept is the label owner's), restricted to range(D^T D): the curvature of the loss along
   the model's subspace. For ADMM on "f(z) subject to z in range(D)" with a quadratic f this is
   the spectrum that sets the rate, and the classic best penalty is rho = sqrt(mu_min mu_max) / N;
3. runs ADMM for rho = s x the default 0.2 c / N (c = 1/4) for each s of --scales.

Printed and written per set: N rho* (the best scale's N rho), N sqrt(mu_min mu_max), mean h,
and an estimate from h alone (what the label owner could compute without the parties' data):
sqrt(q25(h) * E[h^2] / E[h]). Writes benchmarks/results/rho_curvature.{csv,json,png}.

    python benchmarks/rho_curvature.py [--sets a9a,breast,sparse,sparse-sep] [--scales 0.125,0.25,0.5,1,2,3,4]
        [--sparse-rows 200000]

Sets: a9a (paper split, lam 1e-4); breast cancer (3 x 10 standardized columns, lam 1e-2); the
sparse binary set (benchmarks/_synth.py, N x (100, 200, 300) at 5 %, lam 1e-4); "sparse-sep":
the same columns with labels from another planted model (seed 1, scores of unit spread), whose
fitted model is far more confident (small h).
"""

from __future__ import annotations

import argparse
import csv
import json
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression

import _common as C
import rounds_accel
from flower_vfl import VerticalADMM

DEFAULT_NRHO = 0.2 * 0.25          # N x the default rho for logistic L2 (core/schedule.py default_rho)


#: each set's round cap (the data and lam are rounds_accel.py's)
CAPS = {"a9a": 300, "breast": 1500, "sparse": 150, "sparse-sep": 150}


def dataset(name, sparse_rows):
    if name not in CAPS:
        raise ValueError(f"unknown set {name!r}; choose from {', '.join(CAPS)}")
    blocks, y, lam, _ = rounds_accel.dataset("sparse" if name == "sparse-sep" else name, sparse_rows)
    if name == "sparse-sep":
        X = sp.hstack(blocks).tocsr()
        f = X @ np.random.default_rng(1).normal(size=X.shape[1])
        f = (f - f.mean()) / f.std()
        y = np.where(np.random.default_rng(0).random(f.size) < 1 / (1 + np.exp(-f)), 1.0, -1.0)
    return blocks, y, lam, CAPS[name]


def curvature(blocks, y, lam):
    """f*, h at the pooled solution, and the restricted generalized spectrum (mu_min, mu_max)."""
    X = sp.hstack(blocks).tocsr() if sp.issparse(blocks[0]) else np.hstack(blocks)
    n = y.size
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = LogisticRegression(C=1 / (n * lam), tol=1e-12, max_iter=20000).fit(X, y)
    w = ref.coef_.ravel()
    s = X @ w + ref.intercept_[0]
    f_star = float(np.mean(np.logaddexp(0, -y * s)) + lam / 2 * w @ w)
    p = 1 / (1 + np.exp(-s))
    h = p * (1 - p)
    Xd = X.toarray() if sp.issparse(X) else np.asarray(X)
    Xd = Xd - Xd.mean(axis=0)
    G, GH = Xd.T @ Xd, Xd.T @ (h[:, None] * Xd)
    e, V = np.linalg.eigh(G)
    keep = e > 1e-10 * e.max()                 # range(D^T D): a centred one-hot group is null
    W = V[:, keep] / np.sqrt(e[keep])
    mu = np.linalg.eigvalsh(W.T @ GH @ W)
    return f_star, h, float(mu.min()), float(mu.max())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="a9a,breast,sparse,sparse-sep")
    ap.add_argument("--scales", default="0.125,0.25,0.5,1,2,3,4")
    ap.add_argument("--sparse-rows", type=int, default=200_000)
    ap.add_argument("--out", default=str(C.RESULTS / "rho_curvature"))
    args = ap.parse_args(argv)
    scales = [float(s) for s in args.scales.split(",")]
    info = C.print_machine()
    rows, curves = [], {}
    for name in args.sets.split(","):
        blocks, y, lam, cap = dataset(name, args.sparse_rows)
        n = y.size
        f_star, h, mu_min, mu_max = curvature(blocks, y, lam)
        est = float(np.sqrt(np.quantile(h, 0.25) * np.mean(h * h) / np.mean(h)))
        r4, r6, fs = [], [], [f_star]
        gaps = []
        for s in scales:
            m = VerticalADMM(lam=lam, acceleration="none", rho=s * DEFAULT_NRHO / n, max_rounds=cap,
                             tol=0).fit(blocks, y)
            gaps.append(np.array([r["objective"] for r in m.history_]))
            fs.append(float(gaps[-1].min()))
        f_best = min(fs)
        for g in gaps:
            gap = (g - f_best) / abs(f_best)
            r4.append(rounds_accel.first_stays(gap, 1e-4))
            r6.append(rounds_accel.first_stays(gap, 1e-6))
        ok = [(r, s) for r, s in zip(r4, scales) if r is not None]
        best = min(ok)[1] if ok else None
        row = dict(set=name, n=n, lam=lam, mean_h=float(h.mean()), mu_min=mu_min, mu_max=mu_max,
                   n_rho_geo=float(np.sqrt(mu_min * mu_max)), n_rho_h_estimate=est,
                   n_rho_best=None if best is None else best * DEFAULT_NRHO, best_scale=best,
                   rounds_1e4={str(s): r for s, r in zip(scales, r4)},
                   rounds_1e6={str(s): r for s, r in zip(scales, r6)}, round_cap=cap)
        rows.append(row)
        curves[name] = r4
        print(f"{name}: N rho* {row['n_rho_best']}, N sqrt(mu_min mu_max) {row['n_rho_geo']:.4f} "
              f"(mu in [{mu_min:.4f}, {mu_max:.4f}]), mean h {row['mean_h']:.4f}, h-estimate {est:.4f}; "
              f"rounds to 1e-4 by scale {dict(zip(scales, r4))}, to 1e-6 {dict(zip(scales, r6))}", flush=True)
    with open(args.out + ".json", "w") as fh:
        json.dump({"machine": info, "scales": scales, "default_n_rho": DEFAULT_NRHO, "rows": rows}, fh, indent=1)
    with open(args.out + ".csv", "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["set", "n", "scale", "n_rho", "rounds_1e4", "rounds_1e6", "n_rho_geo", "n_rho_h_estimate"])
        for r in rows:
            for s in scales:
                wr.writerow([r["set"], r["n"], s, s * DEFAULT_NRHO, r["rounds_1e4"][str(s)],
                             r["rounds_1e6"][str(s)], r["n_rho_geo"], r["n_rho_h_estimate"]])
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    x = np.array(scales) * DEFAULT_NRHO
    for i, r in enumerate(rows):
        col = f"C{i}"
        vals = [v if v is not None else np.nan for v in curves[r["set"]]]
        ax.plot(x, vals, "o-", color=col, label=f"{r['set']} (N={r['n']:,})")
        ax.axvline(r["n_rho_geo"], color=col, ls="--", lw=1)
        ax.axvline(r["n_rho_h_estimate"], color=col, ls=":", lw=1)
        if r["n_rho_best"] is not None:
            ax.plot(r["n_rho_best"], min(v for v in vals if not np.isnan(v)), "*", ms=14, color=col)
        for xi, v in zip(x, vals):
            if np.isnan(v):
                ax.plot(xi, r["round_cap"], "x", color=col)
    ax.axvline(DEFAULT_NRHO, color="k", lw=1.5, alpha=0.4)
    ax.text(DEFAULT_NRHO, 0.02, " default rho", transform=ax.get_xaxis_transform(), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N rho (plain rounds, logistic L2)")
    ax.set_ylabel("rounds to gap 1e-4 (x: not within the cap)")
    ax.set_title("Best rho follows the curvature along range(D)\n"
                 "star: fewest rounds; dashed: N sqrt(mu_min mu_max); dotted: estimate from h alone", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)
    print("wrote", args.out + ".{csv,json,png}")


if __name__ == "__main__":
    main()
