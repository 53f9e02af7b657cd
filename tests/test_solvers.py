"""The x-update solvers chosen by shape (core/xsolve.py), the multinomial central update
(core/multinomial.py) and Anderson acceleration (core/accel.py), against references.

Tolerances: solver outputs against closed forms / KKT to 1e-10 relative; every ADMM path
against the centralized optimum (tests/reference.py) to a relative objective gap <= 1e-8 and
coefficients within 1e-5 (max abs), as tests/test_core_exactness.py.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_wine
from sklearn.preprocessing import StandardScaler

from flower_vfl import VerticalADMM
from flower_vfl.core.accel import Anderson
from flower_vfl.core.losses import MultinomialLoss
from flower_vfl.core.penalties import Ball, get_penalty
from flower_vfl.core.xsolve import XSolver, choose_method
from reference import breast_cancer_blocks, centralized, multinomial

X, Y, BLOCKS = breast_cancer_blocks()
N = X.shape[0]
GROUPS = [(0, 10), (10, 20), (20, 30)]


def _check(m, blocks, y, w_ref, obj_ref, coef_tol=1e-5):
    obj = m.objective(blocks, y)
    assert abs(obj - obj_ref) / abs(obj_ref) <= 1e-8, (obj, obj_ref)
    assert np.max(np.abs(np.concatenate(m.coef_) - w_ref)) <= coef_tol


# ------------------------------------------------------------------ solver units
def _problem(seed, n, d, sparse=False, k=None):
    rng = np.random.default_rng(seed)
    D = sp.random(n, d, density=0.3, random_state=seed, format="csr") if sparse else rng.normal(size=(n, d))
    v = rng.normal(size=(n,) if k is None else (n, k))
    return D, v


@pytest.mark.parametrize("method,n,d,sparse", [("gram", 80, 12, False), ("gram", 80, 12, True),
                                               ("cg", 80, 12, True), ("cg", 30, 50, True),
                                               ("dual", 20, 50, False), ("chol", 80, 12, False)])
def test_l2_solvers_match_the_normal_equations_at_two_rhos(method, n, d, sparse):
    D, v = _problem(1, n, d, sparse)
    Dd = D.toarray() if sparse else D
    s = XSolver(D, get_penalty("l2"), 0.3, method=method)
    G_before = None
    for rho in (2.0, 7.5):            # a new rho: no new Gram (the only pass over the data)
        x = s.solve(v, rho)
        x_ref = np.linalg.solve(0.3 * np.eye(d) + rho * Dd.T @ Dd, rho * Dd.T @ v)
        assert np.max(np.abs(x - x_ref)) <= 1e-10 * max(1.0, np.max(np.abs(x_ref)))
        if method == "gram":
            assert G_before is None or s._G is G_before
            G_before = s._G


def test_l1_on_the_gram_is_exact_by_its_kkt_conditions():
    D, v = _problem(2, 200, 40)
    lam, rho = 15.0, 1.3
    s = XSolver(D, get_penalty("l1"), lam, method="gram")
    x = s.solve(v, rho)
    g = rho * D.T @ (v - D @ x)               # 0 in lam * d||x||_1 - g
    on = x != 0
    assert 0 < on.sum() < 40
    assert np.max(np.abs(g[on] - lam * np.sign(x[on]))) <= 1e-10
    assert np.max(np.abs(g[~on])) <= lam * (1 + 1e-10)
    # warm-started from the answer: zero FISTA iterations, the active-set step certifies it
    before = s.inner_iters_
    assert np.array_equal(s.solve(v, rho, x0=x), x) and s.inner_iters_ == before


def test_l1_on_a_singular_gram_meets_its_kkt_conditions():
    """One-hot-like blocks (a9a) make G singular: the active-set step uses least squares."""
    rng = np.random.default_rng(4)
    A = rng.normal(size=(150, 8))
    D = np.column_stack([A, A[:, :3], A[:, 0] + A[:, 1]])         # rank 8 of 12 columns
    v = rng.normal(size=150)
    lam, rho = 2.0, 1.0
    s = XSolver(D, get_penalty("l1"), lam, method="gram")
    x = s.solve(v, rho)
    g = rho * D.T @ (v - D @ x)
    on = x != 0
    assert np.max(np.abs(g[on] - lam * np.sign(x[on]))) <= 1e-9
    assert np.max(np.abs(g[~on])) <= lam * (1 + 1e-9)


def test_l1_after_a_failed_active_set_attempt_takes_one_burst_then_certifies(monkeypatch):
    """A centred one-hot block (rank 25 of 30 columns) from a far warm start: the first active-set
    attempt does not certify; FIRST_BURST FISTA steps later the second does, and the answer meets
    the centred problem's exact KKT conditions."""
    from flower_vfl.core import xsolve_prox

    rng = np.random.default_rng(13)
    D = np.hstack([np.eye(g)[rng.integers(0, g, 400)] for g in (5, 4, 6, 3, 8)]
                  + [rng.normal(size=(400, 4))])
    rng = np.random.default_rng(113)
    v = D @ rng.normal(size=30) + rng.normal(size=400)
    x0 = [rng.normal(size=30) * 3 for _ in range(2)][1]
    Dc = D - D.mean(axis=0)
    assert np.linalg.matrix_rank(Dc) == 25
    attempts = []
    real = xsolve_prox._active_set_newton

    def counted(*a, **k):
        out = real(*a, **k)
        attempts.append(out is not None)
        return out

    monkeypatch.setattr(xsolve_prox, "_active_set_newton", counted)
    lam = 5.0
    s = XSolver(D, get_penalty("l1"), lam, method="gram", center=True)
    x = s.solve(v, 1.0, x0=x0)
    assert attempts == [False, True]
    assert s.inner_iters_ == xsolve_prox.FIRST_BURST == 64
    g = Dc.T @ (v - Dc @ x)                    # 0 in lam * d||x||_1 - g
    on = x != 0
    assert np.max(np.abs(g[on] - lam * np.sign(x[on]))) <= 1e-9
    assert np.max(np.abs(g[~on])) <= lam * (1 + 1e-9)


