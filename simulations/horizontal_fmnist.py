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

Example (the committed results)::

    python simulations/horizontal_fmnist.py --iterations 150 --seeds 5 --code-eps 0.05 0.1 1 3 5 --anchors \\
        --out simulations/results/horizontal/fmnist_iid_T150
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flower_vfl.horizontal import DPIADMMParams, agent_seeds  # noqa: E402
from flower_vfl.horizontal.engine import run_dpiadmm_many  # noqa: E402
from flower_vfl.horizontal.data import fashion_mnist_split  # noqa: E402

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
                    help="seed-runs folded into one GEMM per agent (settings batched together)")
    ap.add_argument("--rho-c1", type=float, default=2.0, help="eq. (21) c1 (MNIST: 2, FEMNIST: 0.005)")
    ap.add_argument("--rho-c2", type=float, default=5.0, help="eq. (21) c2 (MNIST: 5, FEMNIST: 0.05)")
    ap.add_argument("--rho-Tc", type=float, default=1e4, help="eq. (21) T_c (MNIST: 1e4, FEMNIST: 2e3)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--anchors", action="store_true", help="also run FedAvg and opacus DP-SGD")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--delta", type=float, default=1e-5, help="delta of the composed totals")
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
    """Group settings so that each batch folds at most ``cap`` seed-runs into one GEMM per agent."""
    out, cur, n = [], [], 0
    for j in jobs:
        if cur and n + j[-1] > cap:
            out.append(cur)
            cur, n = [], 0
        cur.append(j)
        n += j[-1]
    return out + ([cur] if cur else [])


def main(argv=None):
    args = parse(argv)
    from tqdm.auto import tqdm
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    Xp, yp, Xt, yt = fashion_mnist_split(args.agents, args.split, args.alpha, seed=42)
    seeds = agent_seeds(args.seed, args.seeds, args.agents)
    dtype = np.float32 if args.dtype == "float32" else np.float64
    curves, finals, privacy = [], [], {}
    timing = {"data_s": time.perf_counter() - t0}
    for batch in tqdm(batches(runs(args), args.batch), desc="batches"):
        ps = [DPIADMMParams(variant=v, eps_bar=e, trust=trust, c1=args.rho_c1, c2=args.rho_c2, Tc=args.rho_Tc)
              for _, v, e, trust, _ in batch]
        results = run_dpiadmm_many(Xp, yp, ps, args.iterations, [seeds[:S] for *_, S in batch], X_test=Xt,
                                   y_test=yt, eval_every=args.eval_every, progress=True, dtype=dtype)
        for (name, v, e, trust, S), res in zip(batch, results):
            for h in res.history:
                curves.append({"variant": name, "eps_bar": e if e is not None else "inf", **h})
            err = np.array([h["test_error"] for h in res.history if h["t"] == args.iterations])
            row = {"variant": name, "eps_bar": e if e is not None else "inf", "T": args.iterations, "seeds": S,
                   "test_error_mean": float(err.mean()), "test_error_p20": float(np.percentile(err, 20)),
                   "test_error_p80": float(np.percentile(err, 80))}
            if e is not None:
                tot = res.privacy(args.delta, seed=0)
                privacy[f"{name}@{e}"] = tot
                row.update(eps_bar_per_iteration=e, epsilon_total_pld_max=max(x["epsilon_pld"] for x in tot),
                           epsilon_total_basic=max(x["epsilon_basic"] for x in tot),
                           delta_total=args.delta if v != "outp" else f"{args.delta} (+ PLD of Gaussians)")
                print(f"{name} eps_bar={e}: per-iteration eps_bar={e} (paper's guarantee); over T="
                      f"{args.iterations} iterations per agent: PLD eps={row['epsilon_total_pld_max']:.4g} at "
                      f"delta={args.delta}, basic composition {row['epsilon_total_basic']:.4g}; test error "
                      f"{row['test_error_mean']:.4f}", flush=True)
            else:
                print(f"{name} non-private: test error {row['test_error_mean']:.4f}", flush=True)
            finals.append(row)
        timing["dpiadmm_s"] = time.perf_counter() - t0 - timing["data_s"]
        _write(out, curves, finals, privacy, args, timing)
    if args.anchors:
        ta = time.perf_counter()
        run_anchors(args, out, Xp, yp, Xt, yt, finals)
        timing["anchors_s"] = time.perf_counter() - ta
    timing["total_s"] = time.perf_counter() - t0
    _write(out, curves, finals, privacy, args, timing)
    from horizontal_plots import plot_fig1, plot_fig2a   # noqa: E402  (beside this script)
    plot_fig2a(out)
    plot_fig1(out)
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s wall ({timing})")


def run_anchors(args, out, Xp, yp, Xt, yt, finals):
    from flower_vfl.horizontal.anchors import dpsgd_fedavg, fedavg
    rows = []
    _, hist = fedavg(Xp, yp, 10, rounds=20, X_test=Xt, y_test=yt)
    rows.append({"anchor": "fedavg", "target_epsilon": "inf", "test_error": hist[-1]["test_error"],
                 "epsilon_spent_max": "", "rounds": 20})
    for target in (1.0, 3.0, 8.0):
        _, hist, eps = dpsgd_fedavg(Xp, yp, 10, target, delta=args.delta, rounds=10, X_test=Xt, y_test=yt)
        rows.append({"anchor": "dpsgd-opacus", "target_epsilon": target, "test_error": hist[-1]["test_error"],
                     "epsilon_spent_max": max(eps), "rounds": 10})
        print(f"DP-SGD (opacus RDP accountant): eps spent {max(eps):.3g} at delta={args.delta}, "
              f"test error {hist[-1]['test_error']:.4f}", flush=True)
    with open(out / "anchors.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _write(out, curves, finals, privacy, args, timing):
    for name, rows in (("curves.csv", curves), ("final.csv", finals)):
        if rows:
            keys = list(dict.fromkeys(k for r in rows for k in r))
            with open(out / name, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=keys)
                w.writeheader()
                w.writerows(rows)
    (out / "report.json").write_text(json.dumps({"args": vars(args), "command": " ".join(["python"] + sys.argv),
                                                  "final": finals, "wall_s": timing,
                                                  "privacy_per_agent_seed0": privacy}, indent=1, default=str))


if __name__ == "__main__":
    main()
