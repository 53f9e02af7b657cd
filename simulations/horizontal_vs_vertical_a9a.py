"""Vertical vs horizontal on a9a at the same total epsilon (issue 12, item 7).

Horizontal: DP inexact ADMM (ObjT as printed, ObjT with the code's constant radius, ObjP,
OutP) with a9a's training rows split IID (flwr-datasets IidPartitioner) over 2, 5 and 10
agents; features in {0, 1} plus a constant column (the intercept), K = 2 softmax. For each
total epsilon (delta = 1e-5) and number of iterations T, the per-iteration eps_bar is the one
whose T-fold composition (PLD, :func:`flower_vfl.horizontal.privacy.eps_bar_for_total`) costs
that total; T in ``--T-grid`` and the rho constants of eq. (21) (the paper's MNIST or FEMNIST
set) are chosen by mean validation log-loss on a 20 % validation split
of the TRAINING rows (2 noise draws); then refit on all training rows and scored on the test
set over ``--test-seeds`` draws. The epsilon column is read back from the agents' ledgers.

Vertical: the committed results of ``simulations/privacy_utility.py``
(``simulations/results/privacy_utility/privacy_utility.csv``), read, not rerun.

    python simulations/horizontal_vs_vertical_a9a.py --out simulations/results/horizontal/a9a_compare
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flower_vfl.io.data import load_all  # noqa: E402
from flower_vfl.horizontal import DPIADMMParams, agent_seeds  # noqa: E402
from flower_vfl.horizontal.engine import run_dpiadmm_many  # noqa: E402
from flower_vfl.horizontal.data import split_arrays  # noqa: E402
from flower_vfl.horizontal.model import softmax  # noqa: E402
from flower_vfl.horizontal.privacy import eps_bar_for_total  # noqa: E402

from _common import figure, read_csv, save_figure, write_csv  # noqa: E402

VARIANTS = {"objt": ("objt", "paper"), "objt-code": ("objt", "constant"), "objp": ("objp", "paper"),
            "outp": ("outp", "paper")}


def scores(W, X, y):
    """Test accuracy and log-loss of every W in a batch (S, J, 2)."""
    H = softmax(np.matmul(X, W))
    acc = np.mean(np.argmax(H, -1) == y, axis=-1)
    ll = -np.mean(np.log(np.clip(np.take_along_axis(H, y[None, :, None], -1)[..., 0], 1e-300, None)), axis=-1)
    return acc, ll


def a9a_dense(data_dir=None):
    X, y, Xt, yt = load_all("a9a", data_dir)
    add1 = lambda A: np.hstack([np.asarray(A.todense()), np.ones((A.shape[0], 1))])  # noqa: E731
    return add1(X), (np.asarray(y) > 0).astype(int), add1(Xt), (np.asarray(yt) > 0).astype(int)


#: a9a rows are 14 one-hot groups (exactly 14 ones) plus our constant column: ||x||_1 <= 15
#: is a public bound from the data format, so the strict 'replace' calibration can use it
X_L1_MAX = 15.0


#: eq. (21)'s constants (c1, c2, Tc) of the paper's two instances (App. A.9)
RHO_SETS = {"mnist": (2.0, 5.0, 1e4), "femnist": (0.005, 0.05, 2e3)}


def params_for(name, total, T, delta, sensitivity="replace", rho_set="mnist"):
    """The agents' settings of one comparison cell and its per-iteration eps_bar (None: non-private)."""
    variant, trust = VARIANTS[name]
    c1, c2, Tc = RHO_SETS[rho_set]
    eb = None if total is None else eps_bar_for_total(total, T, delta, variant)
    return DPIADMMParams(variant=variant, eps_bar=eb, trust=trust, sensitivity=sensitivity, x_l1_max=X_L1_MAX,
                         c1=c1, c2=c2, Tc=Tc), eb


