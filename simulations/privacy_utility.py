"""Privacy-utility on a9a (2 parties, paper split): test accuracy / log-loss vs total epsilon.

Sample-level relation, strict calibration, delta=1e-5, exact accountant, the private
protocol of docs/privacy.md (warm start by the non-private side, ``T`` released training
rounds, one unreleased final x-update, one evaluation release).

How the settings are chosen (tuning on the test set would itself leak): for every budget,
``T`` (released training rounds), the private party's own ``lam``, ``rho`` and the ball
radius ``b1`` are chosen by mean validation log-loss over ``--select-seeds`` noise draws on a
20 % validation split carved out of the TRAINING set. The x-update clip ``c_v`` is not
tuned: it is the public bound 1/(N rho_x) of the warm-started target. The test set is
touched once per budget, after the choice: refit on the whole training set, ``--test-seeds``
noise draws, mean and standard deviation reported. Every epsilon in the output is read
from the parties' own ledgers (the exact accountant over the noise actually drawn).

Settings (the trust assumption of each is in docs/privacy.md, "The privacy-utility table"):

- ``p2``: only party 2 is private (party 1's columns sit with the label owner, the paper's
  "local party");
- ``both``: both parties private, the ADMM route above (strict model: the server may collude
  with any other party);
- ``strict``: both parties private, strict model, the stacked SSP route of issue 21 item 2
  (:class:`~flower_vfl.estimator.stacked.StackedPrivateParties`, c_v = 1.5, ridge = 1 as chosen
  on the training set by simulations/private_parties.py; calibration pool: the test set,
  cross-fitted halves), ``--test-seeds`` noise draws, no selection on the test set;
- ``distributed``: both parties private with distributed noise, k = 0 (each party's node config
  accepts that the server colludes with no other party): the ADMM route with ``T`` >= 1 released
  training rounds whose releases go into the secure sum as integers carrying each party's share
  of Skellam noise (:class:`~flower_vfl.privacy.distributed.DistributedParty`, 2 adders, h = 2,
  each share v / 2). In process: each party's term of the sum is its integer release / gamma,
  which is exactly what the central node decodes in the Flower path (tests/test_secagg_flower.py).
  ``T`` = 0 has no secure sum of training releases: it is the ``both`` row. The epsilon of these
  rows is the charged one (against the server and k colluders; RDP at integer orders).
- ``moment``: both parties private, strict model, the moment route of issue 21 item 3
  (:class:`~flower_vfl.estimator.moment_route.MomentMatchingLogistic`; one noisy label moment per
  party, the joint model fitted on the unlabelled test rows as the pool, cross-fitted halves;
  ``lam`` chosen per budget on the training set by simulations/moment_route.py's ``select``),
  ``--test-seeds`` noise draws. The pool rows are not DP-protected (docs/privacy_parties.md).

    python simulations/privacy_utility.py [--quick] [--settings p2 both strict distributed moment]
        [--out simulations/results/privacy_utility]

Rows of the settings not run are kept from the existing CSV (the figure shows every setting).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from tqdm.auto import tqdm

from flower_vfl import VerticalADMM
from flower_vfl.estimator.stacked import StackedPrivateParties
from flower_vfl.privacy.distributed import DistributedParty
from flower_vfl.privacy.party import PrivacyConfig, PrivateParty
from flower_vfl.secagg import FixedPoint

from _common import a9a_paper_split as load, figure, log_ticks, metrics, read_csv, save_figure, write_csv

EPSILONS = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, float("inf")]
DELTA = 1e-5
LAM = 1e-4              # the non-private problem's lam (party 1, and the eps = inf row)
WARM_ROUNDS, WARM_TOL = 40, 1e-5
GRID = dict(T=[0, 1], lam_p=[1e-3, 3e-3, 1e-2], kappa=[0.05, 0.125], b1=[1.0, 2.0, 4.0])
QUICK_GRID = dict(T=[0, 1], lam_p=[3e-3], kappa=[0.05], b1=[2.0])
#: distributed noise needs released training rounds (T >= 1); kappa and b1 as "both" picks at eps >= 1
DIST_GRID = dict(T=[1, 2], lam_p=[3e-3, 1e-2], kappa=[0.125], b1=[4.0])
QUICK_DIST_GRID = dict(T=[1], lam_p=[1e-2], kappa=[0.125], b1=[4.0])
#: the stacked route's constants (simulations/private_parties.py chose them on the training set)
STACK_C_V, STACK_RIDGE = 1.5, 1.0
#: k of the parties' node configs in the distributed rows, and the roster's fixed-point exponent
#: (two parties at the default secagg-bound 1e4)
DIST_K = 0
K_FP = FixedPoint([1e4, 1e4]).k
SETTINGS = ("p2", "both", "strict", "distributed", "moment")
LABELS = {"p2": "party 2 private (party 1 non-private)", "both": "both private, ADMM (strict)",
          "strict": "both private, stacked SSP (strict, item 2)",
          "distributed": f"both private, ADMM + distributed noise (k={DIST_K}, T>=1)",
          "moment": "both private, moment route (strict, item 3; unlabelled pool)"}


class _DistributedInProcess(DistributedParty):
    """A distributed party in process: its term of the secure sum is round(gamma s) + share over gamma,
    exactly what the central node decodes from the masked integers (2 adders: both parties' verified
    adverts carry the same profile)."""

    adders = 2

    def train_release(self, round, q, y, rho, alpha=1.0, theta=1.0, inputs=None):
        r = self.distributed_release(round, q, y, rho, adders=self.adders, max_bits=K_FP, alpha=alpha,
                                     theta=theta, inputs=inputs)
        g = self.ledger.answer(self.run, int(round), "train").payload["guarantees"]
        return r / 2.0 ** int(g[4])


class _DistributedADMM(VerticalADMM):
    """VerticalADMM whose private parties add only their share of the noise (k = DIST_K)."""

    def _make_parties(self, blocks, penalty, constraint, loss):
        parties = super()._make_parties(blocks, penalty, constraint, loss)
        return [_DistributedInProcess(p.D, None, self.lam, p.config, DIST_K, party_id=m, n_parties=len(blocks))
                if isinstance(p, PrivateParty) else p for m, p in enumerate(parties)]


def stacked_eval(B, y, Bv, yv, eps, seed):
    """The stacked SSP route (item 2), calibration pool = the evaluation rows, cross-fitted halves."""
    cfg = PrivacyConfig(epsilon=eps, delta=DELTA, c_v=STACK_C_V)
    perm = np.random.default_rng(12345).permutation(yv.size)
    halves = (np.sort(perm[: yv.size // 2]), np.sort(perm[yv.size // 2:]))
    rows = lambda idx: [b[idx] for b in Bv]  # noqa: E731
    m = StackedPrivateParties([cfg, cfg], ridge=STACK_RIDGE, random_state=seed).fit(B, y, rows(halves[0]))
    f = np.empty(yv.size)
    f[halves[1]] = m.decision_function(rows(halves[1]))
    m.calibrate(rows(halves[1]))                    # free: the same released models, the other pool
    f[halves[0]] = m.decision_function(rows(halves[0]))
    return metrics(f, yv), max(r["totals"]["exact"] for r in m.privacy_report())


#: the moment route's lam per budget, chosen once on the training set (moment_route.select)
MOMENT_LAM = {}


def moment_eval(B, y, Bv, yv, eps, seed):
    """The moment route (item 3): pool = the evaluation rows, cross-fitted halves, the functions
    simulations/moment_route.py uses (lam chosen on the training set once per budget)."""
    import moment_route as mr
    perm = np.random.default_rng(12345).permutation(yv.size)
    halves = (np.sort(perm[: yv.size // 2]), np.sort(perm[yv.size // 2:]))
    if eps not in MOMENT_LAM:
        MOMENT_LAM[eps] = mr.select(B, y, Bv, halves, eps)[0]
    m = mr.fit_release(B, y, eps, seed, [b[halves[0]] for b in Bv])
    return (metrics(mr.cross_fitted(m, Bv, halves, MOMENT_LAM[eps]), yv),
            max(p.ledger.spent() for p in m._parties))


def fit_eval(B, y, Bv, yv, eps, setting, T, lam_p, kappa, b1, seed):
    """Fit on (B, y), one evaluation release on Bv; returns (acc, logloss), privacy report."""
    n, M = y.size, len(B)
    rho = kappa / n
    if np.isinf(eps):
        m = VerticalADMM(lam=LAM, rho=rho, max_rounds=60, tol=0).fit(B, y)
        return metrics(m.decision_function(Bv), yv), None
    rho_x = rho * M                       # the party's x-update uses rho / theta, theta = 1/M
    c_v = 1.0 / (n * rho_x)               # |v| <= |y| / rho_x <= 1 / (N rho_x) at the warm start
    cfg = PrivacyConfig(epsilon=eps, delta=DELTA, train_rounds=T, eval_rounds=1, b1=b1, c_v=c_v,
                        c_s=1.0, lam=lam_p, seed=seed)
    privacy = [None, cfg] if setting == "p2" else [cfg, cfg]
    cls = _DistributedADMM if setting == "distributed" else VerticalADMM
    m = cls(lam=LAM, rho=rho, max_rounds=WARM_ROUNDS, tol=WARM_TOL, privacy=privacy).fit(B, y)
    f = m.decision_function(Bv)           # the one evaluation release each private party budgeted
    return metrics(f, yv), m.privacy_report()


def spent_of(report) -> float:
    """The largest epsilon a party's ledger charged (distributed: against the server and k colluders)."""
    return max(r["distributed"]["epsilon_charged_colluding"] if "distributed" in r else r["totals"]["exact"]
               for r in report)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one grid point per budget (minutes)")
    ap.add_argument("--out", default="simulations/results/privacy_utility")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--select-seeds", type=int, default=2)
    ap.add_argument("--test-seeds", type=int, default=5)
    ap.add_argument("--epsilons", type=float, nargs="+", default=EPSILONS,
                    help="total budgets (inf: the non-private row)")
    ap.add_argument("--lam-grid", type=float, nargs="+", default=None,
                    help="candidate lam of the private party (default: the built-in grid)")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the CSV and summary")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        return replot(out)
    B, y, Bt, yt = load()
    N = y.size
    perm = np.random.default_rng(args.seed).permutation(N)
    tr, va = perm[: int(0.8 * N)], perm[int(0.8 * N):]
    Btr, Bva = [b[tr] for b in B], [b[va] for b in B]

    # reference lines (non-private, scikit-learn, same objective: lam/2 ||w||^2, free intercept)
    p1 = LogisticRegression(C=1 / (N * LAM), tol=1e-10, max_iter=5000).fit(B[0], y)
    p1_acc, p1_ll = metrics(p1.decision_function(Bt[0]), yt)
    grids = {"p2": dict(QUICK_GRID if args.quick else GRID)}
    if args.lam_grid:
        grids["p2"]["lam_p"] = list(args.lam_grid)
    grids["both"] = grids["p2"]
    grids["distributed"] = dict(QUICK_DIST_GRID if args.quick else DIST_GRID)
    rows, selection = [], []
    t0 = time.time()
    for setting in args.settings:
        grid = grids.get(setting, {})
        combos = list(itertools.product(*grid.values()))
        for eps in args.epsilons:
            if setting in ("strict", "moment"):
                if np.isinf(eps):
                    continue
                run = stacked_eval if setting == "strict" else moment_eval
                res = [run(B, y, Bt, yt, eps, seed=args.seed + 100 + rep) for rep in range(args.test_seeds)]
                accs, lls = [r[0][0] for r in res], [r[0][1] for r in res]
                rows.append(dict(setting=setting, epsilon=eps, epsilon_spent_exact=max(r[1] for r in res),
                                 train_rounds=0, lam_private=MOMENT_LAM.get(eps, float("nan")) if setting == "moment"
                                 else float("nan"), rho_kappa=float("nan"), b1=float("nan"),
                                 test_acc=float(np.mean(accs)), test_acc_sd=float(np.std(accs)),
                                 test_logloss=float(np.mean(lls)), test_logloss_sd=float(np.std(lls)),
                                 n_draws=len(accs)))
                print(json.dumps(rows[-1]), flush=True)
                continue
            if setting == "distributed" and np.isinf(eps):
                continue
            if np.isinf(eps):
                choice = (0, LAM, 0.05, float("inf"))
            else:
                scores = []
                for combo in tqdm(combos, desc=f"{setting} eps={eps} (validation)", leave=False):
                    lls = [fit_eval(Btr, y[tr], Bva, y[va], eps, setting, *combo, seed=10_000 + s)[0][1]
                           for s in range(args.select_seeds)]
                    scores.append(float(np.mean(lls)))
                    selection.append(dict(setting=setting, epsilon=eps, **dict(zip(grid, combo)),
                                          val_logloss=scores[-1]))
                choice = combos[int(np.argmin(scores))]
            accs, lls, spent = [], [], []
            for rep in range(1 if np.isinf(eps) else args.test_seeds):
                (acc, ll), report = fit_eval(B, y, Bt, yt, eps, setting, *choice, seed=args.seed + 100 + rep)
                accs.append(acc)
                lls.append(ll)
                if report:
                    spent.append(spent_of(report))
            T, lam_p, kappa, b1 = choice
            rows.append(dict(setting=setting, epsilon=eps,
                             epsilon_spent_exact=max(spent) if spent else float("inf"),
                             train_rounds=T, lam_private=lam_p, rho_kappa=kappa, b1=b1,
                             test_acc=float(np.mean(accs)), test_acc_sd=float(np.std(accs)),
                             test_logloss=float(np.mean(lls)), test_logloss_sd=float(np.std(lls)),
                             n_draws=len(accs)))
            print(json.dumps(rows[-1]), flush=True)
    csv_path = out / "privacy_utility.csv"
    if csv_path.exists():                  # keep the rows of the settings not run now
        kept = [r for r in _read_rows(csv_path) if r["setting"] not in args.settings]
        rows = kept + rows
    write_csv(csv_path, rows)
    write_csv(out / f"selection{'' if set(args.settings) == set(SETTINGS) else '.' + '_'.join(args.settings)}.csv",
              selection)
    old = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    summary = {"party1_alone": {"acc": p1_acc, "logloss": p1_ll},
               "centralized_reference": {"acc": 0.8498, "logloss": 0.3238},
               "grid": {**{k: v for k, v in old.get("grid", {}).items() if k in SETTINGS and k not in args.settings},
                        **{k: grids[k] for k in grids if k in args.settings}},
               "settings_run": args.settings, "distributed_k": DIST_K,
               "stacked_constants": {"c_v": STACK_C_V, "ridge": STACK_RIDGE},
               "selection": "mean validation log-loss over select_seeds noise draws on a 20% split of "
                            "the training set; the test set is used once per budget",
               "select_seeds": args.select_seeds, "test_seeds": args.test_seeds,
               "seconds": time.time() - t0}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(rows, p1_acc, p1_ll, out / "privacy_utility.png")
    print(json.dumps(summary, indent=2))


