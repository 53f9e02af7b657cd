"""The CG x-update's memory (core/xsolve.py: ``XSolver._cg``, ``_preconditioner``, ``low_memory``)
on small text-like blocks (Zipf columns, 10 nonzeros a row, values in [0.5, 1.5), d > N).

- the CG solve (default and ``low_memory``; one and K columns) against a direct solve of the
  normal equations: 1e-10 relative;
- the preconditioner, applied in slices, against the whole-vector Sherman-Morrison formula the
  solver used before: bitwise;
- ``low_memory`` against the default over warm-started solves with a carry and a change of rho:
  1e-13 relative (the same math; D^T D x0 and D^T 1 are summed in another order);
- the party updates its own x in place (the same array every round) and copies a restored x;
- the tracemalloc peak of one warm-started CG solve, in d-vectors: <= 3 (default) and <= 4
  (``low_memory``: the column sums are formed per solve) plus 2 N-vectors (D p and the copy of
  the carried D x) and the two slice buffers. The solver before this file allocated 8.1 here
  (x, r, z, p, a scratch vector, D^T D p and two preconditioner vectors).
"""

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from flower_vfl.core import xsolve
from flower_vfl.core.party import PartyUpdate
from flower_vfl.core.penalties import get_penalty
from flower_vfl.core.xsolve import XSolver, _col, _cdot, _column_stats

L2 = get_penalty("l2")


def _text_block(n, d, seed, k=10):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, d + 1) ** 0.8
    cols = rng.choice(d, size=n * k, p=p / p.sum())
    D = sp.csr_matrix((rng.random(cols.size) + 0.5, cols, np.arange(0, n * k + 1, k)), shape=(n, d))
    D.sum_duplicates()
    return D, rng


def _direct(D, v, lam, rho):
    """(lam I + rho D^T D)^-1 rho D^T v through the N x N form (d > N): D^T (lam I + rho D D^T)^-1 rho v."""
    K = (D @ D.T).toarray()
    return D.T @ np.linalg.solve(lam * np.eye(K.shape[0]) + rho * K, rho * v)


@pytest.mark.parametrize("low_memory", [False, True])
@pytest.mark.parametrize("k", [None, 3])
def test_cg_matches_a_direct_solve_on_a_text_like_block(low_memory, k, monkeypatch):
    monkeypatch.setattr(xsolve, "_CHUNK", 1000)        # several slices of the 5000 columns
    D, rng = _text_block(600, 5000, 1)
    lam = 1e-2
    s = XSolver(D, L2, lam, method="cg", inner_tol=1e-14, low_memory=low_memory)
    x, carry = None, None
    for rho in (0.5, 0.5, 2.0):                         # warm starts with the carry, then a new rho
        v = rng.normal(size=(600,) if k is None else (600, k))
        x = s.solve(v, rho, x0=x, carry=carry, overwrite_x0=True)
        ref = _direct(D, v, lam, rho)
        assert np.max(np.abs(x - ref)) <= 1e-10 * np.max(np.abs(ref))
        carry = s.last_carry
        assert np.max(np.abs(carry[0] - D @ x)) <= 1e-12 * np.max(np.abs(carry[0]))
        if low_memory:
            assert carry[1] is None                     # D^T D x is not kept
        else:
            assert np.max(np.abs(carry[1] - D.T @ (D @ x))) <= 1e-12 * np.max(np.abs(carry[1]))


@pytest.mark.parametrize("k", [None, 4])
def test_sliced_preconditioner_is_bitwise_the_whole_vector_formula(k, monkeypatch):
    monkeypatch.setattr(xsolve, "_CHUNK", 1024)        # 7003 columns: 7 slices, the last partial
    D, rng = _text_block(900, 7003, 2)
    lam, rho, n = 1e-3, 0.7, D.shape[0]
    s = XSolver(D, L2, lam, method="cg")
    s._factorize(rho)
    r = rng.normal(size=(7003,) if k is None else (7003, k))
    out = s._preconditioner(rho, r)(r, np.empty_like(r))
    # the formula as the solver applied it with whole d-vectors
    diag, colsum = _column_stats(D)
    mu = colsum / n
    dg = lam + rho * np.maximum(diag - colsum * mu, 0.0)
    w = mu / dg
    c = rho / (1.0 + rho * float(_cdot(colsum, w)))
    ref = _col(1.0 / dg, r) * r
    ref -= _col(w, r) * (c * _cdot(_col(colsum, r), ref))
    assert np.array_equal(out, ref)


