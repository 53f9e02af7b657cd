"""Horizontal DP inexact ADMM: math against independent references.

- non-private ObjP / ObjT / OutP against scipy's L-BFGS-B on the pooled, box-constrained
  multiclass LR (problem 1);
- the closed-form agent steps against scipy on subproblems (8) and (9);
- the gradient against finite differences of the pooled objective;
- the Laplace noise recovered from an agent's output against Laplace(0, eq.20 / eps_bar)
  (Kolmogorov-Smirnov, and the mean |xi|);
- the eq. (20) sensitivity audit (removal, random and worst-case replacement);
- accounting (dp-accounting PLD) against closed forms; the rho schedule (eq. 21).
"""

import math

import numpy as np
import pytest
import scipy.optimize as so
import scipy.stats as st

from flower_vfl.horizontal import DPIADMMParams, account, agent_seeds, rho_schedule, run_dpiadmm
from flower_vfl.horizontal.admm import agent_update, laplace_scale, objp_step, objt_step
from flower_vfl.horizontal.audit import audit_sensitivity
from flower_vfl.horizontal.model import local_gradient, objective, one_hot, per_sample_l1
from flower_vfl.horizontal.privacy import ledger_entry, standard_draw

J, K, P, N = 6, 3, 3, 100
BETA = 1e-2


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    Wt = rng.normal(size=(J, K))
    X = rng.uniform(size=(P * N, J))
    y = np.argmax(3 * X @ Wt + rng.gumbel(size=(P * N, K)), axis=1)
    f = lambda w: objective(w.reshape(J, K), X, y, BETA)  # noqa: E731
    r = so.minimize(f, np.zeros(J * K), method="L-BFGS-B", bounds=[(-1, 1)] * (J * K),
                    options=dict(gtol=1e-12, ftol=1e-15, maxiter=20000, maxfun=10 ** 6))
    parts = ([X[i * N:(i + 1) * N] for i in range(P)], [y[i * N:(i + 1) * N] for i in range(P)])
    return X, y, r.x.reshape(J, K), r.fun, f, parts


def _run(parts, T, **kw):
    return run_dpiadmm(*parts, DPIADMMParams(beta=BETA, **kw), T, [[1, 2, 3]])


@pytest.mark.parametrize("kw, T, tol", [(dict(variant="outp"), 8000, 1e-6),
                                        (dict(variant="objt", trust="constant"), 3000, 1e-6)])
def test_nonprivate_converges_to_lbfgs_optimum(problem, kw, T, tol):
    _, _, W_star, f_star, f, parts = problem
    res = _run(parts, T, **kw)
    assert np.abs(res.W[0] - W_star).max() < tol
    assert np.abs(res.Z[0] - W_star).max() < tol          # consensus reached too


def test_nonprivate_objp_gap_decreases_to_optimum(problem):
    """ObjP's eta_t = 1/sqrt(t) gives the O(1/sqrt T) rate of Theorem 2: slow, but the
    objective gap shrinks steadily towards scipy's optimum."""
    _, _, W_star, f_star, f, parts = problem
    gaps = [f(_run(parts, T, variant="objp").W[0].ravel()) - f_star for T in (500, 2000, 8000)]
    assert gaps[0] > gaps[1] > gaps[2] > 0
    assert gaps[2] < 1e-3


def test_objt_paper_radius_is_summable(problem):
    """delta_t = a/t^2 (eq. 9 as printed): every coordinate of z_p moves at most a*pi^2/6 in
    total, so ObjT cannot reach an optimum further away and stalls; the authors' code
    (constant radius) does not have this limit (test above)."""
    _, _, W_star, f_star, f, parts = problem
    res = _run(parts, 4000, variant="objt", a=0.2)
    assert np.abs(res.Z).max() <= 0.2 * math.pi ** 2 / 6 + 1e-12
    assert np.abs(W_star).max() > 0.2 * math.pi ** 2 / 6       # so the optimum is out of reach
    assert f(res.W[0].ravel()) - f_star > 1e-2


