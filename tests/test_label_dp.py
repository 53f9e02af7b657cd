"""Label DP for the label owner: randomized response, the forward-corrected loss, and the
guarantee that everything the parties receive is a function of the privatized labels only."""

import math

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit
from scipy.stats import binomtest

from flower_vfl import VerticalADMM
from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.core.label_noise import ForwardCorrectedLogistic, curvature_bound
from flower_vfl.core.losses import LogisticLoss, get_loss
from flower_vfl.io.data import labels, load_all, party_block
from flower_vfl.deploy.local_grid import LocalGrid
from _wire import travelled
from flower_vfl.privacy.label_dp import (LabelPrivacy, flip_probability, label_epsilon_spent,
                                         privatize_labels, randomized_response)

HANDLERS = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}


# ------------------------------------------------------------------ randomized response
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0])
def test_rr_flip_rate_matches_p(eps):
    """Flips ~ Binomial(N, 1/(1+e^eps)), on each class separately (the flips do not depend on
    the label): two-sided exact binomial test, fixed seeds, each p-value > 1e-4."""
    n = 200_000
    y = np.where(np.random.default_rng(1).random(n) < 0.3, 1.0, -1.0)
    out = randomized_response(y, eps, seed=int(eps * 10))
    p = 1.0 / (1.0 + math.exp(eps))
    assert flip_probability(eps) == pytest.approx(p, rel=1e-15)
    assert set(np.unique(out).tolist()) == {-1.0, 1.0}
    for cls in (-1.0, 1.0):
        sel = y == cls
        k = int(np.sum(out[sel] != cls))
        assert binomtest(k, int(sel.sum()), p).pvalue > 1e-4, (cls, k / sel.sum(), p)


def test_rr_keeps_the_label_encoding_and_draws_from_os_entropy_by_default():
    y01 = np.array([0, 1] * 5000)
    out = randomized_response(y01, 1.0, seed=3)
    assert out.dtype == y01.dtype and set(np.unique(out).tolist()) == {0, 1}
    assert np.mean(out != y01) == pytest.approx(flip_probability(1.0), abs=0.02)
    # no seed: fresh OS entropy each call (P[equal] = (p^2 + (1-p)^2)^10000, i.e. never)
    assert not np.array_equal(randomized_response(y01, 1.0), randomized_response(y01, 1.0))


def test_label_ledger_epsilon_comes_from_dp_accounting_and_equals_the_closed_form():
    """RR with flip probability p is exactly log((1-p)/p)-DP (pure); dp-accounting's PLD
    accountant (REPLACE_ONE) must answer that, to its discretization (1e-5)."""
    for eps in (0.5, 1.0, 3.0):
        p = flip_probability(eps)
        assert label_epsilon_spent(eps) == pytest.approx(math.log((1 - p) / p), abs=2e-5)
    lp = LabelPrivacy(1.0, seed=0)
    assert lp.spent() == 0.0
    lp.privatize(np.array([1.0, -1.0, 1.0]))
    rep = lp.report()
    assert rep["totals"]["pld"] == pytest.approx(1.0, abs=2e-5) and rep["totals"]["delta"] == 0.0
    assert "seed" not in str(rep["config"]).replace("seed (kept", "")
    with pytest.raises(RuntimeError, match="already privatized once"):
        lp.privatize(np.array([1.0, -1.0]))


