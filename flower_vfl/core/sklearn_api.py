"""What makes :class:`~flower_vfl.core.engine.VerticalADMM` behave like a scikit-learn estimator.

Class encoding (the user's own labels in ``classes_``, ``predict`` returning them), ``score``,
``save``/``load`` without the training data, and pickles that drop the parties' blocks.
``get_params``/``set_params``/``clone`` come from :class:`sklearn.base.BaseEstimator`.
No Flower imports.
"""

from __future__ import annotations

import json

import numpy as np

__all__ = ["BINARY_LOSSES", "encode_classes", "decode_scores", "check_target", "SklearnAPIMixin"]

BINARY_LOSSES = ("logistic", "hinge", "sigmoid", "logistic_rr")   # logistic_rr: core/label_noise.py
#: state that holds training data (the parties' blocks, the labels): never pickled or saved
_TRAINING_STATE = ("_parties", "_central")


def encode_classes(y, loss_name: str):
    """``(y for the loss, classes)``: a binary loss gets t in {-1, +1} with ``classes[1]`` the
    positive class (sorted, as scikit-learn does); ``classes`` is None for 'squared'."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:       # check_target already warned
        y = y.ravel()
    if loss_name == "squared":
        return y, None
    if loss_name not in BINARY_LOSSES:          # multinomial encodes its own classes
        return y, np.unique(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D for loss={loss_name!r}; got shape {y.shape}")
    from sklearn.utils.multiclass import type_of_target
    kind = type_of_target(y)
    if kind in ("continuous", "continuous-multioutput"):
        raise ValueError(f"Unknown label type: {kind}. loss={loss_name!r} needs class labels; use "
                         "loss='squared' for a continuous target")
    classes = np.unique(y)
    if classes.size != 2:
        raise ValueError(f"Only binary classification is supported with loss={loss_name!r}: y has "
                         f"{classes.size} class{'es' if classes.size != 1 else ''} "
                         f"({classes[:5].tolist()}{'...' if classes.size > 5 else ''}), it needs exactly 2. "
                         "Use loss='multinomial' for more classes or loss='squared' for regression")
    return np.where(y == classes[1], 1.0, -1.0), classes


def check_target(y, who="VerticalADMM"):
    """y as a 1-D array: None is refused, a column vector is raveled with scikit-learn's warning."""
    if y is None:
        raise ValueError(f"{who} requires y to be passed, but the target y is None")
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        import warnings
        from sklearn.exceptions import DataConversionWarning
        warnings.warn("A column-vector y was passed when a 1d array was expected; please change its shape "
                      "to (n_samples,), for example using ravel().", DataConversionWarning, stacklevel=3)
        y = y.ravel()
    return y


def decode_scores(f, loss, classes):
    """(labels in the user's encoding, probabilities or None) for decision values ``f``."""
    f = np.asarray(f, dtype=float)
    if classes is None:
        return f, None
    try:
        proba = loss.predict_proba(f)
    except AttributeError:
        proba = None
    if loss.name in BINARY_LOSSES:
        return np.asarray(classes)[(f >= 0).astype(int)], proba
    return np.asarray(classes)[np.argmax(f, axis=1)], proba