def test_gradient_matches_finite_differences(problem):
    X, y, *_ = problem
    rng = np.random.default_rng(1)
    z = rng.normal(size=(J, K)) * 0.3
    # sum over agents of f_p'(z) is the gradient of problem (1) at a consensus point
    Xs = X.reshape(P, N, J)
    Ys = one_hot(y.reshape(P, N), K)
    g = local_gradient(np.broadcast_to(z, (P, J, K)), Xs, Ys, P * N, BETA, P).sum(axis=0)
    fd = so.approx_fprime(z.ravel(), lambda w: objective(w.reshape(J, K), X, y, BETA), 1e-7)
    np.testing.assert_allclose(g.ravel(), fd, atol=2e-6)


@pytest.mark.parametrize("step", ["objp", "objt"])
def test_closed_form_agent_step_matches_scipy(step):
    rng = np.random.default_rng(2)
    p = DPIADMMParams(variant=step, a=0.7, box=0.5)
    Zt, G, W, Lam, xi = (rng.normal(size=(J, K)) * s for s in (0.3, 1.0, 0.4, 1.0, 0.5))
    Zt = np.clip(Zt, -p.box, p.box)            # z_p^t is feasible (it came out of a step)
    rho, t = 3.0, 2
    eta, radius = p.a / math.sqrt(t), p.a / t ** 2
    if step == "objp":
        fun = lambda z: (np.sum(G * z.reshape(J, K)) + rho / 2 * np.sum((W - z.reshape(J, K) + (Lam - xi) / rho) ** 2)  # noqa: E731
                         + np.sum((z.reshape(J, K) - Zt) ** 2) / (2 * eta))
        bounds = [(-p.box, p.box)] * (J * K)
        got = objp_step(Zt, G, W, Lam, xi, rho, t, p)
    else:
        fun = lambda z: np.sum(G * z.reshape(J, K)) + rho / 2 * np.sum((W - z.reshape(J, K) + (Lam - xi) / rho) ** 2)  # noqa: E731
        bounds = list(zip(np.maximum(Zt - radius, -p.box).ravel(), np.minimum(Zt + radius, p.box).ravel()))
        got = objt_step(Zt, G, W, Lam, xi, rho, t, p)
    ref = so.minimize(fun, np.clip(Zt, -p.box, p.box).ravel(), method="L-BFGS-B", bounds=bounds,
                      options=dict(gtol=1e-12, ftol=1e-15)).x.reshape(J, K)
    np.testing.assert_allclose(got, ref, atol=1e-6)


def test_laplace_noise_has_calibrated_scale():
    """Recover xi from ObjT's output (W = Lam = G = 0, radius and box huge: z = -xi/rho) and
    compare with Laplace(0, b), b = max_i ||x_i||_1 ||h_i - y_i||_1 / (I eps_bar) computed by
    a plain loop. KS test at level 1e-3 over 20 000 coordinates; mean |xi| within 3%."""
    rng = np.random.default_rng(3)
    X = rng.uniform(size=(50, J))
    y = rng.integers(0, K, 50)
    z0 = rng.normal(size=(J, K)) * 0.2
    I, eps = 200, 0.3
    p = DPIADMMParams(variant="objt", eps_bar=eps, box=1e9, a=1e9, trust="constant")
    G, R = local_gradient(z0, X, one_hot(y, K), I, 0.0, 1, return_residual=True)
    h = np.exp(X @ z0)
    h /= h.sum(1, keepdims=True)
    b_ref = max(np.abs(X[i]).sum() * np.abs(h[i] - np.eye(K)[y[i]]).sum() for i in range(50)) / I / eps
    xs = []
    for t in range(1, 1001):
        draw = standard_draw(12345, t, (J, K), "objt")
        z, info = agent_update(z0, np.zeros((J, K)), np.zeros((J, K)), np.zeros((J, K)),
                               per_sample_l1(X, R, I), draw, 2.0, t, p, I)
        assert info["scale"] == pytest.approx(b_ref, rel=1e-12)
        xs.append(-2.0 * z)
    xi = np.concatenate([x.ravel() for x in xs])
    assert st.kstest(xi / b_ref, "laplace").pvalue > 1e-3
    assert np.mean(np.abs(xi)) == pytest.approx(b_ref, rel=0.03)
    # a wrong scale (10% off) is rejected by the same test
    assert st.kstest(xi / (1.1 * b_ref), "laplace").pvalue < 1e-3


