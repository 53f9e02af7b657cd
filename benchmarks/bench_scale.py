"""Scale benchmark: time per round, first-round time and peak memory against N and d, next to
scikit-learn on the pooled data. Data from a seed (benchmarks/_synth.py).

Series (logistic, L2, lam = 1e-4, intercept, defaults: x-solver 'auto', Anderson):
  N      sparse binary, 3 parties of (100, 200, 300) columns at 5 %, N in --rows
  d      sparse binary, N = --d-rows, widths (100, 200, 300) x each factor in --d-factors
  text   tf-like sparse, 50k rows x 2 parties x 200k columns, 10 nonzeros per row and party
  wide   gisette-like dense, 6000 x 2 x 2000

All times are CPU seconds of this process (time.process_time; BLAS threads included): on this
shared 2-core machine under load the wall clock mostly measures how long the process waited.
Per configuration, in this order and in the same process: MV (per party one D_m @ x and one
D_m^T @ v, median of 5), our fit of --rounds rounds (first round = setup + round 1; time per
round = median of rounds 2..), scikit-learn LogisticRegression(lbfgs, tol=1e-4 default) on the
pooled data (wall time, iterations), and a 3-round fit under tracemalloc (numpy's allocations
are traced) for the peak memory the fit allocates on top of the data, as a ratio to the data's
bytes. Writes benchmarks/results/bench_scale.{csv,json,png}.

    python benchmarks/bench_scale.py                       # full (about 10-20 min on 2 cores)
    python benchmarks/bench_scale.py --rows 10000,100000 --d-factors 1,2 --skip text,wide
    python benchmarks/bench_scale.py --one sparse1m      # one JSON line (text: --one text)
"""

from __future__ import annotations

import argparse
import csv
import json
import time
import tracemalloc

import numpy as np
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression

import _common as C
import _synth
from flower_vfl import VerticalADMM


def nbytes(blocks):
    if sp.issparse(blocks[0]):
        return sum(D.data.nbytes + D.indices.nbytes + D.indptr.nbytes for D in blocks)
    return sum(D.nbytes for D in blocks)


def mv_time(blocks, reps=5):
    xs = [np.ones(D.shape[1]) for D in blocks]
    v = np.ones(blocks[0].shape[0])
    ts = []
    for _ in range(reps):
        t0 = time.process_time()
        for D, x in zip(blocks, xs):
            D @ x
            D.T @ v
        ts.append(time.process_time() - t0)
    return float(np.median(ts))


