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

    python simulations/horizontal_fmnist.py --iterations 100 --seeds 3 --code-eps 0.05 1 5 --anchors \\
        --out simulations/results/horizontal/fmnist_iid
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

from flower_vfl.horizontal import DPIADMMParams, agent_seeds, run_dpiadmm  # noqa: E402
from flower_vfl.horizontal.data import fashion_mnist_split  # noqa: E402

PAPER_EPS = (0.05, 0.1, 1.0, 3.0, 5.0)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=200, help="T per run")
    ap.add_argument("--seeds", type=int, default=5, help="noise repetitions per (variant, eps_bar)")
    ap.add_argument("--eps", type=float, nargs="+", default=list(PAPER_EPS))
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
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--anchors", action="store_true", help="also run FedAvg and opacus DP-SGD")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--delta", type=float, default=1e-5, help="delta of the composed totals")
    ap.add_argument("--out", default="simulations/results/horizontal/fmnist_iid")
    return ap.parse_args(argv)


def runs(args):
    out = []
    for v in args.variants:
        for e in [None] + list(args.eps):
            if e is None and v == "objp" and "outp" in args.variants:
                continue                      # ObjP = OutP without noise (the paper's remark)
            out.append((v, e, args.trust if v == "objt" else "paper"))
    if args.code_eps is not None:
        out += [("objt", e, "constant") for e in [None] + list(args.code_eps)]
    return out


def main(argv=None):
    args = parse(argv)
    from tqdm.auto import tqdm
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Xp, yp, Xt, yt = fashion_mnist_split(args.agents, args.split, args.alpha, seed=42)
    seeds = agent_seeds(args.seed, args.seeds, args.agents)
    dtype = np.float32 if args.dtype == "float32" else np.float64
    curves, finals, privacy = [], [], {}
    t0 = time.perf_counter()
    for v, e, trust in tqdm(runs(args), desc="runs"):
        name = v if trust == "paper" or v != "objt" else "objt-code"
        p = DPIADMMParams(variant=v, eps_bar=e, trust=trust)
        S = args.seeds if e is not None else 1
        res = run_dpiadmm(Xp, yp, p, args.iterations, seeds[:S], X_test=Xt, y_test=yt,
                          eval_every=args.eval_every, progress=True, dtype=dtype)
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
            print(f"{name} eps_bar={e}: per-iteration eps_bar={e} (paper's guarantee); over T={args.iterations} "
                  f"iterations per agent: PLD eps={row['epsilon_total_pld_max']:.4g} at delta={args.delta}, "
                  f"basic composition {row['epsilon_total_basic']:.4g}; test error {row['test_error_mean']:.4f}",
                  flush=True)
        finals.append(row)
        _write(out, curves, finals, privacy, args, time.perf_counter() - t0)
    if args.anchors:
        run_anchors(args, out, Xp, yp, Xt, yt, finals)
    _write(out, curves, finals, privacy, args, time.perf_counter() - t0)
    from horizontal_plots import plot_fig1, plot_fig2a   # noqa: E402  (beside this script)
    plot_fig2a(out)
    plot_fig1(out)
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s")


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


def _write(out, curves, finals, privacy, args, elapsed):
    for name, rows in (("curves.csv", curves), ("final.csv", finals)):
        if rows:
            keys = list(dict.fromkeys(k for r in rows for k in r))
            with open(out / name, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=keys)
                w.writeheader()
                w.writerows(rows)
    (out / "report.json").write_text(json.dumps({"args": vars(args), "final": finals, "elapsed_s": elapsed,
                                                  "privacy_per_agent_seed0": privacy}, indent=1, default=str))


if __name__ == "__main__":
    main()
