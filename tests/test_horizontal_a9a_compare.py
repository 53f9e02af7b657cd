"""simulations/horizontal_vs_vertical_a9a.py runs every cell of one agent count and T in one
batched engine run (fit_many); each cell must equal its own run_dpiadmm (to round-off, 1e-13), and the privacy
figure is the agents' ledger total (PLD) at the requested total epsilon."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simulations"))
import horizontal_vs_vertical_a9a as H  # noqa: E402

from flower_vfl.horizontal import agent_seeds, run_dpiadmm  # noqa: E402


@pytest.fixture(scope="module")
def parts():
    rng = np.random.default_rng(3)
    X = (rng.random((240, 9)) < 0.3).astype(float)
    X[:, -1] = 1.0                                        # the constant feature, as in a9a_dense
    y = (X[:, :4].sum(1) + rng.normal(0, 0.5, 240) > 1.2).astype(int)
    idx = np.array_split(rng.permutation(240), 3)
    return [X[i] for i in idx], [y[i] for i in idx]


def test_batched_cells_equal_each_cell_alone(parts):
    cells = [("objt-code", 0.5, "femnist"), ("objp", 2.0, "mnist"), ("outp", 1.0, "femnist"),
             ("objp", None, "mnist"), ("objt", 4.0, "mnist")]
    T, delta = 15, 1e-5
    many = H.fit_many(parts, cells, T, n_seeds=2, seed=11, delta=delta)
    for (name, total, rs), (W, eb, spent) in zip(cells, many):
        p, eb1 = H.params_for(name, total, T, delta, "replace", rs)
        alone = run_dpiadmm(*parts, p, T, agent_seeds(11, 1 if total is None else 2, 3), K=2)
        assert eb == eb1
        assert W.shape == alone.W.shape
        # equal to round-off: the non-private cell's batched GEMMs sum in another order than the
        # one-cell run's on some machines (6.9e-18 on the 2026-11-26 machine, also at the tree of
        # df05b59 whose CI passed bitwise elsewhere); the private cells match exactly there
        np.testing.assert_allclose(W, alone.W, rtol=0, atol=1e-13, err_msg=name)
        if total is None:
            assert eb is None and spent is None
        else:
            assert spent == pytest.approx(total, rel=2e-3)     # eps_bar_for_total solves to xtol 1e-4
            assert spent == max(a["epsilon_pld"] for a in alone.privacy(delta, seed=0))
