"""Reproduction of paper 2's MNIST experiment on Fashion-MNIST (Fig. 1 and Fig. 2a analogues).

ObjT, ObjP and OutP at eps_bar in {0.05, 0.1, 1, 3, 5} and non-private, every run with
``--seeds`` noise seeds (each agent its own seed per repetition), on 10 agents x 6000 (IID,
flwr-datasets' IidPartitioner) or a Dirichlet split; plus the anchors (FedAvg, opacus
DP-SGD at the totals the DP-IADMM runs reach). Writes into ``--out``:

- ``curves.csv``    variant, eps_bar, seed, t, test_error, noise_abs_mean, consensus_violation
- ``final.csv``     per (variant, eps_bar): mean / p20 / p80 test error at T, and the
                    per-agent privacy totals over the T iterations (PLD and basic), max over agents
- ``anchors.csv``   FedAvg and DP-SGD test errors and their accountants' epsilon
- ``report.json``   everything above plus the per-agent privacy of seed 0
- ``fig2a.png``, ``fig1.png``

Example (the committed IID results; ``simulations/horizontal_reproduce.py --iterations 900`` runs
this and the Dirichlet grid on one pool)::

    python simulations/horizontal_fmnist.py --iterations 900 --seeds 5 --code-eps 0.05 0.1 1 3 5 --anchors \\
        --workers 2 --out simulations/results/horizontal/fmnist_iid_T900

``--workers 2`` spreads the batches and anchors over two single-threaded processes (the fastest
on 2 cores); ``horizontal_reproduce.py`` runs both splits of the full reproduction in one pool.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flower_vfl.horizontal import DPIADMMParams, agent_seeds  # noqa: E402
from flower_vfl.horizontal.engine import run_dpiadmm_many  # noqa: E402
from flower_vfl.horizontal.data import fashion_mnist_split  # noqa: E402

from _common import write_csv  # noqa: E402  (beside this script)

PAPER_EPS = (0.05, 0.1, 1.0, 3.0, 5.0)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=200, help="T per run")
    ap.add_argument("--seeds", type=int, default=5, help="noise repetitions per (variant, eps_bar)")
    ap.add_argument("--eps", type=float, nargs="*", default=list(PAPER_EPS))
    ap.add_argument("--variants", nargs="+", default=["objt", "objp", "outp"])
    ap.add_argument("--trust", default="paper", choices=["paper", "constant"],
                    help="ObjT radius: a/t^2 (paper) or a (the authors' code)")
    ap.add_argument("--code-eps", type=float, nargs="*", default=None,
                    help="also run ObjT with the code's constant radius ('objt-code') at these eps_bar "
                         "(and non-private)")
    ap.add_argument("--split", default="iid", choices=["iid", "dirichlet"])
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--batch", type=int, default=10,
                    help="about this many seed-runs fold into one GEMM per agent (settings batched together; "
                         "~35 keeps the GEMMs at peak)")
    ap.add_argument("--rho-c1", type=float, default=2.0, help="eq. (21) c1 (MNIST: 2, FEMNIST: 0.005)")
    ap.add_argument("--rho-c2", type=float, default=5.0, help="eq. (21) c2 (MNIST: 5, FEMNIST: 0.05)")
    ap.add_argument("--rho-Tc", type=float, default=1e4, help="eq. (21) T_c (MNIST: 1e4, FEMNIST: 2e3)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--anchors", action="store_true", help="also run FedAvg and opacus DP-SGD")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--delta", type=float, default=1e-5, help="delta of the composed totals")
    ap.add_argument("--workers", type=int, default=1,
                    help="processes (single-threaded BLAS each); the batches and anchors are spread over them")
    ap.add_argument("--out", default="simulations/results/horizontal/fmnist_iid")
    return ap.parse_args(argv)


def runs(args):
    """(name, variant, eps_bar or None, trust, seeds) of every setting. Non-private runs draw no
    noise, so one run each is exact (no seeds to average)."""
    out = []
    for v in args.variants:
        trust = args.trust if v == "objt" else "paper"
        name = "objt-code" if (v == "objt" and trust == "constant") else v
        for e in [None] + list(args.eps):
            out.append((name, v, e, trust, args.seeds if e is not None else 1))
    if args.code_eps is not None:
        out += [("objt-code", "objt", e, "constant", args.seeds if e is not None else 1)
                for e in [None] + list(args.code_eps)]
    return out


def batches(jobs, cap):
    """Cut the settings, in order, into the fewest batches of about ``cap`` seed-runs each (each
    batch folds its seed-runs into one GEMM per agent), balanced so the batches cost the same."""
    total = sum(j[-1] for j in jobs)
    n = max(1, -(-total // max(1, int(cap))))
    out, acc = [[] for _ in range(n)], 0
    for j in jobs:
        out[min(n - 1, int((acc + j[-1] / 2) * n / total))].append(j)
        acc += j[-1]
    return [b for b in out if b]


def main(argv=None):
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    jobs = grid_jobs(args)
    res = run_jobs(jobs, args.workers)
    timing = {"workers": args.workers, **job_timing(jobs, res), "total_s": time.perf_counter() - t0}
    write_split(args, out, jobs, res, timing)
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s wall ({timing})")


# --- jobs: one grid split into independent pieces (settings batches, anchors), each run in a
# --- worker process (single-threaded BLAS) or in this one; results merged in job order


def grid_jobs(args, tag: str = ""):
    """The jobs of one split: DP-IADMM settings in batches of <= ``args.batch`` seed-runs (each
    batch shares its agents' GEMMs), then the anchors (FedAvg and one per DP-SGD target)."""
    cfg = {k: getattr(args, k) for k in ("split", "agents", "alpha", "seeds", "seed", "iterations", "eval_every",
                                          "rho_c1", "rho_c2", "rho_Tc", "dtype", "delta")}
    tag = tag or args.split
    bs = batches(runs(args), args.batch)
    jobs = [{"kind": "dpiadmm", "cfg": cfg, "batch": b, "name": f"{tag} batch {i + 1}/{len(bs)}",
             "seed_runs": sum(j[-1] for j in b)} for i, b in enumerate(bs)]
    if args.anchors:
        jobs += [{"kind": "anchor", "cfg": cfg, "anchor": a, "name": f"{tag} {a[0]}" + (f" eps={a[1]}" if a[1] else ""),
                  "seed_runs": 0} for a in ANCHORS]
    return jobs


ANCHORS = (("fedavg", None), ("dpsgd-opacus", 1.0), ("dpsgd-opacus", 3.0), ("dpsgd-opacus", 8.0))
_DATA = {}


def _data(cfg):
    key = (cfg["split"], cfg["agents"], cfg["alpha"])
    if key not in _DATA:
        _DATA[key] = fashion_mnist_split(cfg["agents"], cfg["split"], cfg["alpha"], seed=42)
    return _DATA[key]


def run_job(job, progress_every: int = 0):
    """Run one job; returns its rows (and the CPU and wall seconds it took)."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = _run_dpiadmm_job(job, progress_every) if job["kind"] == "dpiadmm" else _run_anchor_job(job)
    out.update(cpu_s=time.process_time() - c0, wall_s=time.perf_counter() - w0)
    return out


def _run_dpiadmm_job(job, progress_every):
    cfg, batch = job["cfg"], job["batch"]
    Xp, yp, Xt, yt = _data(cfg)
    T = cfg["iterations"]
    seeds = agent_seeds(cfg["seed"], cfg["seeds"], cfg["agents"])
    dtype = np.float32 if cfg["dtype"] == "float32" else np.float64
    ps = [DPIADMMParams(variant=v, eps_bar=e, trust=trust, c1=cfg["rho_c1"], c2=cfg["rho_c2"], Tc=cfg["rho_Tc"])
          for _, v, e, trust, _ in batch]
    w0 = time.perf_counter()

    def report(t):
        if t % progress_every == 0 and t < T:
            el = time.perf_counter() - w0
            print(f"  [{job['name']}, {job['seed_runs']} seed-runs] t={t}/{T}  {el:.0f} s, "
                  f"~{el * (T - t) / t:.0f} s to go", flush=True)

    results = run_dpiadmm_many(Xp, yp, ps, T, [seeds[:S] for *_, S in batch], X_test=Xt, y_test=yt,
                               eval_every=cfg["eval_every"], progress=report if progress_every else True, dtype=dtype)
    curves, finals, privacy, lines = [], [], {}, []
    for (name, v, e, trust, S), res in zip(batch, results):
        for h in res.history:
            curves.append({"variant": name, "eps_bar": e if e is not None else "inf", **h})
        err = np.array([h["test_error"] for h in res.history if h["t"] == T])
        row = {"variant": name, "eps_bar": e if e is not None else "inf", "T": T, "seeds": S,
               "test_error_mean": float(err.mean()), "test_error_p20": float(np.percentile(err, 20)),
               "test_error_p80": float(np.percentile(err, 80))}
        if e is not None:
            tot = res.privacy(cfg["delta"], seed=0)          # the accountant over seed 0's ledgers
            privacy[f"{name}@{e}"] = tot
            row.update(eps_bar_per_iteration=e, epsilon_total_pld_max=max(x["epsilon_pld"] for x in tot),
                       epsilon_total_basic=max(x["epsilon_basic"] for x in tot),
                       delta_total=cfg["delta"] if v != "outp" else f"{cfg['delta']} (+ PLD of Gaussians)")
            lines.append(f"{cfg['split']} {name} eps_bar={e}: per-iteration eps_bar={e} (paper's guarantee); over "
                         f"T={T} iterations per agent: PLD eps={row['epsilon_total_pld_max']:.4g} at "
                         f"delta={cfg['delta']}, basic composition {row['epsilon_total_basic']:.4g}; test error "
                         f"{row['test_error_mean']:.4f}")
        else:
            lines.append(f"{cfg['split']} {name} non-private: test error {row['test_error_mean']:.4f}")
        finals.append(row)
    return {"curves": curves, "finals": finals, "privacy": privacy, "lines": lines}


def _run_anchor_job(job):
    from flower_vfl.horizontal.anchors import dpsgd_fedavg, fedavg
    cfg, (anchor, target) = job["cfg"], job["anchor"]
    Xp, yp, Xt, yt = _data(cfg)
    if anchor == "fedavg":
        _, hist = fedavg(Xp, yp, 10, rounds=20, X_test=Xt, y_test=yt)
        return {"anchors": [{"anchor": "fedavg", "target_epsilon": "inf", "test_error": hist[-1]["test_error"],
                             "epsilon_spent_max": "", "rounds": 20}],
                "lines": [f"{cfg['split']} FedAvg (20 rounds): test error {hist[-1]['test_error']:.4f}"]}
    _, hist, eps = dpsgd_fedavg(Xp, yp, 10, target, delta=cfg["delta"], rounds=10, X_test=Xt, y_test=yt)
    return {"anchors": [{"anchor": "dpsgd-opacus", "target_epsilon": target, "test_error": hist[-1]["test_error"],
                         "epsilon_spent_max": max(eps), "rounds": 10}],
            "lines": [f"{cfg['split']} DP-SGD (opacus RDP accountant): eps spent {max(eps):.3g} at delta="
                      f"{cfg['delta']}, test error {hist[-1]['test_error']:.4f}"]}


def _single_threaded():
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass


def run_jobs(jobs, workers: int = 1, progress_every: int | None = None):
    """Run ``jobs``; with ``workers`` > 1 in that many processes with single-threaded BLAS (on
    2 cores this beats one process with 2 BLAS threads: the softmax, the noise draws and the
    anchors are single-threaded numpy/torch), the largest jobs first. Results in job order."""
    T = max((j["cfg"]["iterations"] for j in jobs), default=1)
    every = progress_every if progress_every is not None else max(1, T // 10)
    t0 = time.perf_counter()
    res = [None] * len(jobs)

    def done(i, r):
        res[i] = r
        n = sum(x is not None for x in res)
        print(f"[{n}/{len(jobs)} jobs, {time.perf_counter() - t0:.0f} s] {jobs[i]['name']}: {r['wall_s']:.0f} s wall, "
              f"{r['cpu_s']:.0f} s CPU", flush=True)
        for line in r["lines"]:
            print("  " + line, flush=True)

    if workers <= 1:
        for i, j in enumerate(jobs):
            done(i, run_job(j, every))
        return res
    import concurrent.futures as cf
    import multiprocessing as mp
    order = sorted(range(len(jobs)), key=lambda i: -_cost(jobs[i]))      # longest first
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_single_threaded) as ex:
        futs = {ex.submit(run_job, jobs[i], every): i for i in order}
        for f in cf.as_completed(futs):
            done(futs[f], f.result())
    return res


def _cost(job):
    """CPU ms, roughly, for the schedule: a seed-iteration costs ~21 + 0.33 P ms (GEMMs, then the
    per-agent noise draws and steps), an anchor ~25 s (measured on the 2-core machine)."""
    if job["kind"] == "anchor":
        return 3e3 if job["anchor"][0] == "fedavg" else 25e3
    return job["seed_runs"] * job["cfg"]["iterations"] * (21.0 + 0.33 * job["cfg"]["agents"])


def job_timing(jobs, res):
    return {"dpiadmm_cpu_s": sum(r["cpu_s"] for j, r in zip(jobs, res) if j["kind"] == "dpiadmm"),
            "anchors_cpu_s": sum(r["cpu_s"] for j, r in zip(jobs, res) if j["kind"] == "anchor"),
            "jobs": [{"name": j["name"], "seed_runs": j["seed_runs"], "wall_s": round(r["wall_s"], 1),
                      "cpu_s": round(r["cpu_s"], 1)} for j, r in zip(jobs, res)]}


def write_split(args, out, jobs, res, timing):
    """Merge one split's job results into curves.csv, final.csv, anchors.csv, report.json and
    the figures."""
    curves = [c for r in res for c in r.get("curves", [])]
    finals = [f for r in res for f in r.get("finals", [])]
    privacy = {k: v for r in res for k, v in r.get("privacy", {}).items()}
    anchors = [a for r in res for a in r.get("anchors", [])]
    if anchors:
        write_csv(out / "anchors.csv", anchors)
    _write(out, curves, finals, privacy, args, timing)
    from horizontal_plots import plot_fig1, plot_fig2a   # noqa: E402  (beside this script)
    plot_fig2a(out)
    plot_fig1(out)


def _write(out, curves, finals, privacy, args, timing):
    for name, rows in (("curves.csv", curves), ("final.csv", finals)):
        if rows:
            write_csv(out / name, rows)
    (out / "report.json").write_text(json.dumps({"args": vars(args), "command": " ".join(["python"] + sys.argv),
                                                  "final": finals, "wall_s": timing,
                                                  "privacy_per_agent_seed0": privacy}, indent=1, default=str))


if __name__ == "__main__":
    main()
