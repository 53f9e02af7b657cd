"""Exactness on real data: ADMM sharing vs an independent centralized solver of the same objective.

sklearn breast cancer (standardized), 3 parties (columns 0:10, 10:20, 20:30). Asserted:
relative objective gap <= 1e-8 and coefficients within 1e-5 (max abs).
"""

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from flower_vfl import VerticalADMM
from reference import centralized, multinomial

X, _y = load_breast_cancer(return_X_y=True)
X = StandardScaler().fit_transform(X)
Y = np.where(_y == 1, 1.0, -1.0)
N = X.shape[0]
BLOCKS = [X[:, :10], X[:, 10:20], X[:, 20:]]


def _check(m, w_ref, obj_ref):
    w = np.concatenate(m.coef_)
    obj = m.objective(BLOCKS, Y)
    assert abs(obj - obj_ref) / abs(obj_ref) <= 1e-8, (obj, obj_ref)
    assert np.max(np.abs(w - w_ref)) <= 1e-5, np.max(np.abs(w - w_ref))


CASES = [  # loss, penalty, lam, extra, rounds
    ("logistic", "l2", 1e-2, {}, 1500),
    ("squared", "l2", 1e-2, {}, 1500),
    pytest.param("sigmoid", "l2", 5e-2, {}, 1500, marks=pytest.mark.xfail(
        strict=True, reason="nonconvex: ADMM settles at objective 0.3726 for every rho tried (0.5/N-8/N) "
                            "while L-BFGS from 0 reaches 0.1318; a different stationary point or a bug "
                            "in the nonconvex path, not yet diagnosed")),
    ("logistic", "l1", 1e-2, {}, 3000),
    ("logistic", "elasticnet", 1e-2, {"l1_ratio": 0.5}, 3000),
    ("squared", "l1", 1e-2, {}, 3000),
    ("squared", "elasticnet", 1e-2, {"l1_ratio": 0.5}, 3000),
    ("logistic", "l2", 1e-3, {"constraint": ("box", -0.3, 0.3)}, 3000),
    ("logistic", "l2", 1e-3, {"constraint": ("ball", 1.0)}, 3000),
]


@pytest.mark.parametrize("loss,penalty,lam,extra,rounds", CASES)
def test_matches_centralized(loss, penalty, lam, extra, rounds):
    m = VerticalADMM(loss=loss, penalty=penalty, lam=lam, max_rounds=rounds, tol=0,
                     **extra).fit(BLOCKS, Y)
    con = extra.get("constraint")
    w, b, obj = centralized(X, Y, loss, lam, penalty, extra.get("l1_ratio", 0.5),
                            bounds=con[1:] if con and con[0] == "box" else None,
                            ball=(con[1], [(0, 10), (10, 20), (20, 30)]) if con and con[0] == "ball" else None)
    _check(m, w, obj)
    if penalty in ("l1",):
        assert 0 < np.sum(np.abs(w) > 1e-8) < X.shape[1]      # a genuinely sparse solution


def test_hinge_matches_libsvm():
    lam = 1e-2
    m = VerticalADMM(loss="hinge", lam=lam, max_rounds=4000, tol=0).fit(BLOCKS, Y)
    svc = SVC(kernel="linear", C=1.0 / (N * lam), tol=1e-12).fit(X, Y)
    w_ref = svc.coef_.ravel()
    obj_ref = np.mean(np.maximum(0, 1 - Y * svc.decision_function(X))) + lam / 2 * w_ref @ w_ref
    obj = m.objective(BLOCKS, Y)
    assert obj <= obj_ref * (1 + 1e-8) and abs(obj - obj_ref) / obj_ref <= 1e-6
    assert np.max(np.abs(np.concatenate(m.coef_) - w_ref)) <= 1e-3


def test_multinomial_matches_centralized_on_wine():
    Xw, yw = load_wine(return_X_y=True)
    Xw = StandardScaler().fit_transform(Xw)
    blocks = [Xw[:, :4], Xw[:, 4:9], Xw[:, 9:]]
    lam = 1e-2
    m = VerticalADMM(loss="multinomial", lam=lam, max_rounds=1500, tol=0).fit(blocks, yw)
    yk = np.eye(3)[yw]
    W, b, obj_ref = multinomial(Xw, yk, lam)
    assert abs(m.objective(blocks, yw) - obj_ref) / obj_ref <= 1e-8
    assert np.max(np.abs(np.vstack(m.coef_) - W)) <= 1e-5
    # intercepts are identifiable only up to a common shift
    assert np.max(np.abs((m.intercept_ - m.intercept_.mean()) - (b - b.mean()))) <= 1e-5


def test_fixed_point_is_stationary():
    m = VerticalADMM(lam=1e-2, max_rounds=1500, tol=0).fit(BLOCKS, Y)
    c = m._central
    grad = m.loss_.grad(c.z + c.b, c.t) / N
    assert np.max(np.abs(c.y - grad)) <= 1e-12           # (11): y = grad l(z)
    assert abs(c.y.sum()) <= 1e-10                       # intercept optimality
    assert np.linalg.norm(sum(D @ x for D, x in zip(BLOCKS, m.coef_)) - c.z) <= 1e-6   # (12)
