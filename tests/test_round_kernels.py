"""The per-round kernels made cheaper for issue 9 (core/losses.py, central.py, accel.py,
xsolve_prox.py, xsolve.py, engine.py), each against a plain reference:

- the logistic mean by products of 64 factors against ``value(z, t).mean()`` (1e-14 relative);
  ``grad`` against scipy's expit form; ``hess_from_grad`` against ``hess``;
- the z-update's chord predictor: with it, z and b equal the z-update started without it
  (1e-12), over rounds with an accelerator moving y and over a new rho, and at the optimum of
  eq. (7) by its own optimality conditions;
- Anderson in place (u updated in place, Delta u kept instead of u_prev) against a textbook
  type-II Anderson on a linear contraction (1e-9 relative), with a float32 history (1e-6),
  and from a checkpoint of the earlier layout (u_prev);
- the support solve of the L1 active set (Cholesky inverse or eigen-pseudo-inverse, cached)
  against ``np.linalg.lstsq(rcond=1e-12)`` on well-conditioned and singular supports;
- ``one_blas_thread`` sets every BLAS to 1 thread and restores the counts; the engine's sum of
  the releases equals 0.0 + s_0 + s_1 + ... bitwise.
"""

import numpy as np
import pytest
from scipy.special import expit

from flower_vfl.core import xsolve_prox
from flower_vfl.core.accel import Anderson
from flower_vfl.core.central import CentralUpdate
from flower_vfl.estimator.engine import _sum_releases
from flower_vfl.core.losses import LogisticLoss
from flower_vfl.core.xsolve import one_blas_thread


