"""Pictures of runs: one run's PNG next to its report, and an overlay of several runs.

A run directory holds ``metrics.csv`` (one row per round: ``objective``, ``train_loss``,
``test_loss``, ``test_accuracy``, ``primal_residual``, ``dual_residual``, ...; both engines
write the same names, SGD runs write one row per epoch) and ``report.json`` (whose
``privacy`` entry holds each private party's ledger). :func:`plot_run` draws only the panels
the run has a series for (:func:`panels_with_data`: a metric evaluated once, at the end, is in
the final-values text; no privacy panel without a private party); each private party's ε spent against rounds is recomputed from its ledger
entries by the ledger's own accountant (:func:`flower_vfl.privacy.accounting.epsilon_for_releases`),
never read from a constant. :func:`plot_runs` overlays several runs in one figure.

    flower-vfl report runs/admm runs/sgd --out admm_vs_sgd.png
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
from pathlib import Path

__all__ = ["read_metrics", "privacy_curves", "panels_with_data", "plot_run", "plot_runs", "PANELS"]

#: (title, columns, log-scale y)
PANELS = [
    ("training objective", ("objective", "train_loss"), False),
    ("test log-loss", ("test_loss",), False),
    ("test accuracy", ("test_accuracy",), False),
    ("residuals", ("primal_residual", "dual_residual"), True),
]


def read_metrics(run_dir) -> dict[str, list[float]]:
    """Columns of ``metrics.csv`` as float lists (NaN where a round has no value)."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; RUN_DIR must be a folder written by flower-vfl fit / "
                                "simulate (report.json + metrics.csv)")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    cols: dict[str, list[float]] = {}
    for key in (rows[0].keys() if rows else ()):
        vals = []
        for row in rows:
            try:
                vals.append(float(row[key]))
            except (TypeError, ValueError):
                vals.append(math.nan)
        cols[key] = vals
    return cols


def _read_report(run_dir) -> dict:
    path = Path(run_dir) / "report.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def privacy_curves(report: dict) -> dict[str, tuple[list[int], list[float]]]:
    """Per private party: (round of each release, total ε after it) from its ledger entries,
    accounted by the ledger's method at its δ. The label owner's label-DP ledger (one
    randomized-response release before round 1) gives a flat line over the run, its ε answered
    by dp-accounting from the ledger's flip probability."""
    from flower_vfl.privacy.accounting import epsilon_for_releases

    priv = report.get("privacy") or []
    reps = priv.values() if isinstance(priv, dict) else priv
    out = {}
    for rep in reps:
        led = rep.get("ledger", {})
        entries = led.get("entries", [])
        if not entries:
            continue
        if all("flip_probability" in e for e in entries):
            out.update(_label_dp_curve(rep, entries, report))
            continue
        cfg = rep.get("config", {})      # the ledger's own fields win; else the party's config
        who = f"party {rep.get('party_id', '?')}"
        for i, e in enumerate(entries, 1):
            if e.get("noise_multiplier") is None:
                raise ValueError(f"{who}: ledger entry {i} has no noise_multiplier (nor a flip_probability): "
                                 "its ε cannot be accounted; the report's privacy entry is not a ledger this "
                                 "version wrote")
        delta = led.get("delta", cfg.get("delta"))
        if delta is None:
            raise ValueError(f"{who}: neither its ledger nor its config gives δ; its ε cannot be accounted")
        delta = float(delta)
        method = led.get("method", cfg.get("accountant", "exact"))
        zs = [float(e["noise_multiplier"]) for e in entries]
        eps = [epsilon_for_releases(zs[:k + 1], delta, method) for k in range(len(zs))]
        label = f"{who} (budget ε={led.get('epsilon', cfg.get('epsilon'))}, {method})"
        out[label] = ([0] + [int(e["round"]) for e in entries], [0.0] + eps)   # nothing spent before
    return out