def test_label_epsilon_bad_inputs():
    with pytest.raises(ValueError, match=r"label_epsilon=-1.0 must be > 0 \(0 or None: labels not protected\)"):
        VerticalADMM(label_epsilon=-1.0).fit([np.eye(4)], [1, -1, 1, -1])
    with pytest.raises(ValueError, match=r"label_epsilon=1.0 needs loss='logistic' .* got loss='squared'"):
        VerticalADMM(loss="squared", label_epsilon=1.0).fit([np.eye(4)], [0.5, 1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"label_epsilon needs binary labels"):
        randomized_response(np.array([0, 1, 2]), 1.0)
    with pytest.raises(ValueError, match=r"flip_prob=0.5 must be in \[0, 0.5\)"):
        ForwardCorrectedLogistic(0.5)
    # off: None, 0 and inf leave loss and labels untouched
    for off in (None, 0, 0.0, float("inf")):
        loss, y, lp = privatize_labels(get_loss("logistic"), np.array([1.0, -1.0]), off)
        assert lp is None and loss.name == "logistic" and y.tolist() == [1.0, -1.0]


# ------------------------------------------------------------------ the corrected loss
@pytest.mark.parametrize("p", [0.0, 0.018, 0.12, 0.269, 0.378, 0.45])
def test_corrected_loss_value_gradient_curvature(p):
    loss = ForwardCorrectedLogistic(p)
    z = np.linspace(-25, 25, 2001)
    for t in (1.0, -1.0):
        tt = np.full_like(z, t)
        direct = -np.log((1 - p) * expit(t * z) + p * expit(-t * z))
        np.testing.assert_allclose(loss.value(z, tt), direct, rtol=1e-12, atol=1e-14)
        h = 1e-5
        fd_g = (loss.value(z + h, tt) - loss.value(z - h, tt)) / (2 * h)
        fd_h = (loss.grad(z + h, tt) - loss.grad(z - h, tt)) / (2 * h)
        np.testing.assert_allclose(loss.grad(z, tt), fd_g, atol=1e-9)
        np.testing.assert_allclose(loss.hess(z, tt), fd_h, atol=1e-9)
        assert np.all(np.abs(loss.grad(z, tt)) <= 1.0)
    # the curvature bound is attained (to 1e-5) and never exceeded on a fine grid
    zz = np.linspace(-40, 40, 800_001)
    hmax = np.max(np.abs(loss.hess(zz, np.ones_like(zz))))
    assert hmax <= loss.curvature and loss.curvature <= hmax * (1 + 1e-5)
    assert loss.convex == (p == 0.0)
    if p == 0.0:   # no noise: exactly the logistic loss
        np.testing.assert_allclose(loss.value(z, np.ones_like(z)), LogisticLoss().value(z, np.ones_like(z)),
                                   rtol=1e-12)


def test_curvature_bound_at_eps1_matches_its_closed_form_maximum():
    """At p = 1/(1+e), l'' = s'(v) - s'(v+1) (s = sigmoid): its maximum, found independently
    by a dense grid, is the bound."""
    v = np.linspace(-10, 10, 2_000_001)
    d = lambda u: expit(u) * (1 - expit(u))  # noqa: E731
    assert curvature_bound(flip_probability(1.0)) == pytest.approx(np.max(d(v) - d(v + 1.0)), rel=2e-6)


def test_admm_reaches_the_pooled_lbfgs_optimum_of_the_corrected_loss():
    """Breast cancer, 3 parties, labels privatized at eps = 1 (seed 0): ADMM with the corrected
    loss (default rho = 3c/N, intercept as its own block) reaches scipy's L-BFGS optimum on the
    pooled data: objective to 1e-12, coefficients to 1e-5, gradient to 1e-7."""
    X, y, _, _ = load_all("breast_cancer")
    blocks = [party_block("breast_cancer", i, 3)[0] for i in range(3)]
    lam, eps = 1e-2, 1.0
    t = randomized_response(y, eps, seed=0)
    loss = ForwardCorrectedLogistic(flip_probability(eps))
    n = len(y)

    def obj(wb):
        w, b = wb[:-1], wb[-1]
        g = loss.grad(X @ w + b, t)
        return loss.mean(X @ w + b, t) + lam / 2 * w @ w, np.r_[X.T @ g / n + lam * w, g.mean()]

    ref = minimize(obj, np.zeros(X.shape[1] + 1), jac=True, method="L-BFGS-B",
                   options={"maxiter": 10000, "gtol": 1e-12, "ftol": 1e-15})
    m = VerticalADMM(lam=lam, max_rounds=1000, tol=1e-10, label_epsilon=eps, label_seed=0).fit(blocks, y)
    assert m.converged_ and m.loss_.name == "logistic_rr"
    wb = np.r_[np.concatenate(m.coef_), m.intercept_]
    f, g = obj(wb)
    assert f == pytest.approx(ref.fun, abs=1e-12)
    assert np.max(np.abs(wb - ref.x)) <= 1e-5
    assert np.max(np.abs(g)) <= 1e-7
    rep = m.privacy_report()[-1]
    assert rep["party_id"] == "label owner" and rep["totals"]["pld"] == pytest.approx(1.0, abs=2e-5)


# ------------------------------------------------------------------ what the parties receive
class _Uniforms:
    """A numpy-Generator stand-in whose ``random(n)`` returns given uniforms: the RR noise draw."""

    def __init__(self, u):
        self.u = u

    def random(self, n):
        assert n == self.u.size
        return self.u.copy()


def _messages_to_parties(y, u, y_test, rounds=8):
    """Run the Flower path in process (real ClientApp handlers, a Context per node) and return
    every message content the parties received, in order, as raw bytes."""
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": rounds}
    seen = []

    def on_reply(msg, rep):
        content = travelled(msg.content)
        arrays = {k: v.numpy().tobytes() for name, rec in content.array_records.items()
                  for k, v in rec.items()}
        configs = {k: v for rec in content.config_records.values() for k, v in rec.items()}
        seen.append((msg.metadata.message_type, msg.metadata.dst_node_id, arrays, configs))

    st = sa.VerticalADMMStrategy(y, y_test, num_parties=2, max_rounds=rounds, label_epsilon=1.0,
                                 label_seed=_Uniforms(u))
    st.start(LocalGrid(HANDLERS, {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc, on_reply=on_reply))
    return seen, st


def test_party_messages_are_a_function_of_the_privatized_labels_only():
    """Two label owners with different true labels (30 % changed) whose randomized response
    (the same mechanism, noise draws coupled) gives the same privatized labels: every message
    every party receives is bitwise identical. Same true labels with other flips: they differ
    (the comparison can see a dependence)."""
    y, yt = labels("breast_cancer")
    n = y.size
    rng = np.random.default_rng(0)
    p = flip_probability(1.0)
    u_a = rng.random(n)
    y_b = np.where(rng.random(n) < 0.3, -y, y)
    changed = y_b != y
    # run B flips exactly where A flips on unchanged labels, and the other way on changed ones
    u_b = np.where(changed, np.where(u_a < p, (1 + p) / 2, p / 2), u_a)
    seen_a, st_a = _messages_to_parties(y, u_a, yt)
    seen_b, st_b = _messages_to_parties(y_b, u_b, yt)
    assert changed.sum() > 0.2 * n and np.array_equal(st_a.t, st_b.t)
    assert len(seen_a) == len(seen_b) == 2 + 2 * 8 + 2
    assert sum(len(a[2]) for a in seen_a) > 0
    assert seen_a == seen_b
    seen_c, _ = _messages_to_parties(y, rng.random(n), yt)
    assert seen_c != seen_a


def test_run_config_label_epsilon_reaches_the_strategy_and_the_report(tmp_path):
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 5, "label-epsilon": 2.0,
          "out-dir": str(tmp_path)}
    st = sa.make_strategy(rc)
    assert st.loss.name == "logistic_rr" and st.loss.flip_prob == pytest.approx(flip_probability(2.0))
    st.start(LocalGrid(HANDLERS, {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc))
    sa.write_outputs(st, rc)
    # the (clean) test labels are scored with the plain log-loss, not the corrected training loss
    _, yt = labels("breast_cancer")
    assert st.final_["test_loss"] == pytest.approx(np.mean(np.logaddexp(0.0, -yt * st.decision_test_)), rel=1e-12)
    import json
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["label_privacy"]["totals"]["pld"] == pytest.approx(2.0, abs=2e-5)
    assert "label DP" in json.dumps(rep) or "randomized response" in json.dumps(rep)
    off = sa.make_strategy({"dataset": "breast_cancer", "num-parties": 2, "label-epsilon": 0.0})
    assert off.label_privacy_ is None and off.loss.name == "logistic"
    with pytest.raises(Exception, match="label-epsilon"):
        sa.make_strategy({"dataset": "breast_cancer", "num-parties": 2, "label-epsilon": -1.0})


# ------------------------------------------------------------------ utility on a9a
@pytest.mark.slow
def test_a9a_utility_at_label_epsilon_1():
    """a9a, paper split, eps_label = 1, 3 noise seeds: mean test accuracy within 0.005 of the
    non-private 0.8498 and mean test log-loss <= 0.335 (issue #11's aim; measured 0.8503 /
    0.3281 at seed 0, docs/privacy.md "Label privacy")."""
    X, y, Xt, yt = load_all("a9a")
    blocks = [party_block("a9a", i, 2) for i in range(2)]
    acc, ll = [], []
    for seed in range(3):
        m = VerticalADMM(lam=1e-4, max_rounds=300, tol=1e-8, label_epsilon=1.0, label_seed=seed)
        m.fit([b[0] for b in blocks], y)
        f = m.decision_function([b[1] for b in blocks])
        acc.append(np.mean(np.where(f >= 0, 1, -1) == yt))
        ll.append(np.mean(np.logaddexp(0.0, -yt * f)))
    assert np.mean(acc) >= 0.8498 - 0.005
    assert np.mean(ll) <= 0.335


def test_saved_or_pickled_model_never_carries_the_label_seed(tmp_path):
    """With the flip seed, a party that saw sign(y) = -t~ could undo the flips: the seed stays
    with the label owner's live object, never in a pickle or a saved model."""
    import pickle

    X, y, Xt, _ = load_all("breast_cancer")
    blocks = [party_block("breast_cancer", i, 2) for i in range(2)]
    m = VerticalADMM(lam=1e-2, max_rounds=30, label_epsilon=1.0, label_seed=987654321)
    m.fit([b[0] for b in blocks], y)
    m2 = pickle.loads(pickle.dumps(m))
    assert m2.label_seed is None and m2.label_privacy_.seed is None
    assert m2.privacy_report()[-1]["config"]["noise_source"] == "seed (kept by the label owner)"
    np.testing.assert_array_equal(m2.predict_proba([b[1] for b in blocks]), m.predict_proba([b[1] for b in blocks]))
    path = m.save(tmp_path / "model.npz")
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b'"label_epsilon": 1.0' in raw          # the file is plain JSON + arrays: the check sees it
    assert b"987654321" not in raw and b"label_seed" not in raw
    loaded = VerticalADMM.load(path)
    np.testing.assert_allclose(loaded.decision_function([b[1] for b in blocks]),
                               m.decision_function([b[1] for b in blocks]), rtol=1e-12)