def test_noise_depends_only_on_seed_and_iteration():
    a, b = standard_draw(7, 3, (J, K), "objp"), standard_draw(7, 3, (J, K), "objp")
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, standard_draw(7, 4, (J, K), "objp"))
    assert not np.array_equal(a, standard_draw(8, 3, (J, K), "objp"))


def test_eq20_audit():
    """Removal never exceeds eq. (20) (it attains it); replacement does: a label flip of
    sample i moves the gradient by exactly 2 ||x_i||_1 / I, above eq. (20). The
    data-independent 'replace' bound 4 J / I is never exceeded by any audited neighbour."""
    rng = np.random.default_rng(4)
    X, y = rng.uniform(size=(40, J)), rng.integers(0, K, 40)
    pool_X, pool_y = rng.uniform(size=(500, J)), rng.integers(0, K, 500)
    I = 120
    for z in (np.zeros((J, K)), rng.normal(size=(J, K))):
        a = audit_sensitivity(z, X, y, I, K, pool_X, pool_y, n_random=300, rng=rng)
        assert a["remove"] == pytest.approx(a["eq20"], rel=1e-9)
        assert a["label_flip"] == pytest.approx(2 * np.abs(X).sum(1).max() / I, rel=1e-9)
        assert a["label_flip"] > a["eq20"]
        _, bound = laplace_scale(np.zeros(1), DPIADMMParams(eps_bar=1.0, sensitivity="replace"), I, J)
        assert max(a["remove"], a["label_flip"], a["random"]) <= bound


def test_rho_schedule_eq21():
    p = DPIADMMParams(eps_bar=0.05)
    assert rho_schedule(1, p) == pytest.approx(2 + 100)
    assert rho_schedule(10_000, p) == pytest.approx(2 * 1.2 + 100)
    assert rho_schedule(25_000, p) == pytest.approx(2 * 1.44 + 100)
    assert rho_schedule(10 ** 6, DPIADMMParams(rho_max=50.0)) == 50.0
    assert rho_schedule(5, DPIADMMParams()) == 2.0       # non-private: no c2/eps term


def test_accounting_laplace_pld_against_closed_forms():
    entries = [ledger_entry(t, "objt", 0.5, 0.0, 2.0, 1.0) for t in range(1, 2)]
    one = account(entries, 1e-5)
    assert one["epsilon_pld"] == pytest.approx(0.5, abs=2e-3)     # one Laplace is eps_bar-DP
    many = account([ledger_entry(t, "objt", 0.5, 0.0, 2.0, 1.0) for t in range(1, 201)], 1e-5)
    assert many["epsilon_basic"] == pytest.approx(100.0)
    # advanced composition (Dwork-Rothblum-Vadhan) bounds the exact PLD total from above
    adv = math.sqrt(2 * 200 * math.log(1 / 1e-5)) * 0.5 + 200 * 0.5 * (math.exp(0.5) - 1)
    assert many["epsilon_pld"] < min(adv, many["epsilon_basic"])
    assert many["epsilon_pld"] > math.sqrt(200) * 0.5              # and is not free


def test_private_run_ledger_and_totals(problem):
    *_, parts = problem
    res = run_dpiadmm(*parts, DPIADMMParams(variant="objt", eps_bar=1.0, beta=BETA), 30, agent_seeds(0, 2, P))
    tot = res.privacy(1e-5, seed=1)
    assert len(tot) == P and all(t_["releases"] == 30 and t_["epsilon_basic"] == pytest.approx(30.0) for t_ in tot)
    for led in res.ledgers[1]:
        assert all(e["scale"] == pytest.approx(e["sensitivity"] / 1.0) for e in led)