def _read_rows(path):
    return [{k: (v if k == "setting" else float(v) if v != "" else float("nan")) for k, v in r.items()}
            for r in read_csv(path)]


def replot(out):
    rows = _read_rows(out / "privacy_utility.csv")
    p1 = json.loads((out / "summary.json").read_text())["party1_alone"]
    plot(rows, p1["acc"], p1["logloss"], out / "privacy_utility.png")
    return 0


#: the panels' ranges; a mean outside is drawn on the edge with its value
YLIM = {"test_acc": (0.80, 0.852), "test_logloss": (0.32, 0.40)}


COLORS = {"p2": "C0", "both": "C1", "strict": "C2", "distributed": "C4", "moment": "C5"}


def plot(rows, p1_acc, p1_ll, path):
    fig, axes = figure(1, 2, figsize=(11, 5.2))
    for ax, key, p1v, cv, lab in ((axes[0], "test_acc", p1_acc, 0.8498, "test accuracy"),
                                  (axes[1], "test_logloss", p1_ll, 0.3238, "test log-loss")):
        for setting, mk in (("p2", "o-"), ("both", "s--"), ("strict", "D-"), ("distributed", "^:"),
                            ("moment", "P-")):
            r = [x for x in rows if x["setting"] == setting and np.isfinite(x["epsilon"])]
            if not r:
                continue
            lo, hi = YLIM[key]
            inside = [x for x in r if lo <= x[key] <= hi]
            ax.errorbar([x["epsilon_spent_exact"] for x in inside], [x[key] for x in inside],
                        yerr=[x[key + "_sd"] for x in inside], fmt=mk, capsize=3, color=COLORS[setting],
                        label=LABELS[setting])
            for x in r:                   # off the chart: a hollow marker on the edge with the value
                if not lo <= x[key] <= hi:
                    edge = lo if x[key] < lo else hi
                    ax.plot(x["epsilon_spent_exact"], edge, mk[0], color=COLORS[setting], mfc="none", clip_on=False)
                    ax.annotate(f"{x[key]:.3f}", (x["epsilon_spent_exact"], edge), fontsize=7,
                                xytext=(0, 6 if edge == lo else -10), textcoords="offset points", ha="center")
        ax.axhline(p1v, color="C3", ls=":", label=f"party 1 alone ({p1v:.4f})")
        ax.axhline(cv, color="k", ls="-.", label=f"centralized ({cv:.4f})")
        log_ticks(ax, sorted({x["epsilon_spent_exact"] for x in rows if np.isfinite(x["epsilon"])}), "{:.3g}")
        ax.set_ylim(*YLIM[key])
        ax.set_xlabel("total ε charged per party (δ=1e-5, parties' ledgers)")
        ax.set_ylabel(lab)
    handles, labels = axes[0].get_legend_handles_labels()
    labels = [lab.replace(f" ({p1_acc:.4f})", "").replace(" (0.8498)", "") for lab in labels]
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("a9a, 2 parties (paper split), sample-level DP; mean ± sd over noise draws; hollow marker "
                 "with a value: off the chart", fontsize=10)
    save_figure(fig, path, dpi=120, rect=(0, 0.1, 1, 1))


if __name__ == "__main__":
    main()
