"""The Python API refuses bad arguments and bad data before any round, with a message naming the
argument (or block), the bad value, what is accepted and the fix: the in-process estimator
(:class:`~flower_vfl.estimator.engine.VerticalADMM`) and the central node's strategy
(:class:`~flower_vfl.strategies.vertical_admm.VerticalADMMStrategy`), both checked against the
one parameter table (``flower_vfl.config.schema.PARAMS``). Each message is asserted exactly."""

import re

import numpy as np
import pytest

from flower_vfl import VerticalADMM
from flower_vfl.config.schema import ParamError
from flower_vfl.core.validation import InputError, InputTypeError
from flower_vfl.errors import UserError
from flower_vfl.privacy import PrivacyConfig
from flower_vfl.strategies.config import StrategyConfig
from flower_vfl.strategies.vertical_admm import VerticalADMMStrategy

rng = np.random.default_rng(0)
A, B = rng.normal(size=(20, 3)), rng.normal(size=(20, 2))
Y = np.where(rng.random(20) < 0.5, 1, -1)
Y_NAN = np.where(Y > 0, np.nan, 1.0)          # 9 NaN labels

RANGE = {
    "tol": "expected a finite number >= 0 (relative residual tolerance (Boyd 3.3.1); 0 runs every round; "
           "run config key 'tol'); pass tol= such a value, e.g. the default tol=0.0",
    "tol_abs": "expected a finite number >= 0 (absolute residual tolerance of Boyd's stopping rule (3.3.1)); "
               "pass tol_abs= such a value, e.g. the default tol_abs=1e-09",
    "num_parties": "expected an integer >= 1 and <= 1000 (number of column blocks / parties (one SuperNode "
                   "each); run config key 'num-parties'); pass num_parties= such a value, e.g. the default "
                   "num_parties=2",
}

ESTIMATOR = [
    ("object dtype", InputTypeError, {}, [A.astype(object), B], Y,
     "X_blocks[0] has dtype object; the engine takes numeric blocks only: convert it first, e.g. "
     "np.asarray(block, dtype=float) after encoding any categorical column (or BlockedVerticalADMM, which "
     "converts as scikit-learn does)"),
    ("train_rounds=2.7", ParamError, {"privacy": [None, PrivacyConfig(train_rounds=2.7)]}, [A, B], Y,
     "VerticalADMM: privacy[1] = PrivacyConfig(train_rounds=2.7) is refused: expected an integer >= 0 and "
     "<= 10000 (released training rounds after the warm start; node config key 'dp-train-rounds'); pass "
     "train_rounds= such a value, e.g. the default train_rounds=0"),
    ("privacy dict", ParamError, {"privacy": {"epsilon": 1.0}}, [A, B], Y,
     "VerticalADMM(privacy={'epsilon': 1.0}) is refused: expected None or a list with one entry per party (2), "
     "each None (non-private) or a flower_vfl.privacy.PrivacyConfig; pass e.g. "
     "privacy=[None, PrivacyConfig(epsilon=1.0, train_rounds=5)]"),
    ("privacy entry dict", ParamError, {"privacy": [None, {"epsilon": 1.0}]}, [A, B], Y,
     "VerticalADMM(privacy[1]={'epsilon': 1.0}) is refused: expected None (non-private) or a "
     "flower_vfl.privacy.PrivacyConfig; pass e.g. PrivacyConfig(epsilon=1.0, train_rounds=5)"),
    ("tol=NaN", ParamError, {"tol": float("nan")}, [A, B], Y, "VerticalADMM(tol=nan) is refused: " + RANGE["tol"]),
    ("tol_abs<0", ParamError, {"tol_abs": -1e-9}, [A, B], Y,
     "VerticalADMM(tol_abs=-1e-09) is refused: " + RANGE["tol_abs"]),
    ("complex", InputError, {}, [A + 1j, B], Y,
     "X_blocks[0] has complex dtype complex128; complex data is not supported: pass the real features "
     "(e.g. np.real(block) and np.imag(block) as separate columns)"),
    ("x1e200", InputError, {}, [A * 1e200, B], Y,
     f"X_blocks[0] has an entry of magnitude {np.max(np.abs(A)) * 1e200:.3g}; expected |value| <= 1e+15 (larger "
     "values overflow the float64 products of the x-update): standardize the columns first, e.g. "
     "sklearn.preprocessing.StandardScaler"),
    ("NaN labels, squared", InputError, {"loss": "squared"}, [A, B], Y_NAN,
     "y contains 9 NaN or inf value(s) (loss='squared'); drop those rows (from every party's block too) or "
     "impute the labels first"),
]


