"""What makes :class:`~flower_vfl.estimator.engine.VerticalADMM` behave like a scikit-learn estimator.

Class encoding (the user's own labels in ``classes_``, ``predict`` returning them), ``score``,
``save``/``load`` without the training data, and pickles that drop the parties' blocks.
``get_params``/``set_params``/``clone`` come from :class:`sklearn.base.BaseEstimator`.
:func:`column_blocks` / :func:`split_columns` turn one matrix X and a declaration of the
parties' columns into the list of blocks (:class:`~flower_vfl.estimator.blocked.BlockedVerticalADMM`,
the estimator scikit-learn's model selection can split by rows). No Flower imports.
"""

from __future__ import annotations

import json

import numpy as np

__all__ = ["BINARY_LOSSES", "encode_classes", "decode_scores", "check_target", "SklearnAPIMixin",
           "column_blocks", "split_columns"]

from flower_vfl.core.scoring import BINARY_LOSSES, check_target, decode_scores, encode_classes  # noqa: F401
from flower_vfl.core.scoring import released_scores
from flower_vfl.core.losses import loss_class

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
        kind = loss_class(getattr(self, "loss", "logistic"))     # None: a name fit refuses
        if kind is not None and kind.label_kind == "real":
            tags.estimator_type, tags.regressor_tags = "regressor", RegressorTags()
        else:
            tags.estimator_type = "classifier"
            tags.classifier_tags = ClassifierTags(multi_class=kind is not None and kind.multiclass)
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
        from flower_vfl.io.model_files import write_model_file
        if not hasattr(self, "coef_"):
            raise AttributeError("this VerticalADMM is not fitted yet; call fit(X_blocks, y) before save")
        arrays, meta = estimator_meta(self)
        return write_model_file(path, arrays, meta)

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
        est.block_widths_ = list(meta["n_features_in"])
        est.history_ = meta["history"]
        est.n_rounds_ = int(meta["n_rounds"])
        est.converged_ = bool(meta["converged"])
        est._private_mask_ = list(meta["private_mask"])
        est.loss_ = get_loss(params.get("loss", "logistic"))
        if est.loss_.multiclass:
            est.loss_.classes_ = est.classes_
        return est


def column_blocks(blocks, n_features: int) -> list[np.ndarray]:
    """The column indices of each party's block in a matrix of ``n_features`` columns.

    ``blocks`` is a number of parties k (the columns in order, split into min(k, n_features)
    contiguous blocks of near-equal width: ``2`` on 123 columns is 0-61 and 62-122), the
    blocks' widths in column order (``[66, 57]``: columns 0-65 and 66-122) or one column
    selection per block (``[range(0, 66), range(66, 123)]``, slices or integer sequences).
    Every column belongs to exactly one block: a column left out or given twice is an error
    naming it."""
    if isinstance(blocks, (int, np.integer)) and not isinstance(blocks, bool):
        if blocks < 1:
            raise ValueError(f"blocks={blocks!r}: give a number of parties >= 1, the widths ([66, 57]) or the "
                             "columns of each party ([range(0, 66), range(66, 123)])")
        return [np.asarray(c) for c in np.array_split(np.arange(n_features), min(int(blocks), n_features))]
    if blocks is None:
        raise ValueError("blocks=None: declare each party's columns of X, e.g. blocks=[66, 57] (widths in column "
                         "order) or blocks=[range(0, 66), range(66, 123)]")
    if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__len__") or len(blocks) == 0:
        raise ValueError(f"blocks={blocks!r}: give a non-empty list, one entry per party (a width such as 66, "
                         "or its columns such as range(0, 66))")
    widths = [isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in blocks]
    if all(widths):
        sizes = [int(b) for b in blocks]
        if min(sizes) < 1 or sum(sizes) != n_features:
            raise ValueError(f"blocks={sizes} declares widths summing to {sum(sizes)}, but X has {n_features} "
                             "columns; give one width >= 1 per party, summing to X's columns")
        edges = np.cumsum([0] + sizes)
        return [np.arange(a, b) for a, b in zip(edges[:-1], edges[1:])]
    if any(widths):
        raise ValueError(f"blocks={blocks!r} mixes widths and column selections; give only widths "
                         "([66, 57]) or only selections ([range(0, 66), range(66, 123)])")
    out, owner = [], {}
    for m, b in enumerate(blocks):
        idx = np.arange(n_features)[b] if isinstance(b, slice) else np.asarray(list(b))
        if idx.size == 0 or idx.dtype.kind not in "iu":
            raise ValueError(f"blocks[{m}]={b!r} selects no columns or not integer columns; give a range, "
                             "a slice or a list of column numbers")
        bad = idx[(idx < 0) | (idx >= n_features)]
        if bad.size:
            raise ValueError(f"blocks[{m}] selects column {int(bad[0])}, but X has columns 0..{n_features - 1}")
        for j in idx.tolist():
            if j in owner:
                raise ValueError(f"column {j} is in blocks[{owner[j]}] and blocks[{m}]; a column belongs "
                                 "to one party")
            owner[j] = m
        out.append(idx)
    missing = sorted(set(range(n_features)) - set(owner))
    if missing:
        raise ValueError(f"column(s) {missing[:5]}{'...' if len(missing) > 5 else ''} of X are in no block; "
                         "every column must belong to a party (drop unused columns from X first)")
    return out


def split_columns(X, blocks) -> list:
    """X (an array, a DataFrame or a sparse matrix with one column per feature) split into the
    parties' blocks declared by ``blocks`` (:func:`column_blocks`)."""
    from sklearn.utils.validation import check_array
    X = check_array(X, accept_sparse="csr", dtype="numeric")
    return [X[:, idx] for idx in column_blocks(blocks, X.shape[1])]


def estimator_meta(est) -> tuple[dict, dict]:
    """(arrays, meta) of a fitted estimator, written by :meth:`SklearnAPIMixin.save`."""
    params, text = {}, {}
    for k, v in est.get_params().items():
        if k == "label_seed":
            continue                 # the label owner's flip seed never leaves it (label_dp.py)
        if k == "blocks" and v is not None and not isinstance(v, (int, np.integer)) and \
                not all(isinstance(b, (int, np.integer)) for b in v):
            v = [idx.tolist() for idx in column_blocks(v, sum(getattr(est, "block_widths_", est.n_features_in_)))]
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
            "n_features_in": list(getattr(est, "block_widths_", est.n_features_in_)), "history": est.history_,
            "n_rounds": int(est.n_rounds_), "converged": bool(est.converged_)}
    return arrays, meta

