"""What makes :class:`~flower_vfl.estimator.engine.VerticalADMM` behave like a scikit-learn estimator.

Class encoding (the user's own labels in ``classes_``, ``predict`` returning them), ``score``,
``save``/``load`` without the training data, and pickles that drop the parties' blocks.
``get_params``/``set_params``/``clone`` come from :class:`sklearn.base.BaseEstimator`.
No Flower imports.
"""

from __future__ import annotations

import json

import numpy as np

__all__ = ["BINARY_LOSSES", "encode_classes", "decode_scores", "check_target", "SklearnAPIMixin"]

from flower_vfl.core.scoring import BINARY_LOSSES, check_target, decode_scores, encode_classes  # noqa: F401
from flower_vfl.core.scoring import released_scores

#: state that holds training data (the parties' blocks, the labels): never pickled or saved
_TRAINING_STATE = ("_parties", "_central")


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
        if state.get("_parties") is not None:
            state["_private_mask_"] = self._private_mask()
        for key in _TRAINING_STATE:
            state.pop(key, None)
        if state.get("label_seed") is not None:
            state["label_seed"] = None   # the label owner's flip seed never leaves it
        return state

    def _private_mask(self) -> list[bool]:
        """Per block, whether its party was private (from the parties in memory, else as saved)."""
        parties = getattr(self, "_parties", None)
        if parties is not None:
            return [hasattr(p, "ledger") for p in parties]
        return list(getattr(self, "_private_mask_", None) or [False] * len(self.coef_))

    def _released_decision(self, blocks):
        """Decision values from the released blocks ``coef_`` (x_m, or a private party's x̃ on
        normalized rows: :func:`~flower_vfl.core.scoring.released_scores`), the same in memory,
        after :meth:`load` and after unpickling."""
        return sum(released_scores(D, x, private)
                   for D, x, private in zip(blocks, self.coef_, self._private_mask())) + self.intercept_

    # ------------------------------------------------------------- files
    def save(self, path):
        """Write the fitted model (coefficients, intercept, classes, parameters, history) to a
        versioned ``.npz``; no training data is written."""
        from flower_vfl.io.model_files import _write
        if not hasattr(self, "coef_"):
            raise AttributeError("this VerticalADMM is not fitted yet; call fit(X_blocks, y) before save")
        arrays, meta = estimator_meta(self)
        return _write(path, arrays, meta)

    @classmethod
    def load(cls, path):
        """A fitted estimator from :meth:`save` (``predict``/``decision_function``/``score`` work)."""
        from flower_vfl.io.model_files import load_model
        from flower_vfl.core.losses import get_loss
        m = load_model(path)
        meta = m["meta"]
        if meta["kind"] != "estimator":
            raise ValueError(f"{path} holds a {meta['kind']!r} model, not a VerticalADMM estimator; "
                             "use flower_vfl.io.model_files.load_model for a party's or label owner's file")
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
    """(arrays, meta) of a fitted estimator, written by :meth:`SklearnAPIMixin.save`."""
    params, text = {}, {}
    for k, v in est.get_params().items():
        if k == "label_seed":
            continue                 # the label owner's flip seed never leaves it (label_dp.py)
        try:
            json.dumps(v)
            params[k] = v
        except TypeError:
            text[k] = repr(v)        # privacy configs, callbacks: recorded as text, not restored
    mask = est._private_mask()
    arrays = {f"coef_{i}": x for i, x in enumerate(est.coef_) if x is not None}
    arrays["intercept"] = np.asarray(est.intercept_, dtype=float)
    meta = {"kind": "estimator", "params": params, "params_text": text, "n_blocks": len(est.coef_),
            "private_mask": mask,
            "classes": None if est.classes_ is None else np.asarray(est.classes_).tolist(),
            "n_features_in": list(est.n_features_in_), "history": est.history_,
            "n_rounds": int(est.n_rounds_), "converged": bool(est.converged_)}
    return arrays, meta

