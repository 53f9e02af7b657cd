"""simulations/_common.py, the one CSV/figure helper of the scripts in simulations/: it writes the
same bytes as the inline writers it replaced (each old writer is copied here as the reference), the
committed result tables round-trip through it unchanged, and the figure helper writes a PNG of the
requested size."""

import csv
import sys
from pathlib import Path

import numpy as np
import pytest

SIM = Path(__file__).resolve().parents[1] / "simulations"
sys.path.insert(0, str(SIM))
from _common import figure, metrics, read_csv, save_figure, write_csv  # noqa: E402

ROWS = [{"setting": "p2", "epsilon": 0.25, "test_acc": 0.8401234567890123, "note": None},
        {"setting": "both", "epsilon": float("inf"), "test_acc": 0.5, "note": "a,b \"q\""}]


def _old_first_row_keys(path, rows):           # privacy_utility, private_parties, label_dp summary, anchors
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _old_union_keys(path, rows):               # horizontal_fmnist, horizontal_plots.merge, a9a comparison
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def _old_paper_curves(path, curves):           # _paper_figures.write_csv before
    keys = ["method", "round", "objective", "train_loss", "test_loss", "test_accuracy", "messages", "bytes",
            "steps"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for name, rows in curves.items():
            for r in rows:
                w.writerow({"method": name, **{k: ("" if v is None else v) for k, v in r.items()}})


def test_write_csv_writes_the_bytes_of_the_writers_it_replaced(tmp_path):
    _old_first_row_keys(tmp_path / "a.csv", ROWS)
    write_csv(tmp_path / "b.csv", ROWS)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    ragged = [{"t": 1, "x": 0.1}, {"t": 2, "y": 3}]          # later rows add columns: the union, in order
    _old_union_keys(tmp_path / "c.csv", ragged)
    write_csv(tmp_path / "d.csv", ragged)
    assert (tmp_path / "c.csv").read_bytes() == (tmp_path / "d.csv").read_bytes()
    assert (tmp_path / "d.csv").read_text().splitlines() == ["t,x,y", "1,0.1,", "2,,3"]


def test_paper_curves_csv_is_unchanged(tmp_path):
    import _paper_figures as F

    curves = {"ADMM sharing": [{"round": 1, "objective": 0.5, "train_loss": None, "test_loss": 0.4,
                                "test_accuracy": 0.8, "messages": 4, "bytes": 96, "steps": 1,
                                "primal_residual": 1e-3}],
              "vertical SGD (FDML)": [{"round": 1, "objective": 0.6, "test_loss": 0.45, "test_accuracy": 0.7,
                                       "messages": 8, "bytes": 64, "steps": 2}]}
    _old_paper_curves(tmp_path / "old.csv", curves)
    F.write_csv(tmp_path / "new.csv", curves)
    assert (tmp_path / "old.csv").read_bytes() == (tmp_path / "new.csv").read_bytes()


def test_fig3_rows_match_the_old_column_writer(tmp_path):
    rows = [{"round": 1, "objective": 0.5, "test_loss": 0.4, "test_accuracy": 0.8, "primal_residual": 0.01,
             "train_loss": 0.3}]
    cols = ["dataset", "form", "sigma", "round", "objective", "test_loss", "test_accuracy", "primal_residual"]
    with open(tmp_path / "old.csv", "w", newline="") as fh:      # fig3_noise.py before: csv.writer by column
        w = csv.writer(fh)
        w.writerow(cols)
        for r in rows:
            w.writerow(["a9a", "paper", 0.0, r["round"], r["objective"], r["test_loss"], r["test_accuracy"],
                        r["primal_residual"]])
    write_csv(tmp_path / "new.csv", ({"dataset": "a9a", "form": "paper", "sigma": 0.0, **r} for r in rows),
              fieldnames=cols, extrasaction="ignore")
    assert (tmp_path / "old.csv").read_bytes() == (tmp_path / "new.csv").read_bytes()


def test_write_csv_refuses_a_column_outside_the_given_header(tmp_path):
    with pytest.raises(ValueError, match="dict contains fields not in fieldnames: 'note'"):
        write_csv(tmp_path / "x.csv", ROWS, fieldnames=["setting", "epsilon", "test_acc"])


@pytest.mark.parametrize("rel", ["label_dp/runs.csv", "label_dp/summary.csv", "privacy_utility/privacy_utility.csv",
                                 "privacy_utility/selection.csv", "private_parties.csv",
                                 "horizontal/a9a_compare/comparison.csv", "horizontal/fmnist_iid_T900/final.csv",
                                 "horizontal/fmnist_iid_T900/anchors.csv", "figures/fig1_a9a.csv",
                                 "figures/fig3_noise.csv"])
def test_committed_tables_round_trip_unchanged(tmp_path, rel):
    src = SIM / "results" / rel
    if not src.exists():
        pytest.skip(f"{rel} not in this checkout")
    rows = read_csv(src)
    header = src.read_text().splitlines()[0].split(",")
    write_csv(tmp_path / "x.csv", rows, fieldnames=header)
    assert (tmp_path / "x.csv").read_bytes() == src.read_bytes()


def test_metrics_against_the_definitions():
    f = np.array([2.0, -0.5, 0.0, -3.0])
    y = np.array([1, 1, -1, -1])
    acc, ll = metrics(f, y)
    assert acc == 0.5                                    # f = 0 counts as +1: wrong for y = -1
    assert ll == pytest.approx(np.mean(np.logaddexp(0.0, -y * f)), rel=1e-15)   # label_dp.py's old form
    assert ll == pytest.approx(np.mean(np.log1p(np.exp(-y * f))), rel=1e-15)


def test_save_figure_writes_a_png_of_the_requested_size(tmp_path):
    import matplotlib.image
    import matplotlib.pyplot as plt

    fig, axes = figure(1, 2, figsize=(4, 3))
    axes[0].plot([0, 1], [1, 0])
    path = save_figure(fig, tmp_path / "f.png", dpi=50, rect=(0, 0.1, 1, 1))
    assert matplotlib.image.imread(path).shape[:2] == (150, 200)
    assert not plt.fignum_exists(fig.number)             # freed: a long sweep does not pile figures up