@pytest.mark.parametrize("what,kind,kw,blocks,y,msg", ESTIMATOR, ids=[c[0] for c in ESTIMATOR])
def test_the_estimator_refuses_before_any_round(what, kind, kw, blocks, y, msg):
    rounds = []
    with pytest.raises(kind, match="^" + re.escape(msg) + "$") as err:
        VerticalADMM(max_rounds=3, callback=lambda k, m: rounds.append(k), **kw).fit(blocks, y)
    assert isinstance(err.value, UserError) and rounds == []


STRATEGY = [
    ("num_parties=0", {"num_parties": 0}, Y, None, ParamError,
     "VerticalADMMStrategy(num_parties=0) is refused: " + RANGE["num_parties"]),
    ("num_parties=-2", {"num_parties": -2}, Y, None, ParamError,
     "VerticalADMMStrategy(num_parties=-2) is refused: " + RANGE["num_parties"]),
    ("tol=NaN", {"tol": float("nan")}, Y, None, ParamError, "VerticalADMMStrategy(tol=nan) is refused: " + RANGE["tol"]),
    ("tol_abs<0", {"tol_abs": -1.0}, Y, None, ParamError,
     "VerticalADMMStrategy(tol_abs=-1.0) is refused: " + RANGE["tol_abs"]),
    ("eval_every=-1", {"eval_every": -1}, Y, None, ParamError,
     "VerticalADMMStrategy(eval_every=-1) is refused: expected an integer >= 0 (evaluate every k rounds (0: only "
     "at the end); run config key 'eval-every'); pass eval_every= such a value, e.g. the default eval_every=0"),
    ("timeout=-5", {"timeout": -5}, Y, None, ParamError,
     "VerticalADMMStrategy(timeout=-5) is refused: expected a finite number > 0 (seconds to wait for the parties' "
     "replies in one round; run config key 'round-timeout'); pass timeout= such a value, e.g. the default "
     "timeout=600.0"),
    ("party_wait=-1", {"party_wait": -1}, Y, None, ParamError,
     "VerticalADMMStrategy(party_wait=-1) is refused: expected a finite number >= 0 (seconds to wait for a missing "
     "party (every num-parties node at identify, a lost SuperNode to come back); 0: do not wait; run config key "
     "'party-wait'); pass party_wait= such a value, e.g. the default party_wait=120.0"),
    ("max_staleness=0", {"max_staleness": 0}, Y, None, ParamError,
     "VerticalADMMStrategy(max_staleness=0) is refused: expected an integer >= 1 and <= 1000 (stragglers='stale': "
     "most consecutive rounds a party's last release may stand in for it; run config key 'max-staleness'); pass "
     "max_staleness= such a value, e.g. the default max_staleness=5"),
    ("NaN labels, squared", {"loss": "squared"}, Y_NAN, None, InputError,
     "y_train contains 9 NaN or inf value(s) (loss='squared'); drop those rows (from every party's block too) "
     "or impute the labels first"),
    ("NaN test labels, squared", {"loss": "squared"}, Y * 1.0, Y_NAN, InputError,
     "y_test contains 9 NaN or inf value(s) (loss='squared'); drop those rows (from every party's block too) "
     "or impute the labels first"),
    ("a misspelt setting", {"max_round": 3}, Y, None, ParamError,
     "VerticalADMMStrategy got an unknown setting 'max_round' (did you mean 'max_rounds'?); the settings are the "
     "fields of StrategyConfig: num_parties, loss, rho, alpha, variant, fit_intercept, max_rounds, tol, tol_abs, "
     "adaptive_rho, eval_every, timeout, party_wait, stragglers, max_staleness, state_dir, resume, party_keys, "
     "acceleration, penalty, constraint, label_epsilon, max_release, run_settings, wire_dtype, secagg"),
    ("a test class never trained", {"loss": "multinomial"}, np.array([0, 1, 2] * 4), np.array([0, 1, 3]),
     InputError, "y_test holds class(es) [3] that y_train does not (training classes [0, 1, 2]); the model cannot "
                 "score them: drop those held-out rows or give training rows of every class"),
]


