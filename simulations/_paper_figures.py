"""Shared pieces of the paper's Figures 1-3 (simulations/fig1_a9a.py, fig2_wide.py, fig3_noise.py).

Curves are lists of dicts with the same keys as the runs' metrics.csv (round, objective,
train_loss, test_loss, test_accuracy) plus the communication of each method:

- ADMM sharing, per round: M messages down (q and y, 2 N-vectors each) and M up (s_m),
  i.e. 2 M messages and 3 M N float64 values (what VerticalADMMStrategy sends);
- vertical SGD, per epoch: ceil(N / batch) steps of 2 M messages of |B| values each.

The SGD step size is chosen on the TRAINING objective only (a small grid, ``tune_epochs``
epochs each, lowest final objective wins), never on test data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.special import log_expit
from tqdm.auto import tqdm

from flower_vfl import VerticalADMM
from flower_vfl.baselines import VerticalSGD, centralized_logreg, logreg_objective
from flower_vfl.baselines.sklearn_baselines import stack_blocks

from _common import figure, save_figure, write_csv as _write_rows

ROOT = Path(__file__).resolve().parent
DEFAULT_OUT = ROOT / "results" / "figures"


def logloss(f, y):
    return float(np.mean(-log_expit(np.asarray(y) * np.asarray(f).ravel())))


def admm_curve(B, y, Bt, yt, lam, rounds, **kw):
    """VerticalADMM (zero init, the paper's setting) with test metrics after every round."""
    rows = []
    n, M = len(y), len(B)

    def cb(k, m):
        f = m.decision_function(Bt)
        h = m.history_[-1]
        rows.append({"round": k, "objective": h["objective"], "train_loss": h.get("train_loss"),
                     "test_loss": logloss(f, yt), "test_accuracy": float(np.mean(np.sign(f) == yt)),
                     "messages": 2 * M * k, "bytes": 3 * M * n * 8 * k, "steps": k,
                     "primal_residual": h["primal_residual"], "dual_residual": h["dual_residual"]})
    VerticalADMM(lam=lam, max_rounds=rounds, tol=0, callback=cb, verbose=True, **kw).fit(B, y)
    return rows


def sgd_curve(B, y, Bt, yt, lam, epochs, grid, tune_epochs, batch_size, seed=0):
    """VerticalSGD with the step chosen on the training objective; returns (rows, chosen)."""
    best = None
    for lr, decay in tqdm(grid, desc="SGD step-size grid (train objective)", leave=False):
        m = VerticalSGD(lam=lam, lr=lr, lr_schedule="inverse", lr_decay=decay, batch_size=batch_size,
                        max_epochs=tune_epochs, random_state=seed).fit(B, y)
        obj = m.history_[-1]["objective"]
        if np.isfinite(obj) and (best is None or obj < best[0]):
            best = (obj, lr, decay)
    _, lr, decay = best
    m = VerticalSGD(lam=lam, lr=lr, lr_schedule="inverse", lr_decay=decay, batch_size=batch_size,
                    max_epochs=epochs, random_state=seed, verbose=True).fit(B, y, eval_set=(Bt, yt))
    rows = [{k: h.get(k) for k in ("round", "objective", "train_loss", "test_loss", "test_accuracy",
                                     "messages", "bytes", "steps")} for h in m.history_]
    return rows, {"lr": lr, "lr_schedule": "inverse", "lr_decay": decay, "batch_size": batch_size}


def sklearn_baselines(B, y, Bt, yt, lam, tol=1e-8):
    """Centralized (all columns) and local-only (party 1) LogisticRegression at C = 1/(lam N)."""
    out = {}
    for name, fit_blocks, test_blocks in (("centralized", B, Bt), ("local_only_party1", B[:1], Bt[:1])):
        est = centralized_logreg(fit_blocks, y, lam, tol=tol)
        X, Xt = stack_blocks(fit_blocks), stack_blocks(test_blocks)
        ft = est.decision_function(Xt)
        out[name] = {"objective": logreg_objective(X, y, est.coef_.ravel(), float(est.intercept_[0]), lam),
                     "test_loss": logloss(ft, yt), "test_accuracy": float(np.mean(np.sign(ft) == yt))}
    return out


def rounds_to_target(rows, target, key="test_loss"):
    """First round from which ``key`` stays <= target to the end of the run (None: never)."""
    first = None
    for r in rows:
        v = r.get(key)
        if v is not None and v <= target:
            first = r["round"] if first is None else first
        else:
            first = None
    return first


CURVE_COLUMNS = ["method", "round", "objective", "train_loss", "test_loss", "test_accuracy", "messages", "bytes",
                 "steps"]


def write_csv(path, curves: dict[str, list[dict]]):
    """Every method's curve in one table, one row per round/epoch (CURVE_COLUMNS; other keys dropped)."""
    return _write_rows(path, ({"method": name, **r} for name, rows in curves.items() for r in rows),
                       fieldnames=CURVE_COLUMNS, extrasaction="ignore")


def write_run_dirs(out, curves: dict[str, list[dict]], config: dict):
    """One run directory per method (report.json, metrics.csv, run.png), for
    ``flower-vfl report DIR_A DIR_B --out overlay.png``."""
    from flower_vfl.reporting.report import write_report

    dirs = []
    for name, rows in curves.items():
        algo = "sgd" if "SGD" in name else "admm"
        d = Path(out) / algo
        write_report(d, config, rows, dict(rows[-1], rounds=rows[-1]["round"]),
                     extra={"engine": "in-process", "algorithm": algo, "method": name})
        dirs.append(d)
    return dirs


def write_json(path, obj):
    Path(path).write_text(json.dumps(obj, indent=2, default=float))


def plot_curves(path, curves, baselines, title, x_label="epoch (SGD) / round (ADMM)", panels=None):
    """Training objective and test log-loss against epochs/rounds; baselines as dashed lines."""
    panels = panels or [("objective", "training objective (log-loss + λ/2‖x‖²)"), ("test_loss", "test log-loss")]
    opt = next((b["objective"] for b in baselines.values() if "objective" in b), None)
    if opt is not None:          # the tail the first panel cannot show: distance to the optimum
        curves = {name: [dict(r, gap=max(r["objective"] - opt, 1e-12)) for r in rows] for name, rows in curves.items()}
        panels = panels + [("gap", "objective − centralized optimum (sklearn)")]
    fig, axes = figure(1, len(panels), figsize=(5.6 * len(panels), 4.6))
    axes = np.atleast_1d(axes)
    for ax, (key, label) in zip(axes, panels):
        for name, rows in curves.items():
            pts = [(r["round"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="." if len(pts) <= 60 else None, label=name)
        for j, (bname, b) in enumerate(baselines.items()):
            if key in b:
                ax.axhline(b[key], ls="--", color=f"C{7 + j}", lw=1.2, label=f"{bname} (sklearn): {b[key]:.4f}")
        ax.set_xlabel(x_label)
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ref = [b[key] for b in baselines.values() if key in b and key != "gap"]
        if ref:              # an early SGD spike would flatten every curve: cut the axis at 4x the optimum
            ys = [r[key] for rows in curves.values() for r in rows if r.get(key) is not None]
            ax.set_ylim(0.97 * min(ys + ref), min(max(ys), 4 * max(ref)) * 1.05)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(title + "\n(y axes cut at 4x the centralized optimum)", fontsize=10)
    save_figure(fig, path, dpi=100)
    return path