def test_ball_l2_matches_a_constrained_reference():
    D, v = _problem(3, 100, 8)
    s = XSolver(D, get_penalty("l2"), 0.1, Ball(0.05), method="gram")
    x = s.solve(v, 2.0)
    assert abs(np.linalg.norm(x) - 0.05) <= 1e-12
    # KKT: x = (rho G + (lam + mu) I)^-1 rho D^T v for a mu >= 0
    g = 2.0 * D.T @ (v - D @ x) - 0.1 * x
    mu = float(g @ x) / float(x @ x)
    assert mu > 0 and np.max(np.abs(g - mu * x)) <= 1e-9 * np.max(np.abs(g))


def test_choose_method_by_shape():
    l2, l1 = get_penalty("l2"), get_penalty("l1")
    assert choose_method(np.zeros((500, 100)), l2, None) == "gram"
    assert choose_method(sp.csr_matrix((500, 100)), l1, None) == "gram"
    assert choose_method(sp.csr_matrix((50, 100)), l2, None) == "cg"          # d > N, sparse
    # huge N, sparse: 'cg' only when the pair-counting Gram is dear (tests/test_scale_paths.py)
    assert choose_method(sp.csr_matrix((300_000, 100)), l2, None) == "gram"
    assert choose_method(np.zeros((100, 5000)), l2, None) == "dual"           # wide dense, small N
    assert choose_method(np.zeros((3000, 5000)), l2, None) == "cg"