@pytest.mark.parametrize("what,kw,y,y_test,kind,msg", STRATEGY, ids=[c[0] for c in STRATEGY])
def test_the_strategy_refuses_at_construction(what, kw, y, y_test, kind, msg):
    """Refused when the strategy is made: before the ServerApp identifies a party or sends anything."""
    with pytest.raises(kind, match="^" + re.escape(msg) + "$") as err:
        VerticalADMMStrategy(y, y_test, **kw)
    assert isinstance(err.value, UserError)


def test_a_config_object_and_the_keywords_build_the_same_strategy():
    """StrategyConfig is what the keywords build; keywords over a config replace its fields."""
    cfg = StrategyConfig(num_parties=3, max_rounds=7, tol=1e-6, timeout=30)
    a = VerticalADMMStrategy(Y, None, cfg)
    b = VerticalADMMStrategy(Y, None, num_parties=3, max_rounds=7, tol=1e-6, timeout=30)
    assert a.config == b.config and (a.num_parties, a.max_rounds, a.tol, a.round_timeout) == (3, 7, 1e-6, 30.0)
    c = VerticalADMMStrategy(Y, None, cfg, max_rounds=9)
    assert (c.max_rounds, c.num_parties, cfg.max_rounds) == (9, 3, 7)
    with pytest.raises(ParamError, match=re.escape("VerticalADMMStrategy(max_staleness=0) is refused")):
        StrategyConfig(max_staleness=0)


def test_a_multinomial_strategy_scores_test_labels_that_lack_a_class():
    """Held-out labels without class 1: encoded on the training classes (a zero column), the final
    evaluation's metrics equal scikit-learn's log-loss and accuracy over the training classes
    (it failed with a broadcast error after all rounds)."""
    from scipy.special import softmax
    from sklearn.metrics import accuracy_score, log_loss

    class Scores(VerticalADMMStrategy):      # the replies' checked scores, as aggregate_evaluate gets them
        def by_party(self, state, replies, what):
            return dict(replies)

        def release(self, state, rep, party, key, shape, what):
            assert shape == rep.shape
            return rep

    y_train, y_test = np.array(["a", "b", "c"] * 5), np.array(["a", "c", "c", "a", "c", "a"])
    st = Scores(y_train, y_test, num_parties=2, loss="multinomial")
    assert st.t_test[:, 1].tolist() == [0.0] * 6 and st.t_test.shape == (6, 3)
    s0, s1 = rng.normal(size=(6, 3)), rng.normal(size=(6, 3))
    got = st.aggregate_evaluate(5, {0: s0, 1: s1})
    f = s0 + s1 + st.central.b
    assert got["test_loss"] == pytest.approx(log_loss(y_test, softmax(f, axis=1), labels=["a", "b", "c"]), rel=1e-12)
    assert got["test_accuracy"] == accuracy_score(y_test, np.array(["a", "b", "c"])[np.argmax(f, axis=1)])