def fit_many(parts, cells, T, n_seeds, seed, delta, sensitivity="replace", progress=False):
    """Every cell ``(name, total, rho_set)`` on the same agents ``parts`` in one
    :func:`run_dpiadmm_many` (they share each agent's GEMMs); private cells with ``n_seeds``
    noise draws, non-private ones with one. The same results as one ``run_dpiadmm`` per cell with
    ``agent_seeds(seed, S, P)`` (tests/test_horizontal_a9a_compare.py). Returns ``[(W (S, J, 2), eps_bar, spent PLD epsilon)]``."""
    Xp, yp = parts
    P = len(yp)
    ps = [params_for(name, total, T, delta, sensitivity, rs) for name, total, rs in cells]
    seeds = [agent_seeds(seed, 1 if eb is None else n_seeds, P) for _, eb in ps]
    res = run_dpiadmm_many(Xp, yp, [p for p, _ in ps], T, seeds, K=2, progress=progress)
    return [(r.W, eb, None if eb is None else max(a["epsilon_pld"] for a in r.privacy(delta, seed=0)))
            for r, (_, eb) in zip(res, ps)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epsilons", type=float, nargs="+", default=[0.25, 0.5, 1, 2, 4, 8])
    ap.add_argument("--agents", type=int, nargs="+", default=[2, 5, 10])
    ap.add_argument("--variants", nargs="+", default=["objt-code", "objp", "outp"], choices=list(VARIANTS))
    ap.add_argument("--T-grid", type=int, nargs="+", default=[50, 200, 1000])
    ap.add_argument("--rho-sets", nargs="+", default=["mnist", "femnist"], choices=list(RHO_SETS))
    ap.add_argument("--select-seeds", type=int, default=2)
    ap.add_argument("--test-seeds", type=int, default=3)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sensitivity", default="replace", choices=["replace", "eq20"],
                    help="'replace' (strict, any one row replaced; default) or the paper's eq. 20")
    ap.add_argument("--out", default="simulations/results/horizontal/a9a_compare")
    args = ap.parse_args(argv)
    from tqdm.auto import tqdm
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    X, y, Xt, yt = a9a_dense()
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(len(y))
    n_val = len(y) // 5
    Xv, yv, Xtr, ytr = X[perm[:n_val]], y[perm[:n_val]], X[perm[n_val:]], y[perm[n_val:]]
    rows, t0 = [], time.perf_counter()
    cells = [(v, e) for v in args.variants for e in [None] + list(args.epsilons)]
    bar = tqdm(total=len(args.agents) * (len(args.T_grid) + 1), desc="a9a horizontal (runs)")
    for P in args.agents:
        # selection: every cell at every (T, rho set) on the training part, one batched run per T
        best = {}
        sel_parts = split_arrays(Xtr, ytr, P, "iid")
        for T in args.T_grid:
            batch = [(name, total, rs) for name, total in cells for rs in args.rho_sets]
            for (name, total, rs), (W, _, _) in zip(batch, fit_many(sel_parts, batch, T, args.select_seeds,
                                                                  args.seed + T, args.delta, args.sensitivity, True)):
                ll = float(np.mean(scores(W, Xv, yv)[1]))
                if (name, total) not in best or ll < best[name, total][1]:
                    best[name, total] = (T, ll, rs)
            bar.update()
        # refit every cell at its chosen (T, rho set) on all training rows, grouped by T
        full_parts = split_arrays(X, y, P, "iid")
        for T in sorted({b[0] for b in best.values()}):
            group = [(name, total, best[name, total][2]) for name, total in cells if best[name, total][0] == T]
            fits = fit_many(full_parts, group, T, args.test_seeds, args.seed + 1000 + T, args.delta,
                            args.sensitivity, True)
            for (name, total, rs), (W, eb, spent) in zip(group, fits):
                acc, ll = scores(W, Xt, yt)
                rows.append({"setting": f"horizontal {name}", "agents": P, "epsilon": total if total else "inf",
                             "epsilon_spent_pld": spent if spent is not None else "inf", "T": T, "rho_set": rs,
                             "eps_bar_per_iteration": eb if eb else "inf", "val_logloss": best[name, total][1],
                             "test_acc": float(acc.mean()), "test_acc_sd": float(acc.std()),
                             "test_logloss": float(ll.mean()), "test_logloss_sd": float(ll.std()),
                             "n_draws": len(acc)})
        bar.update()
        rows.sort(key=lambda r: (r["agents"], args.variants.index(r["setting"].split()[1]),
                                 float("inf") if r["epsilon"] == "inf" else r["epsilon"]))
        _write(out, rows, args, time.perf_counter() - t0)
    bar.close()
    vert = ROOT / "simulations/results/privacy_utility/privacy_utility.csv"
    if vert.exists():
        for r in read_csv(vert):
            rows.append({"setting": f"vertical {'party 2 private' if r['setting'] == 'p2' else 'both private'}",
                         "agents": 2, "epsilon": r["epsilon"], "epsilon_spent_pld": r["epsilon_spent_exact"],
                         "T": r["train_rounds"], "test_acc": float(r["test_acc"]),
                         "test_acc_sd": float(r["test_acc_sd"]), "test_logloss": float(r["test_logloss"]),
                         "test_logloss_sd": float(r["test_logloss_sd"]), "n_draws": r["n_draws"]})
    _write(out, rows, args, time.perf_counter() - t0)
    plot(out)
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s")


