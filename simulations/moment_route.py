"""Both a9a parties private (issue 21 item 3): the moment-matching route against the stacked route.

a9a, paper split (party 1 = features 1-66, party 2 = 67-123), the label owner holds the labels only,
both feature parties private under the STRICT model (each adds its whole noise, protects its own
rows with its own budget; the server may collude with any other party), sample-level relation,
delta = 1e-5, exact accountant. Every epsilon printed is read from the parties' own ledgers.

Route (flower_vfl.estimator.moment_route): each party releases once g~_m = D_m^T v + N(0, sigma^2 I)
(v = kappa (t - pi) from the label owner, sensitivity 2 c_v); the joint L2 logistic model is the
minimizer of the pool objective (label-free half of the score equation averaged over unlabelled
rows). The pool is cross-fitted as in simulations/private_parties.py: the test set is split in two
halves (same fixed permutation); each half is scored by the model fitted on the other half's
features (no test label is used, no row's own features enter its own model).

The L2 coefficient lam is chosen per epsilon on the TRAINING set only: releases on 80 % of the
training rows, fits on the pool for every lam of the grid (refits are post-processing: free),
mean log-loss on the other 20 % (their labels) over 2 noise seeds. The test labels are used only
for the reported numbers.

    python simulations/moment_route.py [--seeds 3] [--out simulations/results]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from flower_vfl.core.scoring import normalize_rows
from flower_vfl.estimator.moment_route import MomentMatchingLogistic, solve_moment_logistic
from flower_vfl.privacy.party import PrivacyConfig

from _common import a9a_paper_split as load, figure, finish_epsilon_panel, metrics, save_figure, write_csv

EPSILONS = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]
DELTA = 1e-5
C_V = 1.0                      # scales the target only (the noise relative to the moment does not depend on it)
LAM_GRID = [1e-4, 3e-4, 1e-3, 3e-3]
SELECT_SEEDS = 2
#: the non-private references (docs/privacy.md, docs/privacy_parties.md)
REF = {"party1_alone": (0.8376, 0.3493), "all_nonprivate": (0.8498, 0.3238)}
GOAL = (0.845, 0.335)


def fit_release(B, y, eps, seed, pool):
    cfg = PrivacyConfig(epsilon=eps, delta=DELTA, c_v=C_V)
    return MomentMatchingLogistic([cfg, cfg], lam=LAM_GRID[0], random_state=seed).fit(B, y, pool)


def cross_fitted(model, Bt, halves, lam):
    """Test decisions: each half scored by the model refitted on the other half's features (free)."""
    f = np.empty(Bt[0].shape[0])
    for h in (0, 1):
        model.refit([b[halves[h]] for b in Bt], lam=lam)
        f[halves[1 - h]] = model.decision_function([b[halves[1 - h]] for b in Bt])
    return f


