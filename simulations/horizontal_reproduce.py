"""The full Fashion-MNIST reproduction of the horizontal DP inexact ADMM in one command.

Both grids of docs/reproduction-horizontal.md section 2 and their anchors, at one T:

- IID, 10 agents x 6000: ObjT (paper radius), ObjP, OutP and ObjT (code radius) at eps_bar in
  {0.05, 0.1, 1, 3, 5} x ``--seeds`` noise seeds, and non-private (104 seed-runs at 5 seeds);
- Dirichlet, 50 agents, alpha 0.5: OutP and ObjT (code radius) at eps_bar in {0.05, 1, 5} and
  non-private (32 seed-runs);
- per split: FedAvg and opacus DP-SGD at total epsilon 1, 3, 8.

All the jobs (batches of settings sharing their agents' GEMMs, and the anchors) go to one pool
of ``--workers`` processes with single-threaded BLAS, largest first, so that both cores stay
busy to the end. Progress: a line per job every T/10 iterations and one per finished job
with its test errors and privacy totals. Writes ``<out-root>/fmnist_iid_T<T>`` and
``<out-root>/fmnist_dir50_T<T>`` (the files of horizontal_fmnist.py)::

    python simulations/horizontal_reproduce.py --iterations 900
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import horizontal_fmnist as hf  # noqa: E402


def split_args(a):
    """The two documented horizontal_fmnist.py commands at this T (section 2 of the docs)."""
    T, root = str(a.iterations), Path(a.out_root)
    common = ["--iterations", T, "--seeds", str(a.seeds), "--eval-every", str(a.eval_every), "--seed", str(a.seed)]
    common += ["--anchors"] if a.anchors else []
    iid = hf.parse(common + ["--variants", "objt", "objp", "outp", "--code-eps", "0.05", "0.1", "1", "3", "5",
                             "--batch", str(a.iid_batch), "--workers", str(a.workers),
                             "--out", str(root / f"fmnist_iid_T{T}")])
    dirichlet = hf.parse(common + ["--split", "dirichlet", "--agents", "50", "--alpha", "0.5", "--variants", "outp",
                                   "--eps", "0.05", "1", "5", "--code-eps", "0.05", "1", "5",
                                   "--batch", str(a.dir_batch), "--workers", str(a.workers),
                                   "--out", str(root / f"fmnist_dir50_T{T}")])
    return [s for s, on in ((iid, "iid" in a.splits), (dirichlet, "dirichlet" in a.splits)) if on]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=900, help="T of every DP-IADMM run")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--workers", type=int, default=2, help="processes, single-threaded BLAS each")
    ap.add_argument("--iid-batch", type=int, default=35, help="seed-runs per IID job (104 in all)")
    ap.add_argument("--dir-batch", type=int, default=32, help="seed-runs per Dirichlet job (32 in all)")
    ap.add_argument("--splits", nargs="+", default=["iid", "dirichlet"], choices=["iid", "dirichlet"])
    ap.add_argument("--no-anchors", dest="anchors", action="store_false")
    ap.add_argument("--out-root", default="simulations/results/horizontal")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    splits = split_args(a)
    jobs = [hf.grid_jobs(s) for s in splits]
    flat = [j for js in jobs for j in js]
    print(f"{len(flat)} jobs, {sum(j['seed_runs'] for j in flat)} seed-runs x T={a.iterations}, "
          f"{a.workers} workers", flush=True)
    res = hf.run_jobs(flat, a.workers)
    k = 0
    for s, js in zip(splits, jobs):
        r, k = res[k:k + len(js)], k + len(js)
        out = Path(s.out)
        out.mkdir(parents=True, exist_ok=True)
        hf.write_split(s, out, js, r, {"workers": a.workers, **hf.job_timing(js, r),
                                       "total_s_both_splits": time.perf_counter() - t0,
                                       "command": " ".join(["python"] + sys.argv)})
        print(f"wrote {out}", flush=True)
    print(f"full reproduction: {time.perf_counter() - t0:.0f} s wall", flush=True)


if __name__ == "__main__":
    main()
