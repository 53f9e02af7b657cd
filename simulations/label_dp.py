"""Label privacy on a9a: test accuracy / log-loss vs the label owner's epsilon_label.

The label owner privatizes its training labels once by randomized response (flip probability
p = 1/(1+e^eps), pure eps-label-DP, ledgered by dp-accounting) and trains with the
forward-corrected logistic loss (flower_vfl/core/label_noise.py). Two settings, 2 parties on
the paper split (66 / 57 columns), lam = 1e-4:

- ``public``: no private feature party;
- ``p2``: party 2 private at (eps=1, delta=1e-5), its own lam 3e-3 (docs/privacy.md protocol),
  feature noise seed = the run's seed.

Central references on the pooled data (scipy L-BFGS, same privatized labels, same lam):
``central_forward`` (the corrected loss, started from the naive solution) and
``central_naive`` (plain logistic on the flipped labels). Every noise seed draws new label
flips (and, for p2, new feature noise); mean and sd over ``--seeds`` seeds are reported. The
test set is only scored: nothing is tuned here.

    python simulations/label_dp.py [--seeds 5] [--out simulations/results/label_dp]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
from scipy.optimize import minimize
from tqdm.auto import tqdm

from flower_vfl import VerticalADMM
from flower_vfl.core.label_noise import ForwardCorrectedLogistic
from flower_vfl.core.losses import LogisticLoss
from flower_vfl.io.data import load_all, party_block
from flower_vfl.privacy import PrivacyConfig
from flower_vfl.privacy.label_dp import flip_probability, label_epsilon_spent, randomized_response

from _common import figure, metrics, save_figure, write_csv

EPS_LABEL = [0.5, 1.0, 2.0, 4.0, float("inf")]
LAM, MAX_ROUNDS, TOL = 1e-4, 300, 1e-8
FEATURE_DP = PrivacyConfig(epsilon=1.0, delta=1e-5, lam=3e-3)


def central_fit(X, t, loss, w0=None):
    """(1/N) sum l(Xw + b, t) + lam/2 ||w||^2, unpenalized b, by scipy L-BFGS."""
    n = X.shape[0]

    def obj(wb):
        u = X @ wb[:-1] + wb[-1]
        g = loss.grad(u, t)
        return loss.mean(u, t) + LAM / 2 * wb[:-1] @ wb[:-1], np.r_[X.T @ g / n + LAM * wb[:-1], g.mean()]

    res = minimize(obj, np.zeros(X.shape[1] + 1) if w0 is None else w0, jac=True, method="L-BFGS-B",
                   options={"maxiter": 20000, "gtol": 1e-9, "ftol": 1e-15})
    return res.x


def run(seeds, out: Path):
    X, y, Xt, yt = load_all("a9a")
    Xr, Xtr = X.tocsr(), Xt.tocsr()
    blocks = [party_block("a9a", i, 2) for i in range(2)]
    train, test = [b[0] for b in blocks], [b[1] for b in blocks]
    rows = []
    jobs = [(e, s) for e in EPS_LABEL for s in range(seeds)]
    for eps, seed in tqdm(jobs, desc="eps_label x seed"):
        label_eps = None if math.isinf(eps) else eps
        ledger = label_epsilon_spent(eps) if label_eps else float("inf")
        base = {"eps_label": eps, "seed": seed, "flip_probability": flip_probability(eps),
                "eps_label_ledger": ledger}
        for setting, privacy in (("public", None), ("p2", [None, FEATURE_DP])):
            t0 = time.perf_counter()
            m = VerticalADMM(lam=LAM, max_rounds=MAX_ROUNDS, tol=TOL, label_epsilon=label_eps,
                             label_seed=seed, privacy=privacy, random_state=seed)
            m.fit(train, y)
            acc, ll = metrics(m.decision_function(test), yt)
            rep = m.privacy_report()
            feat_eps = next((r["totals"]["exact"] for r in rep if r["party_id"] == 1), 0.0)
            lab = next((r["totals"]["pld"] for r in rep if r["party_id"] == "label owner"), float("inf"))
            rows.append(dict(base, method=f"admm_{setting}", test_accuracy=acc, test_logloss=ll,
                             rounds=m.n_rounds_, eps_label_ledger=lab, eps_features_party2=feat_eps,
                             seconds=time.perf_counter() - t0))
        if not label_eps and seed > 0:
            continue        # no label noise: the central fits do not depend on the seed
        # central references on the same privatized labels (label_seed = seed: the same draw)
        t = randomized_response(y, eps, seed=seed) if label_eps else y
        w_naive = central_fit(Xr, t, LogisticLoss())
        acc, ll = metrics(Xtr @ w_naive[:-1] + w_naive[-1], yt)
        rows.append(dict(base, method="central_naive", test_accuracy=acc, test_logloss=ll))
        if label_eps:
            w_fwd = central_fit(Xr, t, ForwardCorrectedLogistic(flip_probability(eps)), w0=w_naive)
        else:
            w_fwd = w_naive
        acc, ll = metrics(Xtr @ w_fwd[:-1] + w_fwd[-1], yt)
        rows.append(dict(base, method="central_forward", test_accuracy=acc, test_logloss=ll))
    out.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("eps_label", "method", "seed"), k))
    write_csv(out / "runs.csv", rows, fieldnames=keys)
    summary = summarize(rows)
    write_csv(out / "summary.csv", summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, out / "label_dp.png")
    return summary


def summarize(rows):
    out = []
    for method in ("admm_public", "admm_p2", "central_forward", "central_naive"):
        for eps in EPS_LABEL:
            sel = [r for r in rows if r["method"] == method and r["eps_label"] == eps]
            acc = np.array([r["test_accuracy"] for r in sel])
            ll = np.array([r["test_logloss"] for r in sel])
            out.append({"method": method, "eps_label": eps, "n_seeds": len(sel),
                        "acc_mean": acc.mean(), "acc_sd": acc.std(ddof=1) if acc.size > 1 else 0.0,
                        "logloss_mean": ll.mean(), "logloss_sd": ll.std(ddof=1) if ll.size > 1 else 0.0,
                        "eps_label_ledger": sel[0]["eps_label_ledger"]})
    return out


def plot(summary, path):
    xs = {e: (e if math.isfinite(e) else 8.0) for e in EPS_LABEL}
    style = {"admm_public": ("ADMM, features public", "C0", "o-"),
             "admm_p2": ("ADMM, party 2 private (eps=1)", "C1", "s-"),
             "central_forward": ("central, forward-corrected", "k", "x--"),
             "central_naive": ("central, naive on flipped labels", "C3", "v:")}
    fig, axes = figure(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "acc", "test accuracy"), (axes[1], "logloss", "test log-loss")):
        for method, (name, color, fmt) in style.items():
            sel = [r for r in summary if r["method"] == method]
            ax.errorbar([xs[r["eps_label"]] for r in sel], [r[f"{key}_mean"] for r in sel],
                        yerr=[r[f"{key}_sd"] for r in sel], fmt=fmt, color=color, label=name, capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_xticks([xs[e] for e in EPS_LABEL], ["0.5", "1", "2", "4", "∞ (no label DP)"])
        ax.set_xlabel("label-DP epsilon of the label owner (randomized response)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].axhline(0.8498, color="grey", lw=0.8)
    axes[0].set_ylim(0.76, 0.86)
    axes[1].axhline(0.3238, color="grey", lw=0.8)
    axes[1].set_ylim(0.31, 0.60)
    axes[1].legend(fontsize=8)
    fig.suptitle("a9a, 2 parties (66/57 columns), lam=1e-4: mean ± sd over noise seeds; grey: non-private")
    save_figure(fig, path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default="simulations/results/label_dp")
    args = ap.parse_args()
    for r in run(args.seeds, Path(args.out)):
        print(f"{r['method']:16s} eps_label={r['eps_label']:<4g} acc={r['acc_mean']:.4f}±{r['acc_sd']:.4f} "
              f"logloss={r['logloss_mean']:.4f}±{r['logloss_sd']:.4f} (n={r['n_seeds']}, "
              f"ledger eps={r['eps_label_ledger']:.4g})")


if __name__ == "__main__":
    main()
