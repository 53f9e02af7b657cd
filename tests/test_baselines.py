"""flower_vfl.baselines: vertical SGD against a centralized solver, the lam -> C mapping,
the gisette-like recipe, the noisy-ADMM loop of Fig. 3."""

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit, log_expit
from sklearn.linear_model import LogisticRegression

from flower_vfl import VerticalADMM
from flower_vfl.baselines import (C_to_lam, VerticalSGD, batch_indices, centralized_logreg, lam_to_C,
                                  learning_rate, local_only_logreg, logreg_objective)
from flower_vfl.baselines.noisy_admm import noisy_admm
from flower_vfl.io.data import labels, load_all, party_block
from flower_vfl.datasets import load_gisette_like

from reference import centralized

LAM = 1e-2


@pytest.fixture(scope="module")
def bc():
    X, y, Xt, yt = load_all("breast_cancer")
    return X, y, Xt, yt, [X[:, :10], X[:, 10:20], X[:, 20:]]


def test_sgd_with_decaying_step_converges_to_the_centralized_optimum(bc):
    X, y, _, _, B = bc
    w, b, obj = centralized(X, y, "logistic", LAM)          # scipy L-BFGS-B, same objective
    m = VerticalSGD(lam=LAM, lr=1.0, lr_schedule="inverse", lr_decay=0.02, batch_size=32, max_epochs=300,
                    random_state=0).fit(B, y)
    gaps = [h["objective"] - obj for h in m.history_]
    assert min(gaps) > -1e-12                                # never below the optimum
    assert gaps[-1] < 2e-5                                   # measured 8.9e-6
    assert gaps[-1] < gaps[29] / 5                           # still converging (1/t), not a noise floor
    c = np.concatenate(m.coef_)
    assert np.max(np.abs(c - w)) <= 0.05 * np.max(np.abs(w))
    assert m.intercept_ == pytest.approx(b, abs=0.02)
    # the objective the engine reports is the one it fitted
    assert m.objective(B, y) == pytest.approx(m.history_[-1]["objective"], rel=1e-12)


def test_full_batch_step_is_gradient_descent_in_closed_form(bc):
    X, y, _, _, B = bc
    m = VerticalSGD(lam=LAM, lr=0.3, batch_size=None, max_epochs=1, init_scale=0.1, random_state=3).fit(B, y)
    from flower_vfl.baselines.sgd import init_coef
    x0 = np.concatenate([init_coef(D.shape[1], i, 3, 0.1) for i, D in enumerate(B)])
    g = -y * expit(-y * (X @ x0)) / y.size                  # d/df of the mean logistic loss at b = 0
    np.testing.assert_allclose(np.concatenate(m.coef_), x0 - 0.3 * (X.T @ g + LAM * x0), rtol=1e-12, atol=1e-15)
    assert m.intercept_ == pytest.approx(-0.3 * g.sum(), rel=1e-12)
    assert (m.n_steps_, m.messages_, m.bytes_) == (1, 6, 6 * y.size * 8)


