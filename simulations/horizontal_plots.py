"""Figures of the horizontal reproduction (read the CSVs of horizontal_fmnist.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from _common import figure, read_csv, save_figure, write_csv

COLORS = {"objt": "tab:red", "objp": "tab:blue", "outp": "tab:green", "objt-code": "tab:purple"}
LABELS = {"objt": "ObjT (paper: δ_t=a/t²)", "objp": "ObjP", "outp": "OutP (Huang et al.)",
          "objt-code": "ObjT (code: constant radius)"}


def _setting(out):
    """'Fashion-MNIST IID, 10 agents' from the run's report.json (args of horizontal_fmnist.py)."""
    import json
    try:
        a = json.loads((Path(out) / "report.json").read_text())["args"]
    except (OSError, KeyError, ValueError):
        return "Fashion-MNIST"
    split = "IID" if a.get("split") == "iid" else f"Dirichlet α={a.get('alpha')}"
    return f"Fashion-MNIST {split}, {a.get('agents')} agents"


def plot_fig2a(out):
    """Test error at T vs the per-iteration eps_bar (left, the paper's axis) and vs the run's total
    epsilon over T iterations (right, PLD at delta=1e-5, with the DP-SGD anchors at their own
    accountant's epsilon); mean with 20/80-percentile bars, non-private and FedAvg as lines."""
    out = Path(out)
    rows = read_csv(out / "final.csv")
    anchors = read_csv(out / "anchors.csv") if (out / "anchors.csv").exists() else []
    fig, axes = figure(1, 2, figsize=(12, 6.2), sharey=True)
    for k, ax in enumerate(axes):
        xkey = "eps_bar" if k == 0 else "epsilon_total_pld_max"
        for v in dict.fromkeys(r["variant"] for r in rows):
            pr = sorted((float(r[xkey]), r) for r in rows if r["variant"] == v and r["eps_bar"] != "inf")
            if pr:
                e = np.array([x for x, _ in pr])
                m = np.array([float(r["test_error_mean"]) for _, r in pr]) * 100
                lo = m - np.array([float(r["test_error_p20"]) for _, r in pr]) * 100
                hi = np.array([float(r["test_error_p80"]) for _, r in pr]) * 100 - m
                ax.errorbar(e, m, yerr=[lo, hi], marker="o", ms=4, capsize=3, color=COLORS.get(v),
                            label=LABELS.get(v, v))
            for r in rows:
                if r["variant"] == v and r["eps_bar"] == "inf":
                    ax.axhline(float(r["test_error_mean"]) * 100, ls=":", color=COLORS.get(v),
                               label=f"{LABELS.get(v, v)}, non-private")
        for r in anchors:
            if r["anchor"] == "fedavg":
                ax.axhline(float(r["test_error"]) * 100, ls="--", color="k",
                           label=f"FedAvg, non-private ({r['rounds']} rounds)")
        if k == 1:
            dp = sorted((float(r["epsilon_spent_max"]), float(r["test_error"]) * 100) for r in anchors
                        if r["anchor"] == "dpsgd-opacus")
            if dp:
                ax.plot([x for x, _ in dp], [y for _, y in dp], "k*-", ms=9,
                        label="opacus DP-SGD (FedAvg), its RDP ε")
        ax.set_xscale("log")
        ax.grid(alpha=0.3, which="both")
    T = rows[0]["T"]
    axes[0].set_xlabel("ε̄ per iteration (the paper's axis; NOT the run's privacy)")
    axes[1].set_xlabel(f"total ε of the run: T={T} releases composed (PLD, δ=1e-5); DP-SGD: its accountant")
    axes[0].set_ylabel(f"test error at T={T} (%)")
    axes[0].set_title("vs per-iteration ε̄ (Fig. 2a analogue)", fontsize=10)
    axes[1].set_title("vs total ε over the run", fontsize=10)
    h, lab = axes[1].get_legend_handles_labels()
    fig.legend(h, lab, fontsize=8, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(f"{_setting(out)}: test error, mean and 20/80-percentile bars over noise seeds", fontsize=11)
    save_figure(fig, out / "fig2a.png", dpi=130, rect=(0, 0.17, 1, 1))


def plot_fig1(out, eps_list=(0.05, 0.1, 1.0)):
    """Noise magnitude (top) and test error (bottom) per iteration, mean with 20/80 bands."""
    out = Path(out)
    rows = read_csv(out / "curves.csv")
    eps_list = [e for e in eps_list if any(r["eps_bar"] != "inf" and float(r["eps_bar"]) == e for r in rows)]
    if not eps_list:
        return
    fig, axes = figure(2, len(eps_list), figsize=(4.6 * len(eps_list), 7.5), squeeze=False)
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
        if max(int(r["t"]) for r in rows) >= 1000:
            for i in range(2):
                axes[i, j].set_xscale("log")
        axes[0, j].set_yscale("log")
        for i in range(2):
            axes[i, j].grid(alpha=0.3)
    h, lab = axes[1, 0].get_legend_handles_labels()
    fig.legend(h, lab, fontsize=8, loc="lower center", ncol=4, frameon=False)
    fig.suptitle(f"{_setting(out)}: mean and 20/80-percentile band over noise seeds (Fig. 1 analogue)",
                 fontsize=9)
    save_figure(fig, out / "fig1.png", dpi=130, rect=(0, 0.09, 1, 1))


def plot_settle(out, optimum=None):
    """Test error vs iteration (log axis) of every run in curves.csv, one line per setting
    (mean over seeds): where the curves settle."""
    out = Path(out)
    rows = read_csv(out / "curves.csv")
    fig, ax = figure(figsize=(8, 5))
    styles = {"inf": "-", "5.0": "--", "1.0": "-.", "0.1": (0, (1, 1)), "0.05": ":"}
    for key in dict.fromkeys((r["variant"], r["eps_bar"]) for r in rows):
        sel = [r for r in rows if (r["variant"], r["eps_bar"]) == key]
        ts = sorted({int(r["t"]) for r in sel})
        m = [np.mean([float(r["test_error"]) for r in sel if int(r["t"]) == t]) * 100 for t in ts]
        lab = f"{LABELS.get(key[0], key[0])}, " + ("non-private" if key[1] == "inf" else f"ε̄={key[1]}")
        ax.plot(ts, m, ls=styles.get(key[1], "-"), color=COLORS.get(key[0]), label=lab)
    if optimum is not None:
        ax.axhline(optimum, color="k", lw=0.8, label=f"centralized optimum ({optimum:.2f} %)")
    ax.set_xscale("log")
    ax.set_xlabel("iteration t")
    ax.set_ylabel("test error (%)")
    ax.set_ylim(10, 90)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(f"{_setting(out)}: where the error curves settle (one noise seed)", fontsize=10)
    save_figure(fig, out / "settle.png", dpi=130)


def merge(dirs, out):
    """Concatenate final.csv / curves.csv / anchors.csv of several runs (e.g. variants run as
    separate processes) into ``out`` and draw the figures there."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("final.csv", "curves.csv", "anchors.csv"):
        rows = []
        for d in dirs:
            if (Path(d) / name).exists():
                rows += read_csv(Path(d) / name)
        if rows:
            write_csv(out / name, rows)
    plot_fig2a(out)
    plot_fig1(out)


def markdown(out):
    """The final table (test error % at T, 20/80 percentiles, privacy totals) as Markdown."""
    rows = read_csv(Path(out) / "final.csv")
    lines = ["| variant | ε̄ per iteration | seeds | test error % (p20–p80) | total ε over T, PLD (δ=1e-5) | basic T·ε̄ |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        tot = r.get("epsilon_total_pld_max") or "—"
        lines.append(f"| {LABELS.get(r['variant'], r['variant'])} | {r['eps_bar']} | {r['seeds']} | "
                     f"{float(r['test_error_mean']) * 100:.2f} ({float(r['test_error_p20']) * 100:.2f}–"
                     f"{float(r['test_error_p80']) * 100:.2f}) | {float(tot):.3g} | {float(r['epsilon_total_basic']):.4g} |"
                     if tot != "—" else
                     f"| {LABELS.get(r['variant'], r['variant'])} | non-private | {r['seeds']} | "
                     f"{float(r['test_error_mean']) * 100:.2f} | — | — |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    # python simulations/horizontal_plots.py OUT [RUN_DIR ...]: merge the runs into OUT, draw, print the table
    if len(sys.argv) > 2 and sys.argv[1] == "--settle":
        plot_settle(sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else None)
        sys.exit()
    if len(sys.argv) > 2:
        merge(sys.argv[2:], sys.argv[1])
    else:
        plot_fig2a(sys.argv[1])
        plot_fig1(sys.argv[1])
    print(markdown(sys.argv[1]))