def select(B, y, Bt, halves, eps):
    """lam per epsilon: releases on 80 % of the training rows, validation log-loss on the other 20 %."""
    N = y.size
    perm = np.random.default_rng(0).permutation(N)
    tr, va = perm[: int(0.8 * N)], perm[int(0.8 * N):]
    Btr, Bva = [b[tr] for b in B], [b[va] for b in B]
    scores = {lam: [] for lam in LAM_GRID}
    for s in range(SELECT_SEEDS):
        m = fit_release(Btr, y[tr], eps, 10_000 + s, [b[halves[0]] for b in Bt])
        for lam in LAM_GRID:
            for h in (0, 1):
                m.refit([b[halves[h]] for b in Bt], lam=lam)
                scores[lam].append(metrics(m.decision_function(Bva), y[va])[1])
    rows = [dict(epsilon=eps, lam=lam, val_logloss=float(np.mean(v))) for lam, v in scores.items()]
    return min(rows, key=lambda r: r["val_logloss"])["lam"], rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epsilons", type=float, nargs="+", default=EPSILONS)
    ap.add_argument("--out", default="simulations/results")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        return plot(json.loads((out / "moment_route.json").read_text()), out / "moment_route.png")
    t0 = time.time()
    B, y, Bt, yt = load()
    perm = np.random.default_rng(12345).permutation(yt.size)
    halves = (np.sort(perm[: yt.size // 2]), np.sort(perm[yt.size // 2:]))
    # noise-free ceiling of the same construction (exact moment, same pool, lam = 1e-4)
    t = (y > 0).astype(float)
    pi = float(t.mean())
    h = [np.asarray(normalize_rows(b).T @ (t - pi)).ravel() / y.size for b in B]
    f0 = np.empty(yt.size)
    for k in (0, 1):
        xs, b0 = solve_moment_logistic([b[halves[k]] for b in Bt], h, pi, 1e-4)
        rest = [normalize_rows(b[halves[1 - k]]) for b in Bt]
        f0[halves[1 - k]] = sum(np.asarray(b @ x).ravel() for b, x in zip(rest, xs)) + b0
    ceiling = metrics(f0, yt)
    runs, selection, chosen = [], [], {}
    for eps in args.epsilons:
        lam, rows = select(B, y, Bt, halves, eps)
        selection += rows
        chosen[eps] = lam
        print(f"eps={eps:g}: lam={lam:g} chosen on the training set", flush=True)
        for seed in range(args.seeds):
            ts = time.time()
            m = fit_release(B, y, eps, seed, [b[halves[0]] for b in Bt])
            acc, ll = metrics(cross_fitted(m, Bt, halves, lam), yt)
            spent = max(p.ledger.spent() for p in m._parties)
            runs.append(dict(route="moment", epsilon=eps, seed=seed, lam=lam, epsilon_spent_ledger=spent,
                             test_acc=acc, test_logloss=ll, seconds=round(time.time() - ts, 2)))
            print(json.dumps(runs[-1]), flush=True)
    table = []
    for eps in args.epsilons:
        r = [x for x in runs if x["epsilon"] == eps]
        table.append(dict(route="moment", epsilon=eps, lam=chosen[eps],
                          epsilon_spent_ledger_max=max(x["epsilon_spent_ledger"] for x in r),
                          test_acc=float(np.mean([x["test_acc"] for x in r])),
                          test_acc_sd=float(np.std([x["test_acc"] for x in r])),
                          test_logloss=float(np.mean([x["test_logloss"] for x in r])),
                          test_logloss_sd=float(np.std([x["test_logloss"] for x in r])), n_seeds=len(r)))
    write_csv(out / "moment_route.csv", runs)
    write_csv(out / "moment_route.selection.csv", selection)
    stacked = None
    sp = out / "private_parties.json"
    if sp.exists():
        stacked = [r for r in json.loads(sp.read_text())["table"] if r["route"] == "stacked"]
    summary = {"table": table, "noise_free_ceiling": {"acc": ceiling[0], "logloss": ceiling[1]},
               "references": REF, "goal": GOAL, "stacked": stacked, "delta": DELTA, "c_v": C_V,
               "lam_selected_on": "training set only (80/20, 2 noise seeds)", "seeds": args.seeds,
               "seconds": round(time.time() - t0, 1)}
    (out / "moment_route.json").write_text(json.dumps(summary, indent=2))
    plot(summary, out / "moment_route.png")
    for r in table:
        print(f"moment eps={r['epsilon']:<5g} lam={r['lam']:g} spent={r['epsilon_spent_ledger_max']:.4f} "
              f"acc={r['test_acc']:.4f}±{r['test_acc_sd']:.4f} ll={r['test_logloss']:.4f}±{r['test_logloss_sd']:.4f}")
    print(f"noise-free ceiling {ceiling[0]:.4f} / {ceiling[1]:.4f}; {summary['seconds']} s")
    return 0


def plot(summary, path):
    table = summary["table"]
    fig, axes = figure(1, 2, figsize=(11, 4.2))
    panels = ((axes[0], "test_acc", "test accuracy"), (axes[1], "test_logloss", "test log-loss"))
    for i, (ax, key, lab) in enumerate(panels):
        ax.errorbar([x["epsilon"] for x in table], [x[key] for x in table], yerr=[x[key + "_sd"] for x in table],
                    fmt="o-", capsize=3, label="both private, moment route (strict)")
        if summary.get("stacked"):
            st = summary["stacked"]
            ax.errorbar([x["epsilon"] for x in st], [x[key] for x in st], yerr=[x[key + "_sd"] for x in st],
                        fmt="s--", capsize=3, label="both private, stacked SSP (strict)")
        ax.axhline(summary["goal"][i], color="C2", ls="--", lw=0.8, label=f"goal at ε = 1 ({summary['goal'][i]})")
        finish_epsilon_panel(ax, [x["epsilon"] for x in table], lab, summary["references"]["party1_alone"][i],
                             summary["references"]["all_nonprivate"][i])
    fig.suptitle(f"a9a, both feature parties private (strict model); mean ± sd over {summary['seeds']} seeds")
    save_figure(fig, path, dpi=120)
    return 0


if __name__ == "__main__":
    main()