def test_messages_and_bytes_per_epoch(bc):
    X, y, _, _, B = bc
    m = VerticalSGD(lam=LAM, batch_size=100, max_epochs=2).fit(B, y)
    steps = -(-y.size // 100)
    assert [h["steps"] for h in m.history_] == [steps, 2 * steps]
    assert m.messages_ == 2 * 3 * 2 * steps                  # M up + M down per step
    assert m.bytes_ == 2 * 3 * 8 * 2 * y.size                # every row once per epoch, both directions


def test_learning_rate_schedules():
    assert learning_rate(10, 0.5) == 0.5
    assert learning_rate(10, 0.5, "inverse", 0.1) == pytest.approx(0.25)
    assert learning_rate(8, 0.5, "sqrt", 1.0) == pytest.approx(0.5 / 3)
    with pytest.raises(ValueError, match=r"lr_schedule='cosine' is not supported; choose one of "
                                         r"\('constant', 'inverse', 'sqrt'\)"):
        learning_rate(0, 0.1, "cosine")


def test_batches_partition_each_epoch_and_are_shared_by_seed():
    n, bs = 103, 10
    for epoch in (1, 2):
        rows = np.concatenate([batch_indices(n, bs, epoch, j, 5) for j in range(11)])
        assert sorted(rows.tolist()) == list(range(n))
    assert np.array_equal(batch_indices(n, bs, 1, 0, 5), batch_indices(n, bs, 1, 0, 5))
    assert not np.array_equal(batch_indices(n, bs, 1, 0, 5), batch_indices(n, bs, 2, 0, 5))
    with pytest.raises(ValueError, match=r"batch=11 is outside 0..10 for N=103, batch_size=10"):
        batch_indices(n, bs, 1, 11, 5)


@pytest.mark.parametrize("kw, msg", [
    ({"batch_size": 0}, r"batch_size must be an integer >= 1; got batch_size=0"),
    ({"lr": -1.0}, r"lr must be a finite number > 0; got lr=-1.0"),
    ({"max_epochs": 0}, r"max_epochs must be an integer >= 1; got max_epochs=0"),
    ({"loss": "hinge"}, r"loss='hinge' is not supported by VerticalSGD; use 'logistic', 'squared' or 'sigmoid'"),
    ({"random_state": None}, r"random_state must be an integer .*; got random_state=None"),
])
def test_sgd_bad_input(bc, kw, msg):
    _, y, _, _, B = bc
    with pytest.raises(ValueError, match=msg):
        VerticalSGD(**kw).fit(B, y)


def test_sgd_unfitted_predict():
    with pytest.raises(AttributeError, match=r"this VerticalSGD is not fitted yet; call fit\(X_blocks, y\) first"):
        VerticalSGD().predict([np.ones((2, 2))])


# ------------------------------------------------------------------ lam -> C

def test_lam_to_C_gives_the_projects_objective(bc):
    """sklearn's C sum log(1+e^{-yf}) + 1/2||w||^2 at C = lam_to_C(lam, N) has the minimizer of
    (1/N) sum log(1+e^{-yf}) + lam/2 ||w||^2 (b unpenalized), found here by scipy."""
    X, y, _, _, _ = bc
    n, d = X.shape

    def fun(p):
        w, b = p[:d], p[d]
        f = X @ w + b
        g = -y * expit(-y * f) / n
        return np.mean(-log_expit(y * f)) + LAM / 2 * w @ w, np.concatenate([X.T @ g + LAM * w, [g.sum()]])

    ref = minimize(fun, np.zeros(d + 1), jac=True, method="L-BFGS-B",
                   options={"ftol": 1e-16, "gtol": 1e-12, "maxiter": 50000}).x
    assert lam_to_C(LAM, n) == pytest.approx(1 / (LAM * n), rel=1e-15)
    est = centralized_logreg([X], y, LAM, tol=1e-12)
    np.testing.assert_allclose(est.coef_.ravel(), ref[:d], atol=2e-5)
    assert est.intercept_[0] == pytest.approx(ref[d], abs=2e-5)
    assert logreg_objective(X, y, est.coef_.ravel(), est.intercept_[0], LAM) == pytest.approx(fun(ref)[0], abs=1e-10)
    # the mapping people get wrong (C = 1/lam) lands elsewhere: the check above discriminates
    wrong = LogisticRegression(C=1 / LAM, tol=1e-12, max_iter=10000).fit(X, y)
    assert np.max(np.abs(wrong.coef_.ravel() - ref[:d])) > 0.1
    assert C_to_lam(lam_to_C(LAM, n), n) == pytest.approx(LAM, rel=1e-15)


def test_local_only_uses_the_party_block_only(bc):
    X, y, _, _, B = bc
    a = local_only_logreg(B[0], y, LAM)
    b = centralized_logreg([B[0]], y, LAM)
    assert a.coef_.shape == (1, 10)
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-12)


@pytest.mark.parametrize("args, msg", [
    ((0.0, 10), r"lam must be a finite number > 0 .*; got lam=0.0"),
    ((1e-3, 0), r"n_samples must be an integer >= 1; got n_samples=0"),
])
def test_lam_to_C_bad_input(args, msg):
    with pytest.raises(ValueError, match=msg):
        lam_to_C(*args)


def test_sklearn_baselines_refuse_01_labels(bc):
    X, y, _, _, _ = bc
    with pytest.raises(ValueError, match=r"y must hold the two labels -1 and \+1; got labels \[0.0, 1.0\]"):
        centralized_logreg([X], (y > 0).astype(float), LAM)