@pytest.mark.parametrize("kw, msg", [
    (dict(variant="sgd"), "variant='sgd'; choose one of ('objp', 'objt', 'outp')"),
    (dict(eps_bar=0.0), "eps_bar=0.0; give a positive finite float, or None for a non-private run"),
    (dict(sensitivity="l2"), "sensitivity='l2'; choose 'eq20' or 'replace'"),
    (dict(trust="x"), "trust='x'; choose 'paper' (a/t^2) or 'constant' (a)"),
])
def test_bad_params(kw, msg):
    with pytest.raises(ValueError) as e:
        DPIADMMParams(**kw).validate()
    assert str(e.value) == msg


@pytest.mark.parametrize("variant, total, T", [("objt", 1.0, 20), ("objp", 4.0, 50), ("outp", 0.5, 30)])
def test_eps_bar_for_total_inverts_the_accountant(variant, total, T):
    from flower_vfl.horizontal.privacy import eps_bar_for_total
    eb = eps_bar_for_total(total, T, 1e-5, variant)
    scale = math.sqrt(2 * math.log(1.25 / 1e-6)) / eb if variant == "outp" else 1.0 / eb
    got = account([ledger_entry(t, variant, eb, 1e-6, scale, 1.0) for t in range(T)], 1e-5)
    assert got["epsilon_pld"] == pytest.approx(total, rel=2e-3)
    assert total / T < eb < total if variant != "outp" else eb > 0


def test_many_settings_at_once_equal_separate_runs(problem):
    """run_dpiadmm_many shares the agents' GEMMs between settings; each result must be the
    run of that setting alone (unequal agent sizes, private and non-private, all variants)."""
    from flower_vfl.horizontal.engine import run_dpiadmm_many
    X, y, *_ = problem
    parts = ([X[:40], X[40:170], X[170:]], [y[:40], y[40:170], y[170:]])
    ps = [DPIADMMParams(variant="objt", eps_bar=0.5, beta=BETA), DPIADMMParams(variant="outp", eps_bar=2.0, beta=BETA),
          DPIADMMParams(variant="objp", beta=BETA), DPIADMMParams(variant="objt", trust="constant", eps_bar=3.0, beta=BETA)]
    seeds = [agent_seeds(5, 2, P), agent_seeds(6, 3, P), agent_seeds(7, 1, P), agent_seeds(8, 2, P)]
    many = run_dpiadmm_many(*parts, ps, 12, seeds, K=K)
    for p, s, m in zip(ps, seeds, many):
        one = run_dpiadmm(*parts, p, 12, s, K=K)
        assert np.abs(m.W - one.W).max() < 1e-12 and np.abs(m.Lam - one.Lam).max() < 1e-12
        assert m.ledgers == one.ledgers


def test_objt_dual_is_the_noisy_gradient(problem):
    """Where neither W nor the radius binds, ObjT's z_p = w + (lam_p - xi_p - g_p)/rho, so (4c)
    gives lam_p^{t+1} = f_p'(z_p^t) + xi_p^t exactly: the dual carries this iteration's noise
    un-averaged, and w moves by -(1/rho) mean_p(2 lam^{t+1} - lam^t), a gradient step of size
    1/(P rho_t) on F (docs/reproduction-horizontal.md, 'Why')."""
    from flower_vfl.horizontal.privacy import standard_draw
    X, y, *_ = problem
    parts = ([X[i * N:(i + 1) * N] for i in range(P)], [y[i * N:(i + 1) * N] for i in range(P)])
    p = DPIADMMParams(variant="objt", trust="constant", a=50.0, box=50.0, eps_bar=1.0, beta=BETA)
    seeds = agent_seeds(3, 1, P)
    r1, r2 = (run_dpiadmm(*parts, p, T, seeds, K=K) for T in (1, 2))
    Xs = np.stack(parts[0])
    Ys = one_hot(np.stack(parts[1]), K)
    G = local_gradient(r1.Z[0], Xs, Ys, P * N, BETA, P)
    xi = np.stack([r2.ledgers[0][q][1]["scale"] * standard_draw(seeds[0, q], 2, (J, K), "objt") for q in range(P)])
    assert np.abs(r2.Lam[0] - (G + xi)).max() < 1e-12
    rho = rho_schedule(2, p)
    r3 = run_dpiadmm(*parts, p, 3, seeds, K=K)
    step = -(2 * r2.Lam[0] - r1.Lam[0]).mean(axis=0) / rho
    assert np.abs(r3.W[0] - r2.W[0] - step).max() < 1e-12