def test_low_memory_agrees_with_the_default_to_round_off():
    """Warm-started inexact solves in the engine's regime (rho D^T D a moderate term next to lam:
    8-41 CG iterations a solve, a9a / text-like fits take 1-10), with a change of rho. Measured
    <= 1.4e-15; asserted 1e-13. (In CG runs of ~100 iterations any round-off change of the
    inputs, e.g. the column sums added in another order by the default solver itself, grows to
    ~1e-8: CG's iterates are not forward stable, so no tighter claim holds there.)"""
    D, rng = _text_block(800, 6000, 3)
    solvers = [XSolver(D, L2, 1e-2, method="cg", low_memory=lm) for lm in (False, True)]
    xs, carries = [None, None], [None, None]
    v0 = rng.normal(size=800)
    for rho, outer in ((1e-3, 0.0), (1e-3, 1e-1), (1e-3, 1e-2), (3e-3, 1e-3), (3e-3, 1e-4), (3e-3, 1e-6)):
        v = v0 + 0.1 * rng.normal(size=800)
        for i, s in enumerate(solvers):
            xs[i] = s.solve(v, rho, x0=xs[i], outer=outer, carry=carries[i], overwrite_x0=True)
            carries[i] = s.last_carry
        assert np.max(np.abs(xs[1] - xs[0])) <= 1e-13 * np.max(np.abs(xs[0]))
    assert solvers[0].inner_iters_ == solvers[1].inner_iters_


def test_party_updates_its_own_x_in_place_and_copies_a_restored_one():
    D, rng = _text_block(500, 4000, 4)
    one = PartyUpdate(D, L2, 1e-2, x_solver="cg")
    x_obj = one.x
    for k in range(3):
        one.train_release(k, rng.normal(size=500), rng.normal(size=500) / 500, 0.5, 1.0, 0.5)
        assert one.x is x_obj                           # no new d-vector a round
    state = {key: np.array(val) for key, val in one.get_state().items()}
    assert "DtDx" not in state                           # the low-memory carry is D x alone
    kept = state["x"].copy()
    fresh = PartyUpdate(D, L2, 1e-2, x_solver="cg")
    fresh.set_state(state)
    q, y = rng.normal(size=500), rng.normal(size=500) / 500
    s1, s2 = one.step(q, y, 0.5, 1.0, 0.5), fresh.step(q, y, 0.5, 1.0, 0.5)
    assert np.array_equal(state["x"], kept)              # the caller's array is not written into
    assert np.array_equal(s1, s2) and np.array_equal(one.x, fresh.x)


@pytest.mark.parametrize("low_memory,n_d", [(False, 3), (True, 4)])
def test_one_cg_solve_allocates_a_few_d_vectors(low_memory, n_d, monkeypatch):
    monkeypatch.setattr(xsolve, "_CHUNK", 1024)
    n, d = 4000, 60000
    D, rng = _text_block(n, d, 0)
    s = XSolver(D, L2, 1e-3, method="cg", low_memory=low_memory)
    x, carry = np.zeros(d), None
    for k in range(3):
        v = rng.normal(size=n)
        if k == 2:                                      # the third, warm-started solve
            tracemalloc.start()
        try:
            x = s.solve(v, 0.5, x0=x, outer=1e-3, carry=carry, overwrite_x0=True)
            if k == 2:
                peak = tracemalloc.get_traced_memory()[1]
        finally:
            if k == 2:
                tracemalloc.stop()
        carry = s.last_carry
    # measured: 3.18 and 4.18 d-vectors (the slice buffers and ~4 KB of Python objects on top)
    bound = n_d * 8 * d + 2 * 8 * n + 2 * 8 * xsolve._CHUNK + 16384
    assert peak <= bound, (peak / (8 * d), bound / (8 * d))


def test_party_chooses_low_memory_by_shape_and_keeps_its_target_only_when_clipped():
    """A wide block (d > N: the d-vectors are the memory) runs the low-memory CG; a tall one
    (CG for very large N) keeps D^T D x and the column sums (2 mat-vecs over N rows a round
    saved). Only a party whose target is clipped (a private party's, for its audit) keeps it."""
    wide, rng = _text_block(300, 3000, 5)
    tall = sp.random(3000, 40, density=0.2, format="csr", random_state=6)
    for D, lean in ((wide, True), (tall, False)):
        p = PartyUpdate(D, L2, 1e-2, x_solver="cg")
        assert p.solver.low_memory is lean
        n = D.shape[0]
        p.train_release(1, rng.normal(size=n), rng.normal(size=n) / n, 0.5, 1.0, 0.5)
        assert (p.carry[1] is None) is lean
        assert p.last_target is None
    clipped = PartyUpdate(tall, L2, 1e-2, x_solver="cg", v_clip=3.0)
    q, y = rng.normal(size=3000) * 10, rng.normal(size=3000)
    clipped.train_release(1, q, y, 0.5, 1.0, 0.5)
    assert np.array_equal(clipped.last_target, np.clip(clipped.z_loc - y / 1.0, -3.0, 3.0))
