"""The spread of a private a9a run's test accuracy, and whether a Flower run's scores are the
in-process engine's plus the party's output noise (tests/test_flower.py,
test_flwr_run_private_party_on_a9a: party 1 private at eps = 1, output noise on its released x~,
dp-lam 3e-3, 20 rounds).

1. ``--runs`` engine fits, each with OS-entropy noise: accuracy mean, sd, min, max.
2. Each fit's scores split into a deterministic part f_det (every fit's, to round-off) plus
   T (x~ - x), T = party 1's normalized test rows; ``--draws`` Gaussian draws of x~ - x at the
   ledger's sigma give the accuracy distribution without refitting.
3. For each ``--flower`` decision_test.npy (a `flwr run` output folder's), the least-squares
   n with f_flower - f_det = T n and the residual: ~1e-13 means the Flower run is the engine's
   deterministic model plus party-1 noise; ||n|| is compared with sigma sqrt(d).

    python benchmarks/private_spread.py [--runs 60] [--draws 4000] [--flower out/decision_test.npy ...]
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse.linalg as spla

from flower_vfl import VerticalADMM
from flower_vfl.core.scoring import normalize_rows
from flower_vfl.io.data import labels, party_block
from flower_vfl.privacy import PrivacyConfig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--flower", nargs="*", default=[])
    args = ap.parse_args(argv)
    blocks = [party_block("a9a", i, 2) for i in range(2)]
    y, yt = labels("a9a")
    cfg = PrivacyConfig(epsilon=1.0, delta=1e-5, train_rounds=0, eval_rounds=1, lam=3e-3)
    T = normalize_rows(blocks[1][1])
    accs, f_det, sigma, drift = [], None, None, 0.0
    for _ in range(args.runs):
        m = VerticalADMM(lam=1e-4, max_rounds=20, tol=0, privacy=[None, cfg]).fit([b[0] for b in blocks], y)
        p = m._parties[1]
        f = m.decision_function([b[1] for b in blocks])
        accs.append(float(np.mean(np.where(f >= 0, 1, -1) == yt)))
        fd = f - T @ (p.x_released - p.x)
        if f_det is None:
            f_det = fd
            sigma = float(p.ledger.entries[0].sigma)
        drift = max(drift, float(np.max(np.abs(fd - f_det))))
    a = np.array(accs)
    print(f"engine, {args.runs} fits: accuracy mean {a.mean():.4f} sd {a.std(ddof=1):.4f} "
          f"min {a.min():.4f} max {a.max():.4f}; deterministic parts agree to {drift:.1e}; sigma {sigma:.6g}")
    d = blocks[1][1].shape[1]
    noise = np.random.default_rng(0).normal(size=(d, args.draws)) * sigma
    sim = np.mean(np.where(f_det[:, None] + T @ noise >= 0, 1, -1) == yt[:, None], axis=0)
    print(f"{args.draws} noise draws: accuracy mean {sim.mean():.4f} sd {sim.std(ddof=1):.4f} "
          f"q01 {np.quantile(sim, 0.01):.4f} min {sim.min():.4f}; below 0.839: {np.mean(sim < 0.839):.2%}")
    for path in args.flower:
        r = np.load(path) - f_det
        n = spla.lsqr(T, r, atol=1e-14, btol=1e-14, iter_lim=5000)[0]
        res = r - T @ n
        acc = float(np.mean(np.where(np.load(path) >= 0, 1, -1) == yt))
        print(f"{path}: accuracy {acc:.4f}; f_flower - f_det = T n with ||n|| {np.linalg.norm(n):.3f} "
              f"(sigma sqrt(d) {sigma * np.sqrt(d):.3f}), residual {np.linalg.norm(res) / np.linalg.norm(r):.1e} relative")


if __name__ == "__main__":
    main()