def test_bad_solver_and_acceleration_names():
    with pytest.raises(ValueError, match=r"x_solver='qr' is not supported; choose one of \['auto', 'gram', 'cg', 'dual', 'chol'\]"):
        XSolver(X, get_penalty("l2"), 1e-2, method="qr")
    with pytest.raises(ValueError, match=r"x_solver='dual' needs a dense block with N <= 1500 and penalty='l2'"):
        XSolver(sp.csr_matrix(X), get_penalty("l2"), 1e-2, method="dual")
    # the estimator refuses it by its parameter schema (config/schema.py), before any round
    with pytest.raises(ValueError, match=r"^VerticalADMM\(acceleration='nesterov'\) is refused: expected one of "
                                         r"'auto', 'anderson', 'spectral', 'anderson\+spectral', 'none' \("):
        VerticalADMM(acceleration="nesterov", max_rounds=2).fit(BLOCKS, Y)


# ---------------------------------------------------- every path against the optimum
PATHS = [  # x_solver, penalty, extra, blocks maker
    ("cg", "l2", {}, lambda: [sp.csr_matrix(B) for B in BLOCKS]),
    ("cg", "l1", {}, lambda: [sp.csr_matrix(B) for B in BLOCKS]),
    ("gram", "elasticnet", {"l1_ratio": 0.5}, lambda: BLOCKS),
    ("cg", "l2", {"constraint": ("box", -0.3, 0.3)}, lambda: BLOCKS),
]


@pytest.mark.parametrize("method,penalty,extra,blocks", PATHS)
def test_each_solver_path_reaches_the_centralized_optimum(method, penalty, extra, blocks):
    lam = 1e-2 if "constraint" not in extra else 1e-3
    rounds = 600 if penalty == "l2" and not extra else 2500      # Anderson is on for smooth L2 only
    m = VerticalADMM(penalty=penalty, lam=lam, max_rounds=rounds, tol=0, x_solver=method, **extra).fit(blocks(), Y)
    assert all(p.solver.method_ == method for p in m._parties)
    con = extra.get("constraint")
    w, b, obj = centralized(X, Y, "logistic", lam, penalty, extra.get("l1_ratio", 0.5),
                            bounds=con[1:] if con else None)
    _check(m, BLOCKS, Y, w, obj)


def test_dual_and_cg_paths_on_wide_blocks():
    """d_m > N: the N x N dual form (dense) and CG (sparse) reach the squared-loss optimum."""
    rng = np.random.default_rng(5)
    Xw = rng.normal(size=(40, 120))
    yw = Xw[:, :5].sum(axis=1) + 0.1 * rng.normal(size=40)
    lam = 1e-2
    w, b, obj = centralized(Xw, yw, "squared", lam)
    for method, maker in (("dual", np.asarray), ("auto", np.asarray), ("cg", sp.csr_matrix)):
        blocks = [maker(Xw[:, :60]), maker(Xw[:, 60:])]
        m = VerticalADMM(loss="squared", lam=lam, max_rounds=800, tol=0, x_solver=method).fit(blocks, yw)
        assert [p.solver.method_ for p in m._parties] == [{"auto": "gram"}.get(method, method)] * 2
        assert abs(m.objective(blocks, yw) - obj) / obj <= 1e-8
        assert np.max(np.abs(np.concatenate(m.coef_) - w)) <= 1e-5


# -------------------------------------------------------------------- multinomial
def test_multinomial_sherman_morrison_newton_matches_batched_solves():
    rng = np.random.default_rng(7)
    n, K = 300, 4
    loss = MultinomialLoss()
    t = np.eye(K)[rng.integers(0, K, n)]
    a, y = rng.normal(size=(n, K)) * 3, rng.normal(size=(n, K)) / n
    for rho in (0.05 / n, 1.0 / n, 10.0 / n):
        z_new = loss.z_update(a, y, t, rho, n, z0=a)
        z_old = loss._z_update_batched(a, y, t, rho, n, z0=a)
        assert np.max(np.abs(z_new - z_old)) <= 1e-10
        grad = (np.exp(z_new) / np.exp(z_new).sum(1, keepdims=True) - t) / n - y + rho * (z_new - a)
        scale = np.max(np.abs(y)) + 1.0 / n + rho * np.max(np.abs(z_new - a))     # its terms' size
        assert np.max(np.abs(grad)) <= 1e-11 * scale                                # eq. (7) holds