ROOT = Path(__file__).resolve().parents[1]


def _write(out, rows, args, elapsed):
    write_csv(out / "comparison.csv", rows)
    (out / "summary.json").write_text(json.dumps({"args": vars(args), "elapsed_s": elapsed}, indent=1))


def plot(out):
    rows = read_csv(Path(out) / "comparison.csv")
    agents = sorted({int(r["agents"]) for r in rows if r["setting"].startswith("horizontal")})
    fig, axes = figure(1, len(agents), figsize=(5.2 * len(agents), 4.8), sharey=True, squeeze=False)
    axes = axes[0]
    ref = next((float(r["test_acc"]) for r in rows if r["setting"].startswith("vertical") and r["epsilon"] == "inf"),
               None)
    for ax, P in zip(axes, agents):
        for s in dict.fromkeys(r["setting"] for r in rows):
            sel = [r for r in rows if r["setting"] == s and r["epsilon"] != "inf"
                   and (s.startswith("vertical") or int(r["agents"]) == P)]
            if not sel:
                continue
            e = np.array([float(r["epsilon"]) for r in sel])
            a = np.array([float(r["test_acc"]) for r in sel])
            sd = np.array([float(r["test_acc_sd"]) for r in sel])
            ls = "--" if s.startswith("vertical") else "-"
            ax.errorbar(e, a, yerr=sd, ls=ls, marker="o", ms=3, capsize=2, label=s)
        if ref is not None:
            ax.axhline(ref, color="k", ls=":", label=f"vertical non-private = its centralized optimum ({ref:.4f})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("total ε over the whole run (δ = 1e-5)")
        ax.set_title(f"a9a: vertical (2 parties) vs horizontal ({P} agents)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[0].set_ylim(0.72, 0.86)
    axes[0].legend(fontsize=7, loc="lower right")
    save_figure(fig, Path(out) / "comparison.png", dpi=130)


def markdown(out):
    """The comparison table (test accuracy and log-loss at each total epsilon) as Markdown."""
    rows = read_csv(Path(out) / "comparison.csv")
    lines = ["| setting | agents / parties | total ε (PLD, from the ledger) | T | ρ constants | test acc (mean ± sd) | test log-loss |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        spent = r["epsilon_spent_pld"]
        spent = "∞" if spent == "inf" else f"{float(spent):.3g}"
        lines.append(f"| {r['setting']} | {r['agents']} | {spent} | {r['T']} | {r.get('rho_set') or '—'} | "
                     f"{float(r['test_acc']):.4f} ± {float(r['test_acc_sd']):.4f} | {float(r['test_logloss']):.4f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print(markdown(sys.argv[2]))
    else:
        main()
