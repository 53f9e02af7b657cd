"""The L1 x-update's first FISTA burst (core/xsolve_prox.py ``FIRST_BURST``): support
factorizations, CPU and the gap at round 33 of a9a's L1 fit (lam 1e-4, the engine's defaults,
tol 0) for each burst length, the settings alternated ``--reps`` times in one process (CPU
medians: time.process_time of the fit). The gap is against f* = 0.326837405212483 (a9a L1's
smallest objective seen, benchmarks/results/bench_vs_sklearn_s37.json).

    python benchmarks/l1_first_burst.py [--bursts 8,16,32,48,64,96] [--reps 7] [--rounds 33]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import _common as C
from flower_vfl import VerticalADMM
from flower_vfl.core import xsolve_prox as X

F_STAR = 0.326837405212483


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bursts", default="8,16,32,48,64,96")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=33)
    args = ap.parse_args(argv)
    C.print_machine()
    tr, y, _, _ = C.load_a9a()
    calls = [0]
    factor = X._support_factor

    def counted(*a, **k):
        calls[0] += 1
        return factor(*a, **k)

    X._support_factor = counted
    bursts = [int(b) for b in args.bursts.split(",")]
    default = X.FIRST_BURST
    cpu, stats = {b: [] for b in bursts}, {}
    try:
        for _ in range(args.reps):
            for b in bursts:
                X.FIRST_BURST, calls[0] = b, 0
                t = time.process_time()
                m = VerticalADMM(loss="logistic", lam=1e-4, penalty="l1", max_rounds=args.rounds,
                                 tol=0).fit(tr, y)
                cpu[b].append(time.process_time() - t)
                stats[b] = (calls[0], (m.history_[-1]["objective"] - F_STAR) / F_STAR)
    finally:
        X.FIRST_BURST, X._support_factor = default, factor
    print("| first burst | " + " | ".join(str(b) for b in bursts) + " |")
    print("|---" * (len(bursts) + 1) + "|")
    print("| support factorizations a fit | " + " | ".join(str(stats[b][0]) for b in bursts) + " |")
    print(f"| CPU s, median of {args.reps} | " + " | ".join(f"{np.median(cpu[b]):.3f}" for b in bursts) + " |")
    print(f"| gap at round {args.rounds} | " + " | ".join(f"{stats[b][1]:.3e}" for b in bursts) + " |")


if __name__ == "__main__":
    main()