@pytest.mark.parametrize("n", [1, 63, 64, 1000, 32561])
def test_logistic_mean_matches_the_per_sample_values(n):
    rng = np.random.default_rng(n)
    z = rng.normal(scale=4.0, size=n)
    z[: n // 10] *= 50.0                          # saturated margins on both sides
    t = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    loss = LogisticLoss()
    ref = float(np.mean(loss.value(z, t)))
    assert abs(loss.mean(z, t) - ref) <= 1e-14 * max(1.0, abs(ref))


def test_logistic_grad_and_hess_from_grad():
    rng = np.random.default_rng(1)
    z = rng.normal(scale=5.0, size=5000)
    t = np.where(rng.random(5000) < 0.5, -1.0, 1.0)
    loss = LogisticLoss()
    assert np.max(np.abs(loss.grad(z, t) - (-t * expit(-t * z)))) <= 1e-15
    assert np.array_equal(loss.grad(np.zeros(4), np.ones(4)), -0.5 * np.ones(4))
    n = 7.0
    h = loss.hess_from_grad(loss.grad(z, t) / n, t, n, out=(np.empty(5000), np.empty(5000)))
    assert np.max(np.abs(h - loss.hess(z, t))) <= 1e-15


def _central(n=400, seed=0, rho=None):
    rng = np.random.default_rng(seed)
    t = np.where(rng.random(n) < 0.4, -1.0, 1.0)
    return CentralUpdate(LogisticLoss(), t, rho or 0.05 / n, alpha=1.0, theta=0.5), rng


def _z_update_residual(c, a_hat, y_before):
    """Optimality of eq. (7) with the intercept: l'(z + b)/N - y - rho (a + b - (z + b)) = 0
    entry-wise and sum(y) + rho sum(a - z) = 0, scaled by rho."""
    w = c.z + c.b
    g = c.loss.grad(w, c.t) / c.n - y_before - c.rho * (a_hat - c.z)
    return max(np.max(np.abs(g)), abs(y_before.sum() + c.rho * np.sum(a_hat - c.z)) / c.n) / c.rho


def test_chord_predictor_gives_the_same_z_update():
    one, rng = _central()
    two, _ = _central()
    a = rng.normal(size=one.n)
    for k in range(12):
        a = a + rng.normal(scale=0.3 / (k + 1), size=one.n)      # the releases move, then settle
        if k == 7:
            one.set_rho(2.0 * one.rho)
            two.set_rho(two.rho * 2.0)
        two._y_plus = None                                       # no predictor: plain Newton
        y_before = one.y.copy()
        one.step(a)
        two.step(a)
        assert np.max(np.abs(one.z - two.z)) <= 1e-12 and abs(float(one.b - two.b)) <= 1e-12
        assert _z_update_residual(one, a, y_before) <= 1e-10
        if k % 3 == 1:        # an accelerator replaces y after the step (the predictor's y_plus)
            shift = rng.normal(scale=1e-3 / one.n, size=one.n)
            one.y = one.y + shift
            two.y = two.y + shift
    assert one._y_plus is not None


def test_z_is_written_into_two_kept_arrays_never_into_a_restored_one():
    """The fast z-update writes the new z into whichever of two kept arrays is not the current
    z (z_old is still read for the dual residual): the same bits as a fresh array each round;
    a read-only z restored from a checkpoint is left alone."""
    one, rng = _central(seed=4)
    ref, _ = _central(seed=4)
    ids = []
    a = rng.normal(size=one.n)
    for k in range(8):
        a = a + rng.normal(scale=0.2 / (k + 1), size=one.n)
        z_before = one.z
        snapshot = z_before.copy()
        r1, d1 = one.step(a)
        r2, d2 = ref.step(a)
        ref.z = ref.z.copy()                       # the reference: a new array every round
        assert np.array_equal(z_before, snapshot)  # z_old untouched by the step
        assert np.array_equal(one.z, ref.z) and (r1, d1) == (r2, d2)
        ids.append(id(one.z))
        if k == 4:                                 # as the strategy's resume sets it
            frozen = np.array(one.z)
            frozen.flags.writeable = False
            one.z = frozen
    assert len(set(ids[1:5])) == 2                 # two arrays, alternating


def test_predictor_state_round_trips():
    c, rng = _central(seed=3)
    for _ in range(3):
        c.step(rng.normal(size=c.n))
    c.y = c.y + 1e-4 / c.n                        # as Anderson does: y_plus is no longer y
    st = {**{k: np.array(v) for k, v in c.get_state().items()}, **c.predictor_state()}
    d, _ = _central(seed=3)
    d.z, d.y, d.q, d.b = st["z"], st["y"], st["q"], np.float64(st["b"][0])
    d.set_predictor_state(st)
    a = rng.normal(size=c.n)
    c.step(a)
    d.step(a)
    assert np.array_equal(c.z, d.z) and c.b == d.b


def _textbook_anderson(T, u0, mem, rounds, reg=1e-10):
    """Type-II Anderson, u+ = T(u) - (S + Y) gamma, gamma = argmin ||g - Y gamma||^2 +
    reg ||Y||_F^2 / m ||gamma||^2, from the last ``mem`` differences (module docstring)."""
    u = T(u0)                                    # the first call returns T(u)
    us, gs, out = [], [], [u]
    for _ in range(rounds):
        Tu = T(u)
        g = Tu - u
        u = anderson_reference_step(us, gs, u, Tu, mem, reg)
        out.append(u.copy())
    return out


def anderson_reference_step(us, gs, u, Tu, mem, reg):
    """One type-II Anderson step of the dense reference: records u and g = T(u) - u, then
    u+ = T(u) - (S + Y) gamma from the last ``mem`` differences (T(u) alone on the first)."""
    g = Tu - u
    us.append(u.copy())
    gs.append(g)
    if len(gs) == 1:
        return Tu
    dU = np.diff(np.array(us[-(mem + 1):]), axis=0).T
    dG = np.diff(np.array(gs[-(mem + 1):]), axis=0).T
    A = dG.T @ dG
    A += reg * np.trace(A) / A.shape[0] * np.eye(A.shape[0])
    gamma = np.linalg.solve(A, dG.T @ g)
    return Tu - (dU + dG) @ gamma


@pytest.mark.parametrize("f32,chunk", [(False, None), (True, None), (False, 7), (True, 64)])
def test_anderson_in_place_matches_textbook_anderson(f32, chunk, monkeypatch):
    rng = np.random.default_rng(5)
    L = 300
    Q = np.linalg.qr(rng.normal(size=(L, L)))[0]
    M = Q @ np.diag(rng.uniform(0.2, 0.95, L)) @ Q.T
    b = rng.normal(size=L)

    def T(u):
        return M @ u + b

    if f32:
        monkeypatch.setattr(Anderson, "F32_MIN", 1)
    if chunk:                                    # the two sweeps in many chunks, one ragged
        monkeypatch.setattr(Anderson, "CHUNK", chunk)
    acc = Anderson(mem=3, safeguard=1e12)
    u0 = rng.normal(size=L)
    acc.u = acc._next(T(u0))                     # as targets() does with the state it returns
    got = [acc.u.copy()]
    for _ in range(10):
        acc.u = acc._next(T(acc.u.copy()))
        got.append(acc.u.copy())
    assert acc.resets == 1                       # the first call counts as one
    assert acc.S.dtype == (np.float32 if f32 else np.float64)
    ref = _textbook_anderson(T, u0, 3, 10)
    tol = 1e-6 if f32 else 1e-9
    for a, r in zip(got, ref):
        assert np.max(np.abs(a - r)) <= tol * np.max(np.abs(r))
    fixed = np.linalg.solve(np.eye(L) - M, b)
    assert np.max(np.abs(got[-1] - fixed)) < 0.05 * np.max(np.abs(u0 - fixed))    # it moved


def test_anderson_targets_in_chunks_equal_one_chunk(monkeypatch):
    """targets() sweeps segment-aligned chunks (each party's zeta_m, then y): with chunks of 13
    entries (N = 100: ragged, 8 per segment) the messages equal the one-chunk run to 1e-12 over
    12 rounds of a contracting closed loop (the history fills and wraps around)."""
    rng = np.random.default_rng(3)
    n, M = 100, 3
    L = (M + 1) * n
    Q = np.linalg.qr(rng.normal(size=(L, L)))[0]
    A = Q @ np.diag(rng.uniform(0.3, 0.97, L)) @ Q.T
    b = rng.normal(size=L)
    q = rng.normal(size=n)              # any q: the central node's residual, fixed here

    def run(chunk):
        monkeypatch.setattr(Anderson, "CHUNK", chunk)
        acc, theta, out = Anderson(mem=4, safeguard=1e12), 1 / M, []
        Tu = A @ np.zeros(L) + b
        for _ in range(12):
            # T(u) as the central node forms it: zeta_m = s_m - theta q, then y
            s_list = [Tu[m * n:(m + 1) * n] + theta * q for m in range(M)]
            qs, y = acc.targets(s_list, q, Tu[M * n:], theta, 1.0)
            u = np.concatenate([s - theta * qm for s, qm in zip(s_list, qs)] + [y])
            out.append(u)
            Tu = A @ u + b
        assert acc.k >= 5 and acc.resets == 1    # the memory of 4 was used and wrapped
        return out

    for a, b in zip(run(1 << 15), run(13)):
        assert np.max(np.abs(a - b)) <= 1e-12 * max(1.0, np.max(np.abs(a)))


def test_anderson_resumes_from_a_checkpoint_of_the_earlier_layout():
    """The layout before issue 9's rework kept u_prev (the state before u) instead of
    du = u - u_prev: such a checkpoint continues as the uninterrupted accelerator (1e-12)."""
    rng = np.random.default_rng(2)
    acc = Anderson(mem=3)
    steps = [([rng.normal(size=60) for _ in range(2)], rng.normal(size=60), rng.normal(size=60))
             for _ in range(8)]
    u_before = None
    for k, (s_list, q, y) in enumerate(steps[:5]):
        u_before = None if acc.u is None else acc.u.copy()
        acc.targets(s_list, q, y, 0.5, 1.0)
    arrays, scalars = acc.get_state()
    old = {k: v for k, v in arrays.items() if k != "aadu"}
    old["aau_prev"] = u_before                  # what the earlier layout stored
    twin = Anderson(mem=3)
    twin.set_state({k: np.array(v) for k, v in old.items()}, dict(scalars))
    for s_list, q, y in steps[5:]:
        a = acc.targets(s_list, q, y, 0.5, 1.0)
        b = twin.targets(s_list, q, y, 0.5, 1.0)
        for u, v in zip(a[0] + [a[1]], b[0] + [b[1]]):
            assert np.max(np.abs(u - v)) <= 1e-12 * max(1.0, np.max(np.abs(u)))


def test_anderson_float32_products_accumulate_in_float64(monkeypatch):
    """A float32 history's products (Y g and the fresh row of Y Y^T) are summed in float64 over
    the chunks: equal to float64 products of the stored rows to 1e-10 (rows of 120,000 entries,
    4 chunks of 2^15)."""
    monkeypatch.setattr(Anderson, "F32_MIN", 1)
    rng = np.random.default_rng(4)
    n = 40_000
    acc = Anderson(mem=4, safeguard=1e12)
    for _ in range(5):
        acc.targets([rng.normal(size=n) for _ in range(2)], rng.normal(size=n), rng.normal(size=n), 0.5, 1.0)
    assert acc.Y.dtype == np.float32 and acc.k == 3
    m, fresh = min(acc.k, acc.mem), (acc.k - 1) % acc.mem
    Y64 = acc.Y[:m].astype(float)
    ref = Y64 @ acc.g
    assert np.max(np.abs(acc.Yg - ref)) <= 1e-10 * np.max(np.abs(ref))
    assert abs(acc.A[fresh, fresh] - Y64[fresh] @ Y64[fresh]) <= 1e-10 * (Y64[fresh] @ Y64[fresh])


def test_support_solve_matches_lstsq():
    rng = np.random.default_rng(0)
    d = 30
    X = (rng.random((400, d)) < 0.3).astype(float)
    X[:, 5] = 1.0 - X[:, 4]                        # one-hot pair: X4 + X5 = 1 = X6 + X7
    X[:, 7] = 1.0 - X[:, 6]
    G = X.T @ X
    cache = {}
    for S in (np.array([0, 1, 2, 3, 8, 9]), np.arange(4, 8), np.arange(d)):
        for mu2 in (0.0, 1e-3):
            solve, GS = xsolve_prox._support_factor(G, S, 0.7, mu2, cache)
            A = 0.7 * G[np.ix_(S, S)] + mu2 * np.eye(S.size)
            r = rng.normal(size=S.size)
            ref = np.linalg.lstsq(A, r, rcond=1e-12)[0]
            assert np.max(np.abs(solve(r) - ref)) <= 1e-9 * max(1.0, np.max(np.abs(ref)))
            assert np.array_equal(GS, G[:, S])
            assert xsolve_prox._support_factor(G, S, 0.7, mu2, cache)[0] is solve   # cached


def test_one_blas_thread_restores_the_thread_counts():
    from threadpoolctl import threadpool_info
    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    with one_blas_thread():
        assert all(i["num_threads"] == 1 for i in threadpool_info() if i["user_api"] == "blas")
        with one_blas_thread():
            pass
        assert all(i["num_threads"] == 1 for i in threadpool_info() if i["user_api"] == "blas")
    assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before


def test_sum_of_releases_is_the_plain_sum():
    rng = np.random.default_rng(0)
    ss = [rng.normal(size=1000) for _ in range(4)]
    for m in (1, 2, 4):
        ref = 0.0
        for s in ss[:m]:
            ref = ref + s
        got = _sum_releases(ss[:m])
        assert np.array_equal(got, ref) and all(got is not s for s in ss)


def test_logistic_grad_is_grad_hess_gradient_bitwise():
    """LogisticLoss.grad skips the Hessian's passes but is grad_hess's l' bit for bit (the
    z-update fallback and the first round use it), including the capped entries t z > 700."""
    from flower_vfl.core.losses import get_loss
    loss = get_loss("logistic")
    rng = np.random.default_rng(0)
    z = rng.normal(size=10_001) * 50
    z[:3] = [1e6, -1e6, 701.0]
    t = np.where(rng.random(10_001) < 0.5, -1.0, 1.0)
    g = loss.grad(z, t)
    assert np.array_equal(g, loss.grad_hess(z, t)[0])
    assert np.array_equal(g, -t / (1.0 + np.exp(np.minimum(t * z, 700.0))))


def test_third_derivative_from_the_gradient():
    """hess_from_grad's ``third`` is l''' = t (2p - 1) p (1 - p): the derivative of l'' (central
    differences of ``hess``, 1e-8) and of grad_hess's l'' along z."""
    rng = np.random.default_rng(4)
    z = rng.normal(scale=4.0, size=3000)
    t = np.where(rng.random(3000) < 0.5, -1.0, 1.0)
    loss = LogisticLoss()
    n = 11.0
    third = np.empty(3000)
    loss.hess_from_grad(loss.grad(z, t) / n, t, n, out=(np.empty(3000), np.empty(3000)), third=third)
    eps = 1e-5
    fd = (loss.hess(z + eps, t) - loss.hess(z - eps, t)) / (2 * eps)
    assert np.max(np.abs(third - fd)) <= 1e-8
    assert np.max(np.abs(third)) <= loss.curvature3 * (1 + 1e-12)


def _on_off_rounds(monkeypatch, flag, counts, n, rho, a0, move, new_rho_at, factor, rounds):
    """Two central nodes fed the same releases, ``central.<flag>`` on for the first and off for
    the second, the releases moving by ``move(k)`` a round and rho scaled by ``factor`` at round
    ``new_rho_at``: every z-update of the two agrees to 1e-12 and meets eq. (7) to 1e-10.
    ``counts(on)`` is called before each step of the central node with the flag ``on``."""
    from flower_vfl.core import central as central_mod
    one, rng = _central(n=n, rho=rho / n)
    two, _ = _central(n=n, rho=rho / n)
    a = rng.normal(size=n) * a0
    for k in range(rounds):
        a = a + rng.normal(scale=move(k), size=n)
        if k == new_rho_at:
            one.set_rho(factor * one.rho)
            two.set_rho(factor * two.rho)
        y_before = one.y.copy()
        for c, on in ((one, True), (two, False)):
            counts(on)
            monkeypatch.setattr(central_mod, flag, on)
            c.step(a)
        assert np.max(np.abs(one.z - two.z)) <= 1e-12 and abs(float(one.b - two.b)) <= 1e-12
        assert _z_update_residual(one, a, y_before) <= 1e-10


def test_cubic_predictor_moves_only_the_start(monkeypatch):
    """The chord step's second-order correction (central.CUBIC_PREDICTOR) changes where Newton
    starts, not where it ends: over rounds that move and settle (and a new rho) the z-updates
    with and without it agree to 1e-12 and meet eq. (7) to 1e-10; once the rounds settle it needs
    fewer exp-evaluations (grad_hess) than the chord step alone."""
    calls = {True: 0, False: 0}
    state = {"on": True}
    orig = LogisticLoss.grad_hess

    def counted(self, *a, **k):
        calls[state["on"]] += 1
        return orig(self, *a, **k)
    monkeypatch.setattr(LogisticLoss, "grad_hess", counted)
    _on_off_rounds(monkeypatch, "CUBIC_PREDICTOR", lambda on: state.update(on=on), n=2000, rho=0.00625,
                   a0=1.0, move=lambda k: 0.3 / (k + 1) ** 2, new_rho_at=9, factor=2.0, rounds=16)
    assert calls[True] < calls[False]


def test_grad_hess_with_a_float32_exp_is_that_of_a_nearby_point():
    """grad_hess(f32=...) takes e^u in float32: its derivatives are those of a point near z
    (u rounded to float32, |du| <= 6e-8 |u|, and float32 exp's own error, a few 6e-8 relative
    of e^u, i.e. of u): the gradient is off by at most l2 (6e-8 |u| + 2.5e-7) and l2 by c3
    times that (l2 = the second derivative, c3 the bound on the third); above u = 88 it
    caps (p < 1e-38)."""
    rng = np.random.default_rng(6)
    z = np.concatenate([rng.normal(scale=6.0, size=20000), [90.0, -90.0, 700.0, -700.0, 0.0]])
    t = np.where(rng.random(z.size) < 0.5, -1.0, 1.0)
    loss = LogisticLoss()
    g64, h64 = loss.grad_hess(z, t)
    g32, h32 = loss.grad_hess(z, t, f32=np.empty(z.size, dtype=np.float32))
    du = 6e-8 * np.abs(t * z) + 2.5e-7
    assert np.all(np.abs(g32 - g64) <= du * h64 + 1e-37)
    assert np.all(np.abs(h32 - h64) <= du * loss.curvature3 + 1e-37)
    assert np.max(np.abs(g32 - g64)) > 0.0                    # it is the float32 exp


def test_float32_first_steps_move_only_the_start(monkeypatch):
    """The fast z-update's steps from afar with a float32 exp (central.F32_STEPS) end where the
    float64 ones end: over rounds that move and settle (a new rho, a far first round) the
    z-updates agree to 1e-12 and meet eq. (7) to 1e-10, and fewer float64 exps are taken."""
    exps = {True: 0, False: 0}
    state = {"on": True}
    orig = LogisticLoss.grad_hess

    def counted(self, *a, f32=None, **k):
        exps[state["on"]] += f32 is None
        return orig(self, *a, f32=f32, **k)
    monkeypatch.setattr(LogisticLoss, "grad_hess", counted)
    _on_off_rounds(monkeypatch, "F32_STEPS", lambda on: state.update(on=on), n=3000, rho=0.05,
                   a0=3.0, move=lambda k: 1.0 / (k + 1) ** 2, new_rho_at=8, factor=4.0, rounds=14)
    assert exps[True] < exps[False]