# ------------------------------------------------------------------ gisette-like

SMALL = dict(n_train=200, n_test=100, n_pixels=20, n_products=30, n_probes=50)


def test_gisette_like_recipe_shapes_range_and_determinism():
    X, y, Xt, yt = load_gisette_like(seed=1, **SMALL)
    assert X.shape == (200, 100) and Xt.shape == (100, 100)
    assert X.min() == -1.0 and X.max() == 1.0 and Xt.min() >= -1.0 and Xt.max() <= 1.0
    assert sorted(np.unique(y)) == [-1.0, 1.0] and y.sum() == 0 and yt.sum() == 0     # balanced
    X2, y2, _, _ = load_gisette_like.__wrapped__(seed=1, **SMALL)                      # uncached rebuild
    assert np.array_equal(X, X2) and np.array_equal(y, y2)
    X3, _, _, _ = load_gisette_like.__wrapped__(seed=2, **SMALL)
    assert not np.array_equal(X, X3)
    # probes: each is a row permutation of a real column, so it shares that column's multiset of values
    keys = {}
    for j in range(X.shape[1]):
        keys.setdefault(np.sort(X[:, j]).tobytes(), []).append(j)
    assert sum(len(v) - 1 for v in keys.values()) >= SMALL["n_probes"] - 5       # (a few real columns may tie)
    # the pixels and products carry the label (sneaker vs ankle boot)
    corr = np.abs([np.corrcoef(X[:, j], y)[0, 1] if X[:, j].std() > 0 else 0 for j in range(X.shape[1])])
    assert corr.max() > 0.5


@pytest.mark.parametrize("kw, msg", [
    ({"classes": (3, 3)}, r"classes=\(3, 3\) must be two distinct Fashion-MNIST labels in 0..9"),
    ({"n_train": 201}, r"n_train=201, n_test=1000 must be even and at most 12000 / 2000"),
    ({"n_pixels": 1}, r"n_pixels must be an integer >= 2; got n_pixels=1"),
])
def test_gisette_like_bad_input(kw, msg):
    with pytest.raises(ValueError, match=msg):
        load_gisette_like(**kw)


def test_gisette_like_names_the_install_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"apt-get install dataset-fashion-mnist"):
        load_gisette_like(data_dir=str(tmp_path))


# ------------------------------------------------------------------ noisy ADMM (Fig. 3)

def test_noise_free_loop_is_the_engine():
    B = [party_block("breast_cancer", i, 3) for i in range(3)]
    y, yt = labels("breast_cancer")
    rows = noisy_admm([b[0] for b in B], y, [b[1] for b in B], yt, LAM, 0.0, rounds=12)
    m = VerticalADMM(lam=LAM, max_rounds=12, tol=0, acceleration="none", variant="sharing-fixed").fit([b[0] for b in B], y)
    for r, h in zip(rows, m.history_):
        assert r["objective"] == pytest.approx(h["objective"], rel=1e-12)
    f = m.decision_function([b[1] for b in B])
    assert rows[-1]["test_loss"] == pytest.approx(np.mean(-log_expit(yt * f)), rel=1e-12)


@pytest.mark.parametrize("form", ["output", "paper"])
def test_noise_goes_through_the_mechanism_reproducibly(form):
    B = [party_block("breast_cancer", i, 2) for i in range(2)]
    y, yt = labels("breast_cancer")
    args = ([b[0] for b in B], y, [b[1] for b in B], yt, LAM)
    a = noisy_admm(*args, 5.0, form=form, rounds=4, seed=11)
    b = noisy_admm(*args, 5.0, form=form, rounds=4, seed=11)
    c = noisy_admm(*args, 5.0, form=form, rounds=4, seed=12)
    clean = noisy_admm(*args, 0.0, rounds=4)
    assert [r["test_loss"] for r in a] == [r["test_loss"] for r in b]
    assert a[-1]["test_loss"] != c[-1]["test_loss"] and a[-1]["test_loss"] != clean[-1]["test_loss"]
    with pytest.raises(ValueError, match=r"form='laplace'; choose 'output' or 'paper'"):
        noisy_admm(*args, 1.0, form="laplace")
