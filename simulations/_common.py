"""What the scripts in simulations/ do the same way: CSV tables, matplotlib figures, the a9a paper
split and its test metrics. One copy here; the scripts import it (``from _common import ...``:
simulations/ is on ``sys.path`` when a script in it runs, and the tests put it there).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from scipy.special import log_expit


def write_csv(path, rows, fieldnames=None, extrasaction="raise"):
    """Write ``rows`` (dicts) to ``path`` with a header line. The columns are ``fieldnames``, or
    every key of ``rows`` in order of first appearance; a missing value (or None) is written empty.
    ``extrasaction="ignore"`` drops keys not in ``fieldnames``; the default refuses them."""
    rows = list(rows)
    keys = list(fieldnames) if fieldnames is not None else list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction=extrasaction)
        w.writeheader()
        w.writerows(rows)
    return Path(path)


def read_csv(path):
    """The rows of a CSV written by :func:`write_csv`, as dicts of strings."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def figure(nrows=1, ncols=1, **kw):
    """``(fig, axes)`` of a new figure on the file-only Agg backend (no display needed);
    ``kw`` go to ``plt.subplots`` (figsize, sharey, squeeze, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, **kw)


def save_figure(fig, path, dpi=120, rect=None):
    """Lay out (``rect``: the part of the figure the axes may use, e.g. room for a legend below),
    write the PNG and free the figure."""
    import matplotlib.pyplot as plt

    if rect is None:
        fig.tight_layout()
    else:
        fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def log_ticks(ax, values, fmt="{:g}"):
    """A log x axis labelled exactly at ``values`` (no minor labels)."""
    import matplotlib.ticker

    ax.set_xscale("log")
    ax.set_xticks(values)
    ax.set_xticklabels([fmt.format(v) for v in values])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())



def finish_epsilon_panel(ax, epsilons, ylabel, party1_alone, all_nonprivate):
    """The private-parties plots' panel furniture: the two non-private references as lines (party 1
    alone, all features), ε ticks, the x label naming the accountant, the y label and the legend."""
    ax.axhline(party1_alone, color="C3", ls=":", label=f"party 1 alone, non-private ({party1_alone:.4f})")
    ax.axhline(all_nonprivate, color="k", ls="-.", label=f"all features, non-private ({all_nonprivate:.4f})")
    log_ticks(ax, sorted(set(epsilons)))
    ax.set_xlabel("ε per party (δ=1e-5, exact accountant; read from each party's ledger)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7.5)

def a9a_paper_split():
    """a9a in the paper's two blocks (features 1-66 and 67-123): ``(B, y, Bt, yt)``, the training
    and test blocks as CSR matrices and the labels in {-1, +1}."""
    from flower_vfl.io.data import column_ranges, load_all

    X, y, Xt, yt = load_all("a9a")
    cols = column_ranges("a9a", X.shape[1], 2)
    return [X[:, a:b].tocsr() for a, b in cols], y, [Xt[:, a:b].tocsr() for a, b in cols], yt


def metrics(f, y):
    """(accuracy of sign(f), with 0 -> +1; mean logistic loss) of decisions ``f`` on labels ``y`` in {-1, +1}."""
    f, y = np.asarray(f).ravel(), np.asarray(y)
    return float(np.mean(np.where(f >= 0, 1, -1) == y)), float(np.mean(-log_expit(y * f)))
