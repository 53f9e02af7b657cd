"""Fig. 3 (and Figs. 1(b), 2(b)) of the paper: test log-loss of ADMM sharing under several
Gaussian noise levels sigma, in the paper's parameter-space form (eq. 16) and in the
output-space form (the Gaussian mechanism on s_m), with the local-only (party 1) and the
centralized sklearn models as horizontal lines. Every party's release is perturbed every
round (flower_vfl.baselines.noisy_admm, noise drawn by flower_vfl.privacy.mechanism).
These are raw noise levels, not privacy budgets: no epsilon is claimed here (the paper
form is not (eps, delta)-DP at all; docs/privacy.md has the budgeted protocol).

Claims checked: (c) the centralized model (and noise-free ADMM) beat party 1 alone;
(d) for each form some sigma > 0 ends within 5 % of the noise-free test log-loss
("moderate noise still converges") and the largest sigma ends above 2x it ("large noise
ruins the model").

    python simulations/fig3_noise.py              # full: a9a 30 rounds, gisette-like 20 rounds
    python simulations/fig3_noise.py --quick      # CI: 4000 a9a rows, small gisette-like, σ in {1, 1000}, 10 / 6 rounds

Writes fig3_noise.csv, .json and .png into --out (default simulations/results/figures/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _paper_figures as F  # noqa: E402
from _common import figure, save_figure, write_csv  # noqa: E402
from fig2_wide import FULL, LAM as LAM_WIDE, QUICK, split  # noqa: E402

from flower_vfl.baselines.noisy_admm import noisy_admm  # noqa: E402
from flower_vfl.io.data import column_ranges, load_all  # noqa: E402
from flower_vfl.datasets import load_gisette_like  # noqa: E402

SIGMAS = [1.0, 10.0, 100.0, 1000.0]
QUICK_SIGMAS = [1.0, 1000.0]
FORMS = ("paper", "output")
LAM_A9A = 1e-4


def datasets(quick):
    X, y, Xt, yt = load_all("a9a")
    if quick:
        idx = np.random.default_rng(0).choice(y.size, 4000, replace=False)
        X, y = X[idx], y[idx]
    cols = column_ranges("a9a", X.shape[1], 2)
    yield "a9a", [X[:, a:b].tocsr() for a, b in cols], y, [Xt[:, a:b].tocsr() for a, b in cols], yt, LAM_A9A, \
        10 if quick else 30
    X, y, Xt, yt = load_gisette_like(**(QUICK if quick else FULL))
    cols = split(X.shape[1])
    yield "gisette-like", [X[:, a:b] for a, b in cols], y, [Xt[:, a:b] for a, b in cols], yt, LAM_WIDE, \
        6 if quick else 20


def plot(path, results, title):
    fig, axes = figure(len(results), 2, figsize=(13, 4.6 * len(results)), squeeze=False)
    for i, (name, res) in enumerate(results.items()):
        for j, form in enumerate(FORMS):
            ax = axes[i, j]
            for k, (sigma, rows) in enumerate(res["curves"][form].items()):
                ax.plot([r["round"] for r in rows], [r["test_loss"] for r in rows], marker=".", color=f"C{k}",
                        label="no noise" if sigma == 0 else f"σ = {sigma:g}")
            for b, style in (("centralized", "--"), ("local_only_party1", ":")):
                v = res["baselines"][b]["test_loss"]
                ax.axhline(v, ls=style, color="k", lw=1.3, label=f"{b.replace('_', ' ')} (sklearn): {v:.4f}")
            ax.set_yscale("log")
            lo = 0.9 * min(res["baselines"]["centralized"]["test_loss"], res["curves"][form][0.0][-1]["test_loss"])
            ax.set_ylim(lo, 6 * res["baselines"]["local_only_party1"]["test_loss"])   # ruined curves leave the top
            ax.set_title(f"{name}: {'paper form, D(x+ξ), ξ~N(0,σ²(DᵀD)⁻¹)' if form == 'paper' else 'output form, Dx+e, e~N(0,σ²I)'}",
                         fontsize=9)
            ax.set_xlabel("ADMM round")
            ax.set_ylabel("test log-loss")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path, dpi=100)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="reduced setting for CI")
    ap.add_argument("--out", default=str(F.DEFAULT_OUT))
    ap.add_argument("--seed", type=int, default=0, help="noise seed")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, checks = {}, {}
    for name, B, y, Bt, yt, lam, rounds in datasets(args.quick):
        base = F.sklearn_baselines(B, y, Bt, yt, lam, tol=1e-6)
        curves = {form: {} for form in FORMS}
        jobs = [(form, s) for form in FORMS for s in [0.0] + (QUICK_SIGMAS if args.quick else SIGMAS)]
        for form, sigma in tqdm(jobs, desc=f"{name}: noise levels"):
            if sigma == 0 and form == "output":
                curves[form][0.0] = curves["paper"][0.0]          # the same noise-free run
                continue
            curves[form][sigma] = noisy_admm(B, y, Bt, yt, lam, sigma, form=form, rounds=rounds, seed=args.seed)
        clean = curves["paper"][0.0][-1]["test_loss"]
        local, central = base["local_only_party1"]["test_loss"], base["centralized"]["test_loss"]
        checks[f"{name}: c_centralized_beats_party1_alone"] = central < local
        checks[f"{name}: c_admm_beats_party1_alone"] = clean < local
        for form in FORMS:
            finals = {s: rows[-1]["test_loss"] for s, rows in curves[form].items() if s > 0}
            checks[f"{name}: d_{form}_moderate_noise_converges"] = any(v <= 1.05 * clean for v in finals.values())
            checks[f"{name}: d_{form}_large_noise_ruins"] = finals[max(finals)] > 2 * clean
        results[name] = {"lam": lam, "rounds": rounds, "rows": int(y.size), "parties": [b.shape[1] for b in B],
                         "baselines": base, "curves": curves,
                         "final": {form: {str(s): rows[-1]["test_loss"] for s, rows in curves[form].items()}
                                   for form in FORMS}}
    write_csv(out / "fig3_noise.csv",
              ({"dataset": name, "form": form, "sigma": sigma, **r} for name, res in results.items()
               for form in FORMS for sigma, rows in res["curves"][form].items() for r in rows),
              fieldnames=["dataset", "form", "sigma", "round", "objective", "test_loss", "test_accuracy",
                          "primal_residual"], extrasaction="ignore")
    F.write_json(out / "fig3_noise.json", {"quick": args.quick, "sigmas": SIGMAS, "seed": args.seed, "checks": checks,
                                           **{n: {k: v for k, v in r.items() if k != "curves"} for n, r in results.items()}})
    plot(out / "fig3_noise.png", results, "Fig. 3: ADMM sharing test log-loss under Gaussian noise on every party's "
         "release (raw σ levels, not privacy budgets; y axis cut at 6x local-only)" + (" [quick]" if args.quick else ""))
    for name, res in results.items():
        print(name, {f: {k: round(v, 4) for k, v in d.items()} for f, d in res["final"].items()},
              {b: round(v["test_loss"], 4) for b, v in res["baselines"].items()})
    print(f"checks {checks}\nwrote {out / 'fig3_noise.png'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
