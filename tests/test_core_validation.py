"""Bad input gets an error naming the problem; plus the a9a convergence targets."""

import numpy as np
import pytest

from flower_vfl import VerticalADMM

rng = np.random.default_rng(0)
A, B = rng.normal(size=(20, 3)), rng.normal(size=(20, 2))
Y = np.where(rng.random(20) < 0.5, 1, -1)


@pytest.mark.parametrize("blocks,y,kw,match", [
    ([A, B[:10]], Y, {}, "same rows"),
    ([A, np.where(B > 1, np.nan, B)], Y, {}, "NaN or inf"),
    ([A, B], np.where(Y > 0, 2, np.where(Y < 0, 0, 1)) + (np.arange(20) % 3 == 0), {}, "Only binary classification is supported.*y has 4 classes"),
    ([A, B], np.ones(20), {}, "y has 1 class .*it needs exactly 2"),
    ([A, np.empty((20, 0))], Y, {}, "empty"),
    ([A, B[:, 0]], Y, {}, "must be 2-D"),
    ([A, B], Y, {"lam": -1.0}, r"VerticalADMM\(lam=-1.0\) is refused: expected a finite number >= 0"),
    ([A, B], Y, {"rho": -1.0}, r"VerticalADMM\(rho=-1.0\) is refused: expected a finite number >= 0 \(or 'auto', None\)"),
    ([A, B], Y, {"rho": float("nan")}, r"VerticalADMM\(rho=nan\) is refused"),
    ([A, B], Y, {"alpha": 2.5}, r"VerticalADMM\(alpha=2.5\) is refused: expected a finite number > 0 and < 2"),
    ([A, B], Y, {"max_rounds": 0}, r"VerticalADMM\(max_rounds=0\) is refused: expected an integer >= 1"),
    ([A, B], Y, {"loss": "cauchy"}, r"VerticalADMM\(loss='cauchy'\) is refused: expected one of 'logistic'"),
    ([A, B], Y, {"penalty": "l3"}, r"VerticalADMM\(penalty='l3'\) is refused: expected one of 'l2'"),
    ([A, B], Y[:10], {}, "aligned"),
])
def test_bad_input_is_named(blocks, y, kw, match):
    with pytest.raises(ValueError, match=match):
        VerticalADMM(**kw).fit(blocks, y)


def test_single_matrix_instead_of_blocks():
    with pytest.raises(TypeError, match="list of per-party arrays"):
        VerticalADMM().fit(np.hstack([A, B]), Y)


def test_predict_errors():
    with pytest.raises(AttributeError, match="not fitted"):
        VerticalADMM().predict([A, B])
    m = VerticalADMM(max_rounds=3).fit([A, B], Y)
    with pytest.raises(ValueError, match="widths"):
        m.predict([B, A])


@pytest.mark.slow
def test_a9a_targets_in_process():
    """Paper split, logistic, L2, lam=1e-4, intercept, default rho: issue targets."""
    from scipy.special import log_expit

    from flower_vfl.io.data import labels, party_block
    blocks = [party_block("a9a", i, 2) for i in range(2)]
    y, yt = labels("a9a")
    opt, rows = 0.3244130441, []

    def cb(k, m):
        f = m.decision_function([b[1] for b in blocks])
        rows.append((k, (m.history_[-1]["objective"] - opt) / opt, np.mean(-log_expit(yt * f)),
                     np.mean(np.where(f >= 0, 1, -1) == yt)))
    VerticalADMM(lam=1e-4, max_rounds=100, tol=0, callback=cb).fit([b[0] for b in blocks], y)
    ok = [r for r in rows if abs(r[2] - 0.3238) <= 0.001 and r[3] >= 0.849]
    assert ok and ok[0][0] <= 30
    assert all(abs(r[2] - 0.3238) <= 0.001 and r[3] >= 0.849 for r in rows[29:])
    assert min(r[0] for r in rows if r[1] <= 1e-4) <= 100


def test_residual_balancing_rule_and_nonconvex_floor():
    """Boyd 3.4.1 (mu=10, tau=2); for the nonconvex sigmoid loss rho stops at default_rho."""
    from flower_vfl.estimator.engine import balance_rho, default_rho
    from flower_vfl.core.losses import get_loss

    logistic, sigmoid = get_loss("logistic"), get_loss("sigmoid")
    assert balance_rho(1e-3, r=11.0, d=1.0, loss=logistic, n_samples=100) == 2e-3
    assert balance_rho(1e-3, r=1.0, d=11.0, loss=logistic, n_samples=100) == 5e-4
    assert balance_rho(1e-3, r=1.0, d=5.0, loss=logistic, n_samples=100) == 1e-3
    floor = default_rho(sigmoid, 100)
    assert floor > 2 * sigmoid.curvature / 100
    assert balance_rho(1.5 * floor, r=1.0, d=11.0, loss=sigmoid, n_samples=100) == floor
    assert balance_rho(4 * floor, r=1.0, d=11.0, loss=sigmoid, n_samples=100) == 2 * floor
