"""Plain rounds (no accelerator) and the inexact steps that make them cheaper (issue 24 item 2):

- ``XSolver.plain_rounds``: the looser forcing :data:`FORCING_PLAIN`, and an 'auto' solver of a
  tall sparse L2 block re-chosen from the Gram to CG (``choose_method(..., plain=True)``); the
  exact paths stay where they were (L1, a constraint set, lam = 0, an explicit method);
- CG's predicted last iteration (no D^T D p): repeated solves converge to the normal equations'
  solution, and the carried D x is the product of the returned x;
- inside ADMM, every changed path against the centralized optimum (tests/reference.py) with the
  tolerances of tests/test_scale_paths.py: relative objective gap <= 1e-8, coefficients 1e-5.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from flower_vfl import VerticalADMM
from flower_vfl.core import xsolve
from flower_vfl.core.penalties import Ball, get_penalty
from flower_vfl.core.xsolve import FORCING, FORCING_PLAIN, XSolver, choose_method
from reference import centralized


def _binary(n, d, density, seed):
    D = sp.random(n, d, density=density, format="csr", random_state=seed)
    D.data[:] = 1.0
    return D


def test_plain_rounds_choose_cg_for_tall_sparse_l2_blocks_only(monkeypatch):
    monkeypatch.setattr(xsolve, "CG_ROWS", 1000)
    D = _binary(2000, 100, 0.05, 3)                # ~5 nonzeros a row: ~2.5 pairs per entry
    l2, l1 = get_penalty("l2"), get_penalty("l1")
    assert choose_method(D, l2, None) == "gram"
    assert choose_method(D, l2, None, plain=True) == "cg"
    assert choose_method(D, l1, None, plain=True) == "gram"
    assert choose_method(D, l2, Ball(1.0), plain=True) == "gram"
    assert choose_method(D[:900], l2, None, plain=True) == "gram"     # below CG_ROWS
    s = XSolver(D, l2, 0.1)
    assert s.method_ == "gram" and s.forcing == FORCING and not s.predict_last
    s.plain_rounds()
    assert s.method_ == "cg" and s.predict_last and s.forcing == FORCING_PLAIN
    for kw in (dict(method="gram"), dict(constraint=Ball(1.0)), dict(lam=0.0)):
        s = XSolver(D, l2, kw.pop("lam", 0.1), **kw)
        s.plain_rounds()
        assert s.method_ == "gram" and s.forcing == FORCING_PLAIN
    s = XSolver(D, l2, 0.1)                        # after a solve the method is kept
    s.solve(np.ones(2000), 1.0)
    s.plain_rounds()
    assert s.method_ == "gram"


@pytest.mark.parametrize("center", [False, True])
def test_predicted_last_iteration_converges_to_the_normal_equations(center):
    rng = np.random.default_rng(5)
    D = _binary(3000, 30, 0.1, 5)
    Dd = D.toarray()
    if center:
        Dd = Dd - Dd.mean(axis=0)
    v = rng.normal(size=3000) + 2.0
    lam, rho = 0.05, 0.7
    s = XSolver(D, get_penalty("l2"), lam, method="cg", predict_last=True, center=center)
    assert s.predict_last
    x, carry, skipped = None, None, 0
    nv = np.linalg.norm(v)
    for k in range(12):          # the forcing rule's tolerance 1e-3 * outer / ||v||, outer -> 0
        x = s.solve(v, rho, x0=x, outer=nv * 10.0 ** -k, carry=carry)
        carry = s.last_carry
        skipped += carry[1] is None
        assert np.max(np.abs(carry[0] - D @ x)) <= 1e-10 * max(1.0, np.max(np.abs(carry[0])))
    ref = np.linalg.solve(lam * np.eye(30) + rho * Dd.T @ Dd, rho * Dd.T @ v)
    assert skipped > 0
    assert np.max(np.abs(x - ref)) <= 1e-9 * max(1.0, np.max(np.abs(ref)))


def _sparse_problem():
    rng = np.random.default_rng(7)
    blocks = [_binary(600, d, 0.08, 10 + i) for i, d in enumerate((8, 12, 16))]
    f = sum(B @ rng.normal(size=B.shape[1]) for B in blocks)
    y = np.where(rng.random(600) < 1 / (1 + np.exp(-(f - f.mean()))), 1.0, -1.0)
    return blocks, y


def test_plain_rounds_with_cg_reach_the_centralized_optimum(monkeypatch):
    monkeypatch.setattr(xsolve, "CG_ROWS", 100)
    monkeypatch.setattr(xsolve, "GRAM_PAIRS_PER_NNZ_L2", 0)
    blocks, y = _sparse_problem()
    lam = 1e-2
    m = VerticalADMM(lam=lam, max_rounds=600, tol=0, acceleration="none").fit(blocks, y)
    assert all(p.solver.method_ == "cg" and p.solver.predict_last for p in m._parties)
    assert all(p.solver.forcing == FORCING_PLAIN for p in m._parties)
    X = sp.hstack(blocks).toarray()
    w, b, obj = centralized(X, y, "logistic", lam)
    assert abs(m.objective(blocks, y) - obj) / abs(obj) <= 1e-8
    assert np.max(np.abs(np.concatenate(m.coef_) - w)) <= 1e-5
    # with Anderson ('auto') the same blocks keep the Gram and the strict forcing
    a = VerticalADMM(lam=lam, max_rounds=5, tol=0).fit(blocks, y)
    assert all(p.solver.method_ == "gram" and p.solver.forcing == FORCING for p in a._parties)
