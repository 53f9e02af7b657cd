"""What Anderson acceleration costs a round and what it buys, on a9a (issue 9's per-round goal).

For each Anderson memory in --mems (and the plain iteration), one 200-round fit of the default
problem (paper split, logistic L2, lam 1e-4, intercept, default rho): rounds until the relative
gap stays below 1e-4 / 1e-6 (f* = scikit-learn lbfgs at tol 1e-12, same objective), the fit's
CPU seconds per round, the accelerator's own CPU per round (``Anderson.targets``), MV (per party
one D_m @ x and one D_m^T @ v, timed after every round as in bench_table.py) and CPU seconds to
the 1e-4 gap. Then the part of Anderson's step no implementation can skip: its two passes over
the history (Y g and gamma S; 2 mem (M + 1) N floats), timed alternately with MV in one loop.
CPU seconds of this process (time.process_time). Writes benchmarks/results/anderson_tradeoff.json.

    python benchmarks/anderson_tradeoff.py [--mems 1,2,3,5] [--rounds 200]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from sklearn.linear_model import LogisticRegression

import _common as C
from bench_scale import mv_time
from bench_table import gap_rounds, per_round
from flower_vfl.core import accel
from flower_vfl.core.xsolve import one_blas_thread


def f_star(blocks, y, lam):
    import scipy.sparse as sp
    X = sp.hstack(blocks).tocsr()
    m = LogisticRegression(C=1 / (y.size * lam), tol=1e-12, max_iter=10000).fit(X, y)
    w, b = m.coef_.ravel(), m.intercept_[0]
    f = X @ w + b
    return float(np.mean(np.logaddexp(0, -y * f)) + lam / 2 * w @ w)


def one_fit(blocks, y, mem, rounds, fs):
    """bench_table's per-round measurement (MV timed in the callback) of one fit, with the
    accelerator's own CPU added up (``Anderson.targets``)."""
    aa = [0.0]
    orig = accel.Anderson.targets

    def targets(self, *a, **k):
        t0 = time.process_time()
        out = orig(self, *a, **k)
        aa[0] += time.process_time() - t0
        return out

    accel.Anderson.targets = targets
    try:
        if mem == 0:
            m, per, mv, cum = per_round(blocks, y, lam=C.LAM, max_rounds=rounds, tol=0, acceleration="none")
        else:
            m, per, mv, cum = _fit_mem(blocks, y, mem, rounds)
    finally:
        accel.Anderson.targets = orig
    obj = [h["objective"] for h in m.history_]
    r4, r6 = gap_rounds(obj, fs, 1e-4), gap_rounds(obj, fs, 1e-6)
    return {"mem": mem, "rounds_to_1e-4": r4, "rounds_to_1e-6": r6,
            "round_ms": 1e3 * float(np.median(per)), "mv_ms": 1e3 * float(np.median(mv)),
            "round_over_mv": float(np.median(per) / np.median(mv)),
            "anderson_step_ms": 1e3 * aa[0] / len(obj),
            "cpu_to_1e-4_s": None if r4 is None else float(cum[r4 - 1])}


def _fit_mem(blocks, y, mem, rounds):
    """per_round of a fit with Anderson of another memory (make_accelerator takes ``mem``; the
    engine does not expose it, so the engine's factory is wrapped for this run)."""
    from flower_vfl.core import engine
    orig = engine.make_accelerator
    engine.make_accelerator = lambda *a, **k: orig(*a, **{**k, "mem": mem})
    try:
        return per_round(blocks, y, lam=C.LAM, max_rounds=rounds, tol=0, acceleration="anderson")
    finally:
        engine.make_accelerator = orig


def history_passes(blocks, mem, reps=60):
    """Median CPU of Y g + gamma S over a (mem, 3N) history vs MV, alternated in one loop."""
    n = blocks[0].shape[0]
    L = (len(blocks) + 1) * n
    rng = np.random.default_rng(0)
    Y, S, g, gam, c = (rng.normal(size=(mem, L)), rng.normal(size=(mem, L)), rng.normal(size=L),
                       rng.normal(size=mem), np.empty(L))
    mv, hist = [], []
    for _ in range(reps):
        mv.append(mv_time(blocks, reps=1))
        with one_blas_thread():
            t0 = time.process_time()
            Y @ g
            np.matmul(gam, S, out=c)
            hist.append(time.process_time() - t0)
    return {"mem": mem, "history_MB": 2 * mem * L * 8 / 2**20, "passes_ms": 1e3 * float(np.median(hist)),
            "mv_ms": 1e3 * float(np.median(mv)), "passes_over_mv": float(np.median(hist) / np.median(mv))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mems", default="1,2,3,5")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--out", default=str(C.RESULTS / "anderson_tradeoff.json"))
    args = ap.parse_args(argv)
    out = {"machine": C.print_machine(), "command": "python benchmarks/anderson_tradeoff.py " + " ".join(argv or [])}
    with open("/proc/loadavg") as fh:
        out["load_before"] = fh.read().split()[:3]
    tr, y, _, _ = C.load_a9a()
    fs = f_star(tr, y, C.LAM)
    out["f_star"] = fs
    mems = [int(m) for m in args.mems.split(",")]
    out["fits"] = []
    for mem in [0] + mems:             # 0: the plain iteration
        row = one_fit(tr, y, mem, args.rounds, fs)
        print(row, flush=True)
        out["fits"].append(row)
    out["history_passes"] = [history_passes(tr, mem) for mem in mems]
    for row in out["history_passes"]:
        print(row, flush=True)
    with open("/proc/loadavg") as fh:
        out["load_after"] = fh.read().split()[:3]
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