class SklearnAPIMixin:
    """score / save / load / pickling for VerticalADMM (see the module docstring)."""

    def __sklearn_tags__(self):
        """A classifier for the classification losses (binary ones: two classes only), a
        regressor for 'squared'; blocks may be sparse."""
        from sklearn.utils import ClassifierTags, RegressorTags
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        tags.input_tags.sparse = True
        if getattr(self, "loss", "logistic") == "squared":
            tags.estimator_type, tags.regressor_tags = "regressor", RegressorTags()
        else:
            tags.estimator_type = "classifier"
            tags.classifier_tags = ClassifierTags(multi_class=getattr(self, "loss", "") == "multinomial")
        return tags

    def score(self, X_blocks, y, sample_weight=None):
        """Accuracy for classification losses, R² for 'squared' (as scikit-learn's mixins)."""
        from sklearn.metrics import accuracy_score, r2_score
        pred = self.predict(X_blocks)
        if self.classes_ is None:
            return float(r2_score(y, pred, sample_weight=sample_weight))
        return float(accuracy_score(y, pred, sample_weight=sample_weight))

    def __getstate__(self):
        """Pickle the fitted model without the parties' blocks or the labels."""
        state = dict(self.__dict__)
        parties = state.get("_parties")
        if parties is not None:
            state["_private_mask_"] = [hasattr(p, "ledger") for p in parties]
        for key in _TRAINING_STATE:
            state.pop(key, None)
        if state.get("label_seed") is not None:
            state["label_seed"] = None   # the label owner's flip seed never leaves it
        return state

    def _released_decision(self, blocks):
        """Scores from the saved blocks: x_m, or a private party's released x̃ on normalized rows."""
        mask = getattr(self, "_private_mask_", None) or [False] * len(blocks)
        total = 0.0
        for D, x, private in zip(blocks, self.coef_, mask):
            if private:
                if x is None:
                    raise ValueError("a private party's model was never released; it cannot score rows")
                from ..privacy.party import normalize_rows   # noqa: only reached for private models
                D = normalize_rows(D)
            total = total + D @ x
        return total + self.intercept_

    # ------------------------------------------------------------- files
    def save(self, path):
        """Write the fitted model (coefficients, intercept, classes, parameters, history) to a
        versioned ``.npz``; no training data is written."""
        from ..model_io import save_estimator
        if not hasattr(self, "coef_"):
            raise AttributeError("this VerticalADMM is not fitted yet; call fit(X_blocks, y) before save")
        return save_estimator(path, self)

    @classmethod
    def load(cls, path):
        """A fitted estimator from :meth:`save` (``predict``/``decision_function``/``score`` work)."""
        from ..model_io import load_model
        from .losses import get_loss
        m = load_model(path)
        meta = m["meta"]
        if meta["kind"] != "estimator":
            raise ValueError(f"{path} holds a {meta['kind']!r} model, not a VerticalADMM estimator; "
                             "use flower_vfl.model_io.load_model for a party's or label owner's file")
        params = {k: v for k, v in meta["params"].items() if k in cls().get_params()}
        est = cls(**params)
        n = int(meta["n_blocks"])
        est.coef_ = [m[f"coef_{i}"] if f"coef_{i}" in m else None for i in range(n)]
        est.intercept_ = m["intercept"] if m["intercept"].ndim else float(m["intercept"])
        est.classes_ = None if meta["classes"] is None else np.asarray(meta["classes"])
        est.n_features_in_ = list(meta["n_features_in"])
        est.history_ = meta["history"]
        est.n_rounds_ = int(meta["n_rounds"])
        est.converged_ = bool(meta["converged"])
        est._private_mask_ = list(meta["private_mask"])
        est.loss_ = get_loss(params.get("loss", "logistic"))
        if est.loss_.name == "multinomial":
            est.loss_.classes_ = est.classes_
        return est


def estimator_meta(est) -> tuple[dict, dict]:
    """(arrays, meta) of a fitted estimator, for :func:`flower_vfl.model_io.save_estimator`."""
    params, text = {}, {}
    for k, v in est.get_params().items():
        if k == "label_seed":
            continue                 # the label owner's flip seed never leaves it (label_dp.py)
        try:
            json.dumps(v)
            params[k] = v
        except TypeError:
            text[k] = repr(v)        # privacy configs, callbacks: recorded as text, not restored
    parties = getattr(est, "_parties", None)
    mask = [hasattr(p, "ledger") for p in parties] if parties is not None else \
        list(getattr(est, "_private_mask_", None) or [False] * len(est.coef_))
    arrays = {f"coef_{i}": x for i, x in enumerate(est.coef_) if x is not None}
    arrays["intercept"] = np.asarray(est.intercept_, dtype=float)
    meta = {"kind": "estimator", "params": params, "params_text": text, "n_blocks": len(est.coef_),
            "private_mask": mask,
            "classes": None if est.classes_ is None else np.asarray(est.classes_).tolist(),
            "n_features_in": list(est.n_features_in_), "history": est.history_,
            "n_rounds": int(est.n_rounds_), "converged": bool(est.converged_)}
    return arrays, meta

