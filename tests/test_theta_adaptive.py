"""The parties' Jacobi damping theta follows the alignment of their releases (variant 'sharing',
core/rounds.py): in plain rounds with every party non-private and seen, theta of round k + 1 is
clip(1 / max_{j <= k} R_j, 1/M, 1), with R_j = ||sum_m ds_m||^2 / sum_m ||ds_m||^2 the alignment of
round j's changes. Checked here: R's closed form; theta's path; the same optimum as the
centralized solver, also where parties hold the same columns; fewer rounds than Boyd's fixed 1/M
on near-orthogonal parties; where it is off. (Flower parity: tests/test_plain_rounds_flower.py.)"""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from flower_vfl import VerticalADMM
from flower_vfl.core import accel, rounds
from flower_vfl.privacy import PrivacyConfig


def _objective_ref(blocks, y, lam):
    X = sp.hstack(blocks).tocsr() if sp.issparse(blocks[0]) else np.hstack(blocks)
    ref = LogisticRegression(C=1 / (y.size * lam), tol=1e-12, max_iter=20000).fit(X, y)
    w = ref.coef_.ravel()
    return float(np.mean(np.logaddexp(0, -y * ref.decision_function(X))) + lam / 2 * w @ w)


def _fit(blocks, y, lam, rounds_, **kw):
    thetas = []        # theta of rounds 2, 3, ... (the callback runs after a round's update)
    m = VerticalADMM(lam=lam, max_rounds=rounds_, tol=0, callback=lambda k, e: thetas.append(e._central.theta),
                     **kw).fit(blocks, y)
    return m, np.array([h.get("objective", np.nan) for h in m.history_]), thetas


def test_alignment_is_one_for_orthogonal_changes_and_m_for_equal_ones():
    n = 3 * rounds.ALIGN_ROWS + 1                        # every 3rd row
    a, b = np.zeros(n), np.zeros(n)
    a[::2], b[1::2] = 1.0, 2.0                           # disjoint rows: orthogonal
    assert rounds.alignment({0: a, 1: b}, {}, 2) == 1.0
    assert rounds.alignment({0: a, 1: a, 2: a}, {}, 3) == 3.0
    assert rounds.alignment({0: a, 1: -a}, {}, 2) == 0.0
    # changes from the old releases: ds = (a, a) -> 2; nothing moved -> None
    assert rounds.alignment({0: 2 * a, 1: b + a}, {0: a, 1: b}, 2) == 2.0
    assert rounds.alignment({0: a, 1: b}, {0: a, 1: b}, 2) is None
    # on every 3rd row: rows 0, 3, 6, ...; a change only on the other rows is not seen
    c = np.zeros(n)
    c[1::3] = 1.0
    assert rounds.alignment({0: c, 1: c}, {}, 2) is None