def measure(series, label, blocks, y, rounds, skip_sklearn=False):
    row = {"series": series, "config": label, "N": blocks[0].shape[0],
           "d": sum(D.shape[1] for D in blocks), "data_MB": nbytes(blocks) / 2**20}
    row["mv_ms"] = 1e3 * mv_time(blocks)
    marks = []
    start = time.process_time()
    m = VerticalADMM(lam=1e-4, max_rounds=rounds, tol=0,
                     callback=lambda k, e: marks.append(time.process_time())).fit(blocks, y)
    cpu = np.diff([start] + marks)                 # CPU seconds of each round (round 1: + setup)
    row["fit_s"] = float(cpu.sum())
    row["first_round_s"] = float(cpu[0])
    row["round_ms"] = 1e3 * float(np.median(cpu[1:]))
    row["round_over_mv"] = row["round_ms"] / row["mv_ms"]
    row["solvers"] = "/".join(p.solver.method_ for p in m._parties)
    row["acceleration"] = m.acceleration_          # 'auto' turns Anderson off above its memory cap
    row["objective"] = m.history_[-1]["objective"]
    if not skip_sklearn:
        X = sp.hstack(blocks).tocsr() if sp.issparse(blocks[0]) else np.hstack(blocks)
        t0 = time.process_time()
        sk = LogisticRegression(C=1.0 / (y.size * 1e-4), max_iter=1000).fit(X, y)
        row["sklearn_s"] = time.process_time() - t0
        row["sklearn_iter"] = int(sk.n_iter_[0])
        w = sk.coef_.ravel()
        f = sk.decision_function(X)
        row["sklearn_objective"] = float(np.mean(np.logaddexp(0, -y * f)) + 0.5e-4 * w @ w)
        del X
    tracemalloc.start()
    VerticalADMM(lam=1e-4, max_rounds=3, tol=0).fit(blocks, y)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    row["fit_peak_MB"] = peak / 2**20
    row["peak_over_data"] = peak / nbytes(blocks)
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return row


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 5.6))
    for series, key, marker in (("N", "N", "o"), ("d", "d", "s")):
        rs = [r for r in rows if r["series"] == series]
        if not rs:
            continue
        x = [r[key] for r in rs]
        name = "vs N (d = 600)" if series == "N" else f"vs d (N = {rs[0]['N']:,})"
        ax[0].loglog(x, [r["round_ms"] for r in rs], marker + "-", label=f"ours, time per round, {name}")
        ax[0].loglog(x, [r["mv_ms"] for r in rs], marker + ":", label=f"MV (irreducible), {name}")
        ax[1].loglog(x, [r["first_round_s"] for r in rs], marker + "-", label=f"ours, first round, {name}")
        if "sklearn_s" in rs[0]:
            ax[1].loglog(x, [r["sklearn_s"] for r in rs], marker + "--", label=f"scikit-learn fit (pooled), {name}")
        ax[2].semilogx(x, [r["peak_over_data"] for r in rs], marker + "-", label=f"ours, {name}")
        for r, xv in zip(rs, x):     # what 'auto' ran: Anderson holds (M + 1) N state vectors
            if "acceleration" in r:
                ax[2].annotate(r["acceleration"], (xv, r["peak_over_data"]), fontsize=7,
                               xytext=(4, 4), textcoords="offset points")
    for r in rows:
        if r["series"] == "text":
            ax[2].semilogx([r["N"]], [r["peak_over_data"]], "*", ms=10,
                           label=f"text-like 50k x 2 x 200k, ran {r.get('acceleration', '?')} "
                                 "(goal: memory <= 3x the data)")
    ax[0].set(xlabel="N (circles) or d (squares)", ylabel="CPU ms",
              title="Time per round vs MV (x-solver 'auto': gram on these sets)")
    ax[1].set(xlabel="N (circles) or d (squares)", ylabel="CPU s",
              title="First round (setup + round 1) vs sklearn's whole fit")
    ax[2].set(xlabel="N (circles) or d (squares)", ylabel="fit's peak allocation / data bytes", title="Peak memory of the fit (labels: the acceleration 'auto' ran)")
    ax[2].axhline(0.5, color="grey", lw=0.8, ls="--", label="goal at 1M rows: fit adds <= 0.5x (peak <= 1.5x the data)")
    for a in ax:                 # legends under the panels: inside, they hid the steepest points
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False)
    fig.suptitle("flower-vfl scale benchmark: sparse binary logistic L2 (benchmarks/bench_scale.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="10000,100000,300000,1000000")
    ap.add_argument("--d-rows", type=int, default=100_000)
    ap.add_argument("--d-factors", default="0.5,1,2,4")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--skip", default="")
    ap.add_argument("--out", default=str(C.RESULTS / "bench_scale"))
    args = ap.parse_args(argv)
    info = C.print_machine()
    skip = set(filter(None, args.skip.split(",")))
    rows = []
    if "N" not in skip:
        for n in map(int, args.rows.split(",")):
            B, y = _synth.sparse_binary(n_rows=n)
            rows.append(measure("N", f"N={n}", B, y, args.rounds))
    if "d" not in skip:
        for f in map(float, args.d_factors.split(",")):
            widths = tuple(int(w * f) for w in (100, 200, 300))
            B, y = _synth.sparse_binary(n_rows=args.d_rows, widths=widths)
            rows.append(measure("d", f"widths={widths}", B, y, args.rounds))
    if "text" not in skip:
        B, y = _synth.text_like()
        rows.append(measure("text", "50k x 2 x 200k, 10 nnz/row", B, y, args.rounds))
    if "wide" not in skip:
        B, y = _synth.wide_dense()
        rows.append(measure("wide", "6000 x 2 x 2000 dense", B, y, args.rounds))
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(args.out + ".csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    with open(args.out + ".json", "w") as fh:
        json.dump({"machine": info, "command": "python benchmarks/bench_scale.py " + " ".join(argv or []),
                   "rows": rows}, fh, indent=1)
    plot(rows, args.out + ".png")


def one(which, rounds=20, memory=True):
    """One configuration, one JSON line: for interleaved A/B runs of two package trees
    (``PYTHONPATH=<other tree> python benchmarks/bench_scale.py --one sparse1m``), whose
    difference survives the machine's load where absolute CPU times do not."""
    import flower_vfl
    B, y = _synth.sparse_binary() if which == "sparse1m" else _synth.text_like()
    marks = []
    start = time.process_time()
    m = VerticalADMM(lam=1e-4, max_rounds=rounds, tol=0,
                     callback=lambda k, e: marks.append(time.process_time())).fit(B, y)
    cpu = np.diff([start] + marks)
    row = {"tree": flower_vfl.__file__.rsplit("/flower_vfl/", 1)[0], "data": which,
           "first_round_s": float(cpu[0]), "fit_s": float(cpu.sum()),
           "round_ms": 1e3 * float(np.median(cpu[1:])), "mv_ms": 1e3 * mv_time(B),
           "solvers": "/".join(p.solver.method_ for p in m._parties),
           "acceleration": m.acceleration_, "objective": m.history_[-1]["objective"]}
    if memory:
        tracemalloc.start()
        VerticalADMM(lam=1e-4, max_rounds=3, tol=0).fit(B, y)
        row["peak_over_data"] = tracemalloc.get_traced_memory()[1] / nbytes(B)
        tracemalloc.stop()
    with open("/proc/loadavg") as fh:
        row["load"] = fh.read().split()[0]
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    import sys
    if sys.argv[1:2] == ["--one"]:
        one(sys.argv[2])
    elif sys.argv[1:2] == ["--replot"]:          # redraw the PNG from the JSON of the last run
        plot(json.load(open(str(C.RESULTS / "bench_scale.json")))["rows"], str(C.RESULTS / "bench_scale.png"))
    else:
        main(sys.argv[1:])
