"""Figures of the horizontal reproduction (read the CSVs of horizontal_fmnist.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLORS = {"objt": "tab:red", "objp": "tab:blue", "outp": "tab:green", "objt-code": "tab:purple"}
LABELS = {"objt": "ObjT (paper: δ_t=a/t²)", "objp": "ObjP", "outp": "OutP (Huang et al.)",
          "objt-code": "ObjT (code: constant radius)"}


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def plot_fig2a(out):
    """Test error at T vs eps_bar (log axis), 20/80-percentile bars; non-private as lines."""
    out = Path(out)
    rows = _read(out / "final.csv")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for v in dict.fromkeys(r["variant"] for r in rows):
        pr = sorted((float(r["eps_bar"]), r) for r in rows if r["variant"] == v and r["eps_bar"] != "inf")
        if pr:
            e = np.array([x for x, _ in pr])
            m = np.array([float(r["test_error_mean"]) for _, r in pr]) * 100
            lo = m - np.array([float(r["test_error_p20"]) for _, r in pr]) * 100
            hi = np.array([float(r["test_error_p80"]) for _, r in pr]) * 100 - m
            ax.errorbar(e, m, yerr=[lo, hi], marker="o", capsize=3, color=COLORS.get(v), label=LABELS.get(v, v))
        for r in rows:
            if r["variant"] == v and r["eps_bar"] == "inf":
                ax.axhline(float(r["test_error_mean"]) * 100, ls=":", color=COLORS.get(v),
                           label=f"{LABELS.get(v, v)}, non-private")
    if (out / "anchors.csv").exists():
        for r in _read(out / "anchors.csv"):
            if r["anchor"] == "fedavg":
                ax.axhline(float(r["test_error"]) * 100, ls="--", color="k", label="FedAvg (non-private)")
    T = rows[0]["T"]
    ax.set_xscale("log")
    ax.set_xlabel("ε̄ (per-iteration guarantee of the paper; NOT the run's total)")
    ax.set_ylabel(f"test error at T={T} (%)")
    ax.set_title("Fashion-MNIST, 10 agents: test error vs per-iteration ε̄ (Fig. 2a analogue)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "fig2a.png", dpi=130)
    plt.close(fig)


def plot_fig1(out, eps_list=(0.05, 0.1, 1.0)):
    """Noise magnitude (top) and test error (bottom) per iteration, mean with 20/80 bands."""
    out = Path(out)
    rows = _read(out / "curves.csv")
    eps_list = [e for e in eps_list if any(r["eps_bar"] != "inf" and float(r["eps_bar"]) == e for r in rows)]
    if not eps_list:
        return
    fig, axes = plt.subplots(2, len(eps_list), figsize=(4.2 * len(eps_list), 6.5), squeeze=False)
    for j, e in enumerate(eps_list):
        for v in dict.fromkeys(r["variant"] for r in rows):
            sel = [r for r in rows if r["variant"] == v and r["eps_bar"] != "inf" and float(r["eps_bar"]) == e]
            if not sel:
                continue
            ts = sorted({int(r["t"]) for r in sel})
            for i, key in enumerate(("noise_abs_mean", "test_error")):
                vals = np.array([[float(r[key]) for r in sel if int(r["t"]) == t] for t in ts])
                scale = 100 if key == "test_error" else 1
                ax = axes[i, j]
                ax.plot(ts, vals.mean(1) * scale, color=COLORS.get(v), label=LABELS.get(v, v))
                ax.fill_between(ts, np.percentile(vals, 20, 1) * scale, np.percentile(vals, 80, 1) * scale,
                                color=COLORS.get(v), alpha=0.2)
        for v in dict.fromkeys(r["variant"] for r in rows):     # non-private reference, dotted
            sel = sorted((int(r["t"]), float(r["test_error"])) for r in rows if r["variant"] == v and r["eps_bar"] == "inf")
            if sel:
                axes[1, j].plot([t for t, _ in sel], [x * 100 for _, x in sel], ls=":", color=COLORS.get(v),
                                label=f"{LABELS.get(v, v)}, non-private")
        axes[0, j].set_title(f"ε̄ = {e} per iteration")
        axes[0, j].set_ylabel("mean |noise| per coordinate")
        axes[1, j].set_ylabel("test error (%)")
        axes[1, j].set_xlabel("iteration t")
        axes[1, j].set_ylim(0, 100)
        for i in range(2):
            axes[i, j].grid(alpha=0.3)
    axes[1, 0].legend(fontsize=7)
    fig.suptitle("Fashion-MNIST IID, 10 agents: mean and 20/80-percentile band over noise seeds (Fig. 1 analogue)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "fig1.png", dpi=130)
    plt.close(fig)




def merge(dirs, out):
    """Concatenate final.csv / curves.csv / anchors.csv of several runs (e.g. variants run as
    separate processes) into ``out`` and draw the figures there."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("final.csv", "curves.csv", "anchors.csv"):
        rows = []
        for d in dirs:
            if (Path(d) / name).exists():
                rows += _read(Path(d) / name)
        if rows:
            keys = list(dict.fromkeys(k for r in rows for k in r))
            with open(out / name, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=keys)
                w.writeheader()
                w.writerows(rows)
    plot_fig2a(out)
    plot_fig1(out)


def markdown(out):
    """The final table (test error % at T, 20/80 percentiles, privacy totals) as Markdown."""
    rows = _read(Path(out) / "final.csv")
    lines = ["| variant | ε̄ per iteration | seeds | test error % (p20–p80) | total ε over T, PLD (δ=1e-5) | basic T·ε̄ |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        tot = r.get("epsilon_total_pld_max") or "—"
        lines.append(f"| {LABELS.get(r['variant'], r['variant'])} | {r['eps_bar']} | {r['seeds']} | "
                     f"{float(r['test_error_mean']) * 100:.2f} ({float(r['test_error_p20']) * 100:.2f}–"
                     f"{float(r['test_error_p80']) * 100:.2f}) | {float(tot):.3g} | {r.get('epsilon_total_basic') or '—'} |"
                     if tot != "—" else
                     f"| {LABELS.get(r['variant'], r['variant'])} | non-private | {r['seeds']} | "
                     f"{float(r['test_error_mean']) * 100:.2f} | — | — |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    # python simulations/horizontal_plots.py OUT [RUN_DIR ...]: merge the runs into OUT, draw, print the table
    if len(sys.argv) > 2:
        merge(sys.argv[2:], sys.argv[1])
    else:
        plot_fig2a(sys.argv[1])
        plot_fig1(sys.argv[1])
    print(markdown(sys.argv[1]))