@pytest.mark.parametrize("S", [1, 3, 7])
def test_gradient_blocks_equal_reference(S):
    """The engine's kernel (seeds folded class-major into the columns, softmax over the
    middle axis in row blocks) against the padded reference ``local_gradient`` and the plain
    eq. (20) per-sample terms, float64, unequal agents larger than one row block."""
    from flower_vfl.horizontal.model import local_gradient_blocks
    rng = np.random.default_rng(11)
    sizes, I = [2500, 1100, 40], 4000
    Xp = [rng.uniform(size=(n, J)) for n in sizes]
    yp = [rng.integers(0, K, n) for n in sizes]
    Z = rng.normal(size=(S, len(sizes), J, K)) * 2.0
    G, l1 = local_gradient_blocks(Z, Xp, [one_hot(y, K) for y in yp], I, BETA, [np.abs(x).sum(1) for x in Xp])
    for p, (X, y) in enumerate(zip(Xp, yp)):
        for s in range(S):
            g, R = local_gradient(Z[s, p], X, one_hot(y, K), I, BETA, len(sizes), return_residual=True)
            assert np.abs(G[s, p] - g).max() < 1e-12
            assert abs(l1[s, p] - per_sample_l1(X, R, I).max()) < 1e-12


def test_blocked_agent_steps_equal_one_block(problem, monkeypatch):
    """The engine runs the agent step in blocks of agents (cache); one agent per block gives
    the same iterates, ledgers and history bit for bit."""
    import flower_vfl.horizontal.engine as eng
    X, y, *_ = problem
    parts = ([X[:40], X[40:170], X[170:]], [y[:40], y[40:170], y[170:]])
    ps = [DPIADMMParams(variant="objt", eps_bar=0.5, beta=BETA), DPIADMMParams(variant="outp", eps_bar=2.0, beta=BETA),
          DPIADMMParams(variant="objp", beta=BETA)]
    seeds = [agent_seeds(5, 2, P), agent_seeds(6, 3, P), agent_seeds(7, 1, P)]
    kw = dict(K=K, X_test=X, y_test=y, eval_every=3)
    one = eng.run_dpiadmm_many(*parts, ps, 9, seeds, **kw)
    monkeypatch.setattr(eng, "_BLOCK", 1)
    blocked = eng.run_dpiadmm_many(*parts, ps, 9, seeds, **kw)
    for a, b in zip(one, blocked):
        np.testing.assert_array_equal(a.Z, b.Z)
        np.testing.assert_array_equal(a.Lam, b.Lam)
        assert a.ledgers == b.ledgers and a.history == b.history


def test_ledger_grouping_never_understates():
    """Multipliers that differ in the 8th digit (a float32 run rounds scale and sensitivity
    apart) are composed as one group at a multiplier no larger than any of them (less noise,
    so a larger epsilon), and the total moves by less than 1e-5 relative."""
    from flower_vfl.horizontal.privacy import _events
    rng = np.random.default_rng(5)
    T, eps = 300, 1.0
    sens = rng.uniform(0.01, 0.02, T)
    led = [ledger_entry(t, "objt", eps, 0.0, s * (1 + 3e-8 * rng.standard_normal()) / eps, s)
           for t, s in enumerate(sens, 1)]
    ms = [e["scale"] / e["sensitivity"] for e in led]
    assert len(set(ms)) > 100
    ev = _events(led)
    assert len(ev) == 1 and ev[0][1] == T
    assert min(ms) * (1 - 2e-6) <= ev[0][0][1] <= min(ms)
    exact = account([ledger_entry(t, "objt", eps, 0.0, 1.0 / eps, 1.0) for t in range(1, T + 1)])["epsilon_pld"]
    assert account(led)["epsilon_pld"] == pytest.approx(exact, rel=1e-5)
