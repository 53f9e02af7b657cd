"""Anderson from round 1 against Anderson once the plain rounds stall: rounds x cost per round.

Options (VerticalADMM defaults otherwise, tol 0, one BLAS/OpenMP thread via threadpoolctl):

  always   Anderson from round 1 (``flower_vfl.core.accel.STALL_RATIO = None``)
  stall    Anderson once ||q_k|| / ||q_{k-1}|| >= ``--tau`` two rounds running, plain rounds (theta
           following the releases' alignment) before (``STALL_RATIO = tau``)
  none     ``acceleration='none'`` (plain rounds throughout)

For each set: one long fit per option gives its objective per round; f* = the smallest objective
of all of them and of scikit-learn's lbfgs at tol 1e-12 on the pooled data (``--no-sklearn``:
the runs only); "rounds to g" = the first round from which the relative gap stays <= g. Then
``--pairs`` alternated pairs (order swapped every pair) of fits with exactly that many rounds time
each option's CPU to the gap (time.process_time); the ratio stall / always is reported as min and
median over the pairs, with the 1-minute load average. The median round (elapsed_s differences,
rounds 2..R) of the always and the stall fit is reported too, and for 'stall' the round it engaged.

Sets (bench_vs_sklearn.py's loaders): a9a-l2, digits, mixture, counts, skewed, fmnist, sparse; and
breast (scikit-learn's breast cancer, standardized, 3 x 10 columns, lam 1e-2).

    python benchmarks/anderson_stall.py [--sets a9a-l2,digits,breast,mixture,counts] [--gaps 1e-4,1e-6]
        [--tau 0.75] [--pairs 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import _common as C
import bench_vs_sklearn as V
from flower_vfl import VerticalADMM
from flower_vfl.core import accel

OPTIONS = ("always", "stall", "none")


def load(name, quick):
    if name == "breast":
        from sklearn.datasets import load_breast_cancer
        from sklearn.preprocessing import StandardScaler
        X, y = load_breast_cancer(return_X_y=True)
        X = StandardScaler().fit_transform(X)
        return dict(blocks=[X[:, :10], X[:, 10:20], X[:, 20:]], y=np.where(y > 0, 1.0, -1.0), lam=1e-2,
                    penalty="l2", multinomial=False, cap=300, X=X)
    return V.load(name, quick)


def fit(c, option, rounds, tau):
    accel.STALL_RATIO = tau if option == "stall" else None
    kw = dict(loss="multinomial" if c["multinomial"] else "logistic", lam=c["lam"], penalty=c["penalty"],
              max_rounds=rounds, tol=0, acceleration="none" if option == "none" else "auto")
    t0 = time.process_time()
    try:
        m = VerticalADMM(**kw).fit(c["blocks"], c["y"])
    finally:
        accel.STALL_RATIO = None
    return m, time.process_time() - t0


class Engaged:
    """Records the round after which the stall gate engaged (wraps Anderson.stalled)."""

    def __init__(self):
        self.calls, self.at, self._orig = 0, None, accel.Anderson.stalled

        def stalled(acc, q):
            self.calls += 1
            on = self._orig(acc, q)
            if on and self.at is None:
                self.at = self.calls
            return on
        accel.Anderson.stalled = stalled

    def close(self):
        accel.Anderson.stalled = self._orig


def rounds_to(obj, f_star, g):
    gap = (obj - f_star) / abs(f_star)
    bad = np.flatnonzero(~(gap <= g))
    return int(bad[-1]) + 2 if bad.size else 1


def run_set(name, gaps, pairs, tau, quick, sklearn_ref):
    c = load(name, quick)
    long = {}
    for o in OPTIONS:
        e = Engaged()
        try:
            m, _ = fit(c, o, c["cap"], tau)
        finally:
            e.close()
        el = np.diff([0.0] + [h["elapsed_s"] for h in m.history_])
        long[o] = dict(obj=np.array([h["objective"] for h in m.history_]), round_ms=1e3 * float(np.median(el[1:])),
                       acceleration=m.acceleration_, engaged_after_round=e.at)
    f_star = min(float(v["obj"].min()) for v in long.values())
    if sklearn_ref:
        f_ref, _ = V.peer(c, "lbfgs", 20000, tol=1e-12)
        f_star = min(f_star, f_ref)
    rows = []
    for g in gaps:
        r = {o: rounds_to(long[o]["obj"], f_star, g) for o in OPTIONS}
        reached = {o: r[o] <= c["cap"] for o in OPTIONS}
        cpu = {o: [] for o in OPTIONS if reached[o]}
        loads = []
        for i in range(pairs):
            order = [o for o in OPTIONS if reached[o]]
            for o in (order if i % 2 == 0 else order[::-1]):
                cpu[o].append(fit(c, o, r[o], tau)[1])
            loads.append(V.load1())
        row = {"set": name, "gap": g, "rounds": r, "reached": reached,
               "cpu_s_min": {o: min(v) for o, v in cpu.items()},
               "cpu_s_median": {o: float(np.median(v)) for o, v in cpu.items()},
               "cpu_s": cpu, "load1": loads}
        if "always" in cpu and "stall" in cpu:
            ratios = [a / b for a, b in zip(cpu["stall"], cpu["always"])]
            row["stall_over_always_min_median"] = [min(ratios), float(np.median(ratios))]
        rows.append(row)
        msg = ", ".join(f"{o} {r[o] if reached[o] else '>' + str(c['cap'])} rounds"
                        + (f" {1e3 * row['cpu_s_median'][o]:.1f} ms" if o in cpu else "") for o in OPTIONS)
        extra = ""
        if "stall_over_always_min_median" in row:
            mn, md = row["stall_over_always_min_median"]
            extra = f"; stall / always CPU {mn:.2f} / {md:.2f} (min / median)"
        print(f"{name} to {g:g}: {msg}{extra}; load {min(loads):.1f}-{max(loads):.1f}", flush=True)
    print(f"{name}: median round (ms) " + ", ".join(f"{o} {v['round_ms']:.3f}" for o, v in long.items())
          + f"; the gate engaged after round {long['stall']['engaged_after_round']}", flush=True)
    return {"set": name, "f_star": f_star, "round_ms_median": {o: v["round_ms"] for o, v in long.items()},
            "engaged_after_round": long["stall"]["engaged_after_round"], "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="a9a-l2,digits,breast,mixture,counts")
    ap.add_argument("--gaps", default="1e-4,1e-6")
    ap.add_argument("--tau", type=float, default=0.75)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the loaders' small versions")
    ap.add_argument("--no-sklearn", action="store_true", help="f* from the runs alone")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    info = C.print_machine()
    gaps = [float(g) for g in args.gaps.split(",")]
    out = []
    with threadpool_limits(1):
        for name in args.sets.split(","):
            out.append(run_set(name, gaps, args.pairs, args.tau, args.quick, not args.no_sklearn))
    path = args.out or str(C.RESULTS / "anderson_stall.json")
    C.RESULTS.mkdir(exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"machine": info, "tau": args.tau, "sets": out}, fh, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
