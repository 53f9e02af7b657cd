"""scikit-learn's estimator contract, kept by BlockedVerticalADMM on every loss (and by
PartyColumnTransformer): scikit-learn's own ``check_estimator`` checks (failures only where
declared, each with its reason), no
``predict_proba`` for losses without probabilities, a usable default ``blocks``,
``NotFittedError`` before fit, sparse X as the tags say, and each party's own preprocessing
(one-hot, polynomial) inside a Pipeline with the blocks' widths re-derived. ~15 s on 2 cores."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import expit
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, PolynomialFeatures, StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from flower_vfl import VerticalADMM
from flower_vfl.estimator.blocked import BlockedVerticalADMM, PartyColumnTransformer

LOSSES = ("logistic", "hinge", "squared", "multinomial", "sigmoid")

#: the checks that fail, per loss, and why (scikit-learn's expected_failed_checks)
_ALPHA = ("the check sets alpha=0.01 as a ridge strength; here alpha is ADMM's over-relaxation (the paper's "
          "name), and 0.01 leaves the fit far from converged in the rounds given")
_BINARY_MULTINOMIAL = ("loss='multinomial' scores one column per class, (n, 2) on a binary problem; scikit-learn "
                       "expects (n,) there: use loss='logistic' for two classes")
EXPECTED_FAILURES = {
    "squared": {"check_regressors_train": _ALPHA,
                "check_regressors_no_decision_function": "decision_function is the model's score D x + b for every "
                                                         "loss (the Flower path and the saved models read it)"},
    "multinomial": {"check_classifiers_classes": _BINARY_MULTINOMIAL, "check_classifiers_train": _BINARY_MULTINOMIAL},
}


def _expected_failed(est):
    return EXPECTED_FAILURES.get(getattr(est, "loss", None), {})


@parametrize_with_checks([BlockedVerticalADMM(loss=loss, max_rounds=5) for loss in LOSSES]
                         + [BlockedVerticalADMM(blocks=PartyColumnTransformer(2, PolynomialFeatures(2)), max_rounds=5),
                            PartyColumnTransformer(), PartyColumnTransformer(2, StandardScaler())],
                         expected_failed_checks=_expected_failed)
def test_check_estimator(estimator, check):
    check(estimator)


rng = np.random.default_rng(0)
X = rng.normal(size=(60, 5))
Y = np.where(X @ np.array([1.0, -2.0, 0.5, 1.0, 0.0]) + 0.3 * rng.normal(size=60) > 0, 1, -1)


@pytest.mark.parametrize("loss,has", [("logistic", True), ("multinomial", True), ("hinge", False),
                                      ("squared", False), ("sigmoid", False)])
def test_predict_proba_exists_only_for_losses_with_probabilities(loss, has):
    y = Y * 1.0 if loss == "squared" else Y
    for cls in (VerticalADMM, BlockedVerticalADMM):
        assert hasattr(cls(loss=loss), "predict_proba") is has
    m = BlockedVerticalADMM(loss=loss, max_rounds=10).fit(X, y)
    assert hasattr(m, "predict_proba") is has
    if loss == "logistic":       # P(classes_[1]) = sigmoid of the decision value
        np.testing.assert_allclose(m.predict_proba(X)[:, 1], expit(m.decision_function(X)), rtol=1e-14)


def test_default_blocks_is_two_contiguous_halves_and_unfitted_is_not_fitted_error():
    m = BlockedVerticalADMM(max_rounds=10)
    for method in ("decision_function", "predict", "predict_proba"):
        with pytest.raises(NotFittedError, match="is not fitted yet"):
            getattr(m, method)(X)
    m.fit(X, Y)
    ref = VerticalADMM(max_rounds=10).fit([X[:, :3], X[:, 3:]], Y)
    assert m.block_widths_ == [3, 2] and m.n_features_in_ == 5
    # to rounding: the blocks' memory layouts differ (tests/test_model_selection.py)
    np.testing.assert_allclose(m.decision_function(X), ref.decision_function([X[:, :3], X[:, 3:]]),
                               rtol=1e-12, atol=1e-12)


def test_sparse_X_fits_as_dense_X():
    dense = BlockedVerticalADMM(blocks=[2, 3], max_rounds=20, acceleration="none").fit(X, Y)
    for fmt in ("csr", "csc", "coo"):
        m = BlockedVerticalADMM(blocks=[2, 3], max_rounds=20, acceleration="none").fit(sp.csr_matrix(X).asformat(fmt), Y)
        np.testing.assert_allclose(m.decision_function(sp.csr_matrix(X)), dense.decision_function(X),
                                   rtol=1e-8, atol=1e-10)


def test_each_party_preprocesses_its_own_columns_in_a_pipeline():
    """Party 0 one-hot encodes its 2 categorical columns, party 1 expands its 3 columns to degree 2;
    the widths are those after the transforms and the model is VerticalADMM's on the transformed
    blocks, in a Pipeline and in a grid search over the parties' preprocessing."""
    cat = rng.integers(0, 3, size=(60, 2)).astype(float)
    Xc = np.hstack([cat, X[:, :3]])
    prep = PartyColumnTransformer([2, 3], [OneHotEncoder(handle_unknown="ignore"), PolynomialFeatures(2)])
    pipe = make_pipeline(StandardScaler(with_mean=False, with_std=False),
                         BlockedVerticalADMM(blocks=prep, max_rounds=15)).fit(Xc, Y)
    model = pipe[-1]
    b0 = OneHotEncoder(handle_unknown="ignore").fit_transform(cat)
    b1 = PolynomialFeatures(2).fit_transform(X[:, :3])
    assert model.block_widths_ == [6, 10] == [b0.shape[1], b1.shape[1]] and model.n_features_in_ == 5
    ref = VerticalADMM(max_rounds=15).fit([b0, b1], Y)
    np.testing.assert_allclose(pipe.decision_function(Xc), ref.decision_function([b0, b1]), rtol=1e-12, atol=1e-12)
    search = GridSearchCV(BlockedVerticalADMM(blocks=prep, max_rounds=5),
                          {"blocks__transformers": [None, [OneHotEncoder(handle_unknown="ignore"), None]]},
                          cv=3, error_score="raise").fit(Xc, Y)
    assert search.best_estimator_.block_widths_ in ([2, 3], [6, 3])