def test_theta_rises_once_then_only_falls_and_reaches_the_centralized_optimum_sooner():
    """Near-orthogonal parties (the sparse binary set of benchmarks/_synth.py at 20,000 rows):
    'sharing' reaches a gap of 1e-4 in 7 rounds and 1e-6 in 11, Boyd's fixed 1/M ('sharing-fixed')
    in 15 and 22 (measured); both end at the optimum of scikit-learn on the pooled data."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import _synth
    B, y = _synth.sparse_binary(n_rows=20_000)
    lam = 1e-4
    f_star = _objective_ref(B, y, lam)
    _, fixed, th_fixed = _fit(B, y, lam, 40, acceleration="none", variant="sharing-fixed")
    m, adapt, th = _fit(B, y, lam, 40, acceleration="none")
    first = lambda obj, g: int(np.argmax((obj - f_star) / f_star <= g)) + 1
    assert (first(adapt, 1e-4), first(adapt, 1e-6)) == (7, 11)
    assert (first(fixed, 1e-4), first(fixed, 1e-6)) == (15, 22)
    assert abs(adapt[-1] - f_star) <= 1e-9 * f_star and abs(fixed[-1] - f_star) <= 1e-9 * f_star
    assert set(th_fixed) == {1 / 3}
    assert th[0] > 0.8 and all(a >= b for a, b in zip(th, th[1:])) and min(th) >= 1 / 3


def test_parties_with_the_same_columns_keep_theta_low_and_converge():
    """Breast cancer, party 2 a copy of party 1's columns (and a third party): their changes
    coincide, theta stays near Boyd's 1/3, and the run still ends at the centralized optimum
    (1e-9); three copies of one block give R = 3 every round, so theta is 1/3 throughout and the
    run is bitwise 'sharing-fixed'."""
    X, y = load_breast_cancer(return_X_y=True)
    X, y = StandardScaler().fit_transform(X), np.where(y == 1, 1.0, -1.0)
    lam = 1e-2
    B = [X[:, :10], X[:, :10].copy(), X[:, 10:20]]
    f_star = _objective_ref(B, y, lam)
    _, obj, th = _fit(B, y, lam, 400, acceleration="none")
    assert abs(obj[-1] - f_star) <= 1e-9 * f_star
    assert 1 / 3 <= min(th) and max(th[1:]) <= 0.4
    same = [X[:, :15], X[:, :15].copy(), X[:, :15].copy()]
    _, a, th3 = _fit(same, y, lam, 30, acceleration="none")
    _, b, _ = _fit(same, y, lam, 30, acceleration="none", variant="sharing-fixed")
    assert set(th3) == {1 / 3} and np.array_equal(a, b)


@pytest.mark.parametrize("kw, theta", [
    (dict(acceleration="anderson"), 1 / 3),              # an accelerator extrapolates the rounds
    (dict(acceleration="none", variant="sharing-fixed"), 1 / 3),
    (dict(acceleration="none", variant="paper"), 1.0),
    (dict(acceleration="none", alpha=1.5), 1 / 3),        # over-relaxed: the rule is for alpha = 1
])
def test_theta_stays_where_the_rule_does_not_apply(kw, theta):
    X, y = load_breast_cancer(return_X_y=True)
    X, y = StandardScaler().fit_transform(X), np.where(y == 1, 1.0, -1.0)
    _, _, th = _fit([X[:, :10], X[:, 10:20], X[:, 20:]], y, 1e-2, 6, **kw)
    assert set(th) == {theta}


def test_theta_follows_the_rule_until_anderson_engages_then_stays(monkeypatch):
    """Anderson behind its stall gate (core/accel.py STALL_RATIO, off by default): the rounds before
    it engages are plain ones, theta follows the releases there; from the round it engages theta is frozen (the
    accelerated fixed-point map is that of one theta)."""
    monkeypatch.setattr(accel, "STALL_RATIO", 0.75)
    engaged = []
    orig = accel.Anderson.stalled
    monkeypatch.setattr(accel.Anderson, "stalled", lambda self, q: engaged.append(orig(self, q)) or engaged[-1])
    X, y = load_breast_cancer(return_X_y=True)
    X, y = StandardScaler().fit_transform(X), np.where(y == 1, 1.0, -1.0)
    _, _, th = _fit([X[:, :10], X[:, 10:20], X[:, 20:]], y, 1e-2, 30, acceleration="anderson")
    k = engaged.index(True)                 # engaged after round k + 1: th[k] is the next round's theta
    assert 0 < k < len(th) - 1 and set(th[k:]) == {th[k]}
    assert th[0] != 1 / 3                   # the rule moved theta in the plain rounds before it


def test_a_private_party_keeps_theta_at_one_over_m():
    X, y = load_breast_cancer(return_X_y=True)
    X, y = StandardScaler().fit_transform(X), np.where(y == 1, 1.0, -1.0)
    cfg = PrivacyConfig(epsilon=1.0, delta=1e-5, train_rounds=2, eval_rounds=1)
    _, _, th = _fit([X[:, :10], X[:, 10:20], X[:, 20:]], y, 1e-2, 4, acceleration="none",
                    privacy=[None, None, cfg], random_state=0)
    assert set(th) == {1 / 3}


def test_an_unknown_variant_is_refused_naming_the_choices():
    X, y = load_breast_cancer(return_X_y=True)
    with pytest.raises(ValueError, match=r"^VerticalADMM\(variant='boyd'\) is refused: expected one of 'sharing', "
                                         r"'sharing-fixed', 'paper' .*; pass variant= such a value, e\.g\. the "
                                         r"default variant='sharing'$"):
        VerticalADMM(variant="boyd").fit([X[:, :10], X[:, 10:]], y)


def test_next_theta_rises_once_then_falls_by_five_percent_or_more_and_snaps_to_one_over_m():
    nt = rounds.next_theta
    assert nt(1 / 3, 1.25, 3, first=True) == 0.8                # the first time: 1 / R
    assert nt(1 / 3, 0.5, 3, first=True) == 1.0                 # at most 1
    assert nt(0.8, 1.3, 3, first=False) == 0.8                  # 1/1.3 = 0.769: less than 5 % lower
    assert nt(0.8, 1.6, 3, first=False) == 0.625                # 5 % or more: 1 / R
    assert nt(0.8, 0.9, 3, first=False) == 0.8                  # never rises again
    assert nt(0.5, 3 - 1e-12, 3, first=True) == 1 / 3           # within 5 % of 1/M: 1/M exactly
    assert nt(0.4, 2.9, 3, first=False) == 1 / 3


@pytest.mark.parametrize("kw", [dict(penalty="l1"), dict(penalty="elasticnet"), dict(constraint=("ball", 10.0))])
def test_a_prox_x_update_keeps_theta_at_one_over_m(kw):
    """A new rho / theta costs an L1, elastic-net or constrained party its cached support
    factorizations (a9a L1: 33 -> 32 rounds for +28 % CPU), so theta stays 1/M there."""
    X, y = load_breast_cancer(return_X_y=True)
    X, y = StandardScaler().fit_transform(X), np.where(y == 1, 1.0, -1.0)
    _, _, th = _fit([X[:, :10], X[:, 10:20], X[:, 20:]], y, 1e-2, 6, acceleration="none", **kw)
    assert set(th) == {1 / 3}


@pytest.mark.parametrize("route", ["stacked-ssp", "moment"])
def test_the_variant_key_is_refused_on_a_route_that_does_not_use_it(route):
    """Run config 'variant' sets the ADMM route's damping: another route refuses a non-default
    value, naming the key (apps/server.py, ADMM_ONLY_KEYS)."""
    from flower_vfl.apps.server import check_route
    from flower_vfl.config.schema import ConfigError, run_defaults
    cfg = {**run_defaults(), "route": route, "variant": "paper"}
    with pytest.raises(ConfigError, match=rf"^run config key 'variant'='paper' is refused with route='{route}': "
                                          "it sets the ADMM route, which this run does not use"):
        check_route(cfg)
    check_route({**cfg, "variant": "sharing"})                   # the default passes