def _label_dp_curve(rep, entries, report):
    """Randomized response with flip probability p is pure ε-label-DP, ε = log((1-p)/p); the ε
    drawn is the PLD accountant's over that release (as the label owner's own report)."""
    from flower_vfl.privacy.label_dp import label_epsilon_spent

    delta = float((rep.get("totals") or {}).get("delta") or 0.0)
    eps = [label_epsilon_spent(math.log((1 - p) / p), delta) for p in (float(e["flip_probability"]) for e in entries)]
    total = sum(eps)                                        # one release in practice; pure ε adds up
    rounds = [r.get("round") for r in report.get("rounds") or [] if isinstance(r.get("round"), (int, float))]
    last = int(max(rounds, default=0))
    return {f"{rep.get('party_id', 'label owner')} (label-DP, randomized response)":
            ([0, last] if last else [0], [total, total] if last else [total])}


def run_label(run_dir, report):
    algo, name = report.get("algorithm", "admm"), Path(run_dir).name
    return f"{name} ({report.get('engine', '?')})" if name == algo else \
        f"{name} ({algo}, {report.get('engine', '?')})"


def run_series(cols, final=None) -> dict[str, list[tuple[float, float]]]:
    """Per metric column, the (round, value) points of the run (NaN rounds dropped); the final
    evaluation fills the last round when the rows lack it."""
    x = cols.get("round", list(range(1, 1 + len(next(iter(cols.values()), [])))))
    final = final or {}
    out = {}
    for _, keys, logy in PANELS:
        for key in keys:
            ys = list(cols.get(key) or [])
            if key in ("test_loss", "test_accuracy") and x and isinstance(final.get(key), (int, float)) \
                    and (not ys or math.isnan(ys[-1])):
                ys = (ys or [math.nan] * len(x))[:-1] + [float(final[key])]
            pts = [(a, b) for a, b in zip(x, ys) if not math.isnan(b) and (not logy or b > 0)]
            if pts:
                out[key] = pts
    return out


def panels_with_data(runs) -> list[str]:
    """The panels worth drawing for ``runs`` ((run_dir, cols, report, label) each): a metric
    panel when some run has a series in it (two points or more: a run evaluated only at its end
    has its test metrics in the final-values text, not as a lone dot), the privacy panel when
    some run has a private party."""
    names = []
    for title, keys, _ in PANELS:
        if any(len(run_series(cols, report.get("final")).get(k, ())) > 1 for _, cols, report, _ in runs for k in keys):
            names.append(title)
    if any(privacy_curves(report) for _, _, report, _ in runs):
        names.append("privacy")
    return names


def _draw(axes, cols, eps_curves, label, style, final=None, color=None):
    """One run's lines on the panels of ``axes`` (a dict title -> Axes)."""
    series = run_series(cols, final)
    for title, keys, logy in PANELS:
        ax = axes.get(title)
        if ax is None:
            continue
        for key in keys:
            pts = series.get(key)
            if not pts:
                continue
            ax.plot(*zip(*pts), style.get(key, "-"), marker="." if len(pts) < 40 else None, color=color,
                    label=f"{label}{'' if len(keys) == 1 else ' ' + key}")
            if logy:
                ax.set_yscale("log")
    ax = axes.get("privacy")
    for j, (who, (rounds, eps)) in enumerate(eps_curves.items()):   # one run, one colour: parties by style
        if ax is not None:
            ax.step(rounds, eps, where="post", marker="osD^v"[j % 5], ls=("-", "--", ":", "-.")[j % 4],
                    color=color, label=f"{label} {who}")