def test_multinomial_with_intercept_reaches_the_centralized_optimum():
    Xw, yw = load_wine(return_X_y=True)
    Xw = StandardScaler().fit_transform(Xw)
    blocks = [Xw[:, :4], Xw[:, 4:9], Xw[:, 9:]]
    m = VerticalADMM(loss="multinomial", lam=1e-2, max_rounds=300, tol=0).fit(blocks, yw)
    W, b, obj = multinomial(Xw, np.eye(3)[yw], 1e-2)
    assert abs(m.objective(blocks, yw) - obj) / obj <= 1e-8
    assert np.max(np.abs(np.vstack(m.coef_) - W)) <= 1e-5


# -------------------------------------------------------------------- acceleration
def test_anderson_reaches_the_same_optimum_in_fewer_rounds():
    runs = {acc: VerticalADMM(lam=1e-2, max_rounds=3000, tol=1e-9, acceleration=acc).fit(BLOCKS, Y)
            for acc in ("none", "anderson")}
    w, b, obj = centralized(X, Y, "logistic", 1e-2)
    for m in runs.values():
        assert m.converged_
        _check(m, BLOCKS, Y, w, obj)
    # measured: 61 rounds with Anderson, 304 without (tol 1e-9)
    assert runs["anderson"].n_rounds_ * 3 <= runs["none"].n_rounds_


def test_anderson_is_off_with_over_relaxation_or_l1_and_state_round_trips():
    for kw in ({"alpha": 1.5}, {"penalty": "l1"}, {"constraint": ("box", -1, 1)}):
        a = VerticalADMM(lam=1e-2, max_rounds=30, tol=0, **kw).fit(BLOCKS, Y)
        b = VerticalADMM(lam=1e-2, max_rounds=30, tol=0, acceleration="none", **kw).fit(BLOCKS, Y)
        assert np.array_equal(np.concatenate(a.coef_), np.concatenate(b.coef_))
    # a checkpointed accelerator continues bitwise like the original
    rng = np.random.default_rng(0)
    acc, twin = Anderson(mem=3), Anderson(mem=3)
    for k in range(6):
        s_list, q, y = [rng.normal(size=50) for _ in range(2)], rng.normal(size=50), rng.normal(size=50)
        out = acc.targets(s_list, q, y, 0.5, 1.0)
        if k == 3:
            twin.set_state(*acc.get_state())
        elif k > 3:
            out_t = twin.targets(s_list, q, y, 0.5, 1.0)
            assert all(np.array_equal(u, v) for u, v in zip(out[0] + [out[1]], out_t[0] + [out_t[1]]))


def test_cg_party_state_round_trip_is_bitwise_and_carries_dx():
    """The Flower client rebuilds the party from context.state every message: the CG path's
    carried (D x, D^T D x) go through get_state/set_state, so both paths compute the same bits."""
    from flower_vfl.core.party import PartyUpdate
    D = sp.csr_matrix(BLOCKS[0])
    rng = np.random.default_rng(9)
    one = PartyUpdate(D, get_penalty("l2"), 1e-2, x_solver="cg")
    for k in range(6):
        q, y = rng.normal(size=N), rng.normal(size=N) / N
        s1 = one.train_release(k, q, y, 0.5, 1.0, 1 / 3)
        fresh = PartyUpdate(D, get_penalty("l2"), 1e-2, x_solver="cg")
        fresh.set_state({k2: np.array(v) for k2, v in (state if k else {}).items()})
        s2 = fresh.train_release(k, q, y, 0.5, 1.0, 1 / 3)
        state = fresh.get_state()
        assert np.array_equal(s1, s2) and np.array_equal(one.x, fresh.x)
        # the carried D x is D x (to round-off accumulated over the iterations)
        assert np.max(np.abs(s1 - D @ one.x)) <= 1e-12 * max(1.0, np.max(np.abs(s1)))