def _figure(runs, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = panels_with_data(runs)
    ncols = max(1, min(3, len(names)))
    nrows = max(1, -(-len(names) // ncols))
    spare = len(names) % ncols != 0 or not names         # a free cell for the final values
    fig = plt.figure(figsize=(5 * ncols + (5 if not names else 0), 4.25 * nrows + (0 if spare else 1.4)))
    gs = fig.add_gridspec(nrows + (0 if spare else 1), ncols,
                          height_ratios=[1] * nrows + ([] if spare else [0.3]))
    axes = {name: fig.add_subplot(gs[i // ncols, i % ncols]) for i, name in enumerate(names)}
    text_ax = fig.add_subplot(gs[len(names) // ncols, len(names) % ncols] if spare else gs[nrows, :])
    style = {"train_loss": "--", "dual_residual": "--"}
    for i, (run_dir, cols, report, label) in enumerate(runs):   # one colour per run, one line style per column
        _draw(axes, cols, privacy_curves(report), label, style, report.get("final"), f"C{i % 10}")
    for name, ax in axes.items():
        ax.set_title(name if name != "privacy" else "ε spent (each private party's ledger)")
        ax.set_xlabel("round (ADMM) / epoch (SGD)")
        ax.grid(alpha=0.3)
        if name == "privacy":                           # room above the curves for the legend
            ax.set_ylim(0, 1.5 * max(ax.get_ylim()[1], 1e-9))
            ax.legend(fontsize=7, loc="upper left")
        else:
            ax.legend(fontsize=7)
    for panel, keys, logy in PANELS:
        if panel in axes and not logy and panel != "test accuracy":
            _cut_spikes(axes[panel], [r[1] for r in runs], keys)
    _final_table(text_ax, runs)
    fig.suptitle(title)
    fig.tight_layout()
    return fig, plt


def _cut_spikes(ax, cols_list, keys):
    """An early spike (an SGD step near its stability limit) would flatten every curve: cut the
    axis at 3x the largest final value when the curves rise above it, and say so."""
    finals, peak, low = [], -math.inf, math.inf
    for cols in cols_list:
        for key in keys:
            vals = [v for v in cols.get(key, []) if not math.isnan(v)]
            if vals:
                finals.append(vals[-1])
                peak, low = max(peak, max(vals)), min(low, min(vals))
    if finals and max(finals) > 0 and peak > 3 * max(finals):
        top = 3 * max(finals)
        ax.set_ylim(low - 0.05 * (top - low), top)
        ax.set_title(ax.get_title() + f" (axis cut at 3x the final value; peak {peak:.3g})", fontsize=9)


def _final_table(ax, runs):
    ax.axis("off")
    lines = ["final values"]
    for _, cols, report, label in runs:
        fin = report.get("final", {})
        bits = [f"{k}={fin[k]:.4g}" for k in ("objective", "test_loss", "test_accuracy")
                if isinstance(fin.get(k), (int, float))]
        n = fin.get("rounds", fin.get("round", len(cols.get("round", []))))
        once = any(k.startswith("test_") for k in bits) and \
            sum(not math.isnan(v) for v in cols.get("test_loss", [])) < 2
        lines += textwrap.wrap(f"{label}: {n} rounds/epochs" + (", " + ", ".join(bits) if bits else "")
                               + (" (test metrics: evaluated once, after training)" if once else ""),
                               width=62, subsequent_indent="    ")
    ax.text(0.0, 1.0, "\n".join(lines), va="top", ha="left", fontsize=8, family="monospace",
            transform=ax.transAxes)


def plot_run(run_dir, out=None) -> Path:
    """``run.png`` (or ``out``) for one run directory; returns the path written."""
    report = _read_report(run_dir)
    label = run_label(run_dir, report)
    fig, plt = _figure([(run_dir, read_metrics(run_dir), report, label)], f"run {label}")
    path = Path(out) if out else Path(run_dir) / "run.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_runs(run_dirs, out, labels=None) -> Path:
    """Several runs overlaid in one figure (e.g. ADMM vs SGD, or several ε)."""
    run_dirs = list(run_dirs)
    if not run_dirs:
        raise ValueError("run_dirs is empty; give at least one RUN_DIR")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"labels has {len(labels)} entries for {len(run_dirs)} run dirs")
    runs = []
    for i, d in enumerate(run_dirs):
        report = _read_report(d)
        runs.append((d, read_metrics(d), report, labels[i] if labels else run_label(d, report)))
    fig, plt = _figure(runs, f"{len(runs)} runs")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

