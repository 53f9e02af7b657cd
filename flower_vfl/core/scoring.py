"""One scoring path for the estimator, the evaluation rounds during training and the ``predict`` job.

* a party (:func:`released_scores`): its score contribution from its released block on a set
  of rows. A non-private party's block is x_m and its contribution ``D_m x_m``; a private
  party's block is its released x̃, fitted on row-normalized rows, so the rows are normalized
  the same way (:func:`normalize_rows`) first; scoring is post-processing of x̃, free. Every
  scoring site calls it: the estimator's ``decision_function`` (in memory, after ``load`` or
  unpickling), the party's evaluate handler (held-out rows) and the predict handler (scoring
  rows, x_m from the saved model file). :func:`party_scores` is the same function under its
  older name.
* the label owner (:func:`combine`): ``f = sum_m D_m x_m + b`` over the named parties (a
  missing one is an error, never a zero). The strategy's ``aggregate_evaluate`` and
  :func:`flower_vfl.strategies.own_data.predict` both call it; the predict job then decodes
  classes and probabilities with :func:`decode_scores`, as the
  estimator does.

Who may ask for what (a private party refuses evaluation before its final update, releases x̃
once and stores it) stays in the party's handler; this module holds no state and no Flower
imports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import scipy.sparse as sp

from flower_vfl.errors import PartyMissing

__all__ = ["normalize_rows", "released_scores", "party_scores", "combine", "BINARY_LOSSES", "encode_classes", "check_target",
           "decode_scores"]


def normalize_rows(D):
    """Scale every non-zero row to unit L2 norm (Assumption 2.3)."""
    if sp.issparse(D):
        D = sp.csr_matrix(D, dtype=float)
        norms = np.sqrt(np.asarray(D.multiply(D).sum(axis=1)).ravel())
        norms[norms == 0] = 1.0
        return sp.diags(1.0 / norms) @ D
    D = np.asarray(D, dtype=float)
    norms = np.linalg.norm(D, axis=1)
    norms[norms == 0] = 1.0
    return D / norms[:, None]


def released_scores(D_rows, x, private: bool = False) -> np.ndarray:
    """One party's contribution to the scores of ``D_rows``, from its released block, as float64.

    ``D_rows``: the party's preprocessed rows to score (dense or sparse), in the aligned order;
    ``x``: its released block: x_m of a non-private party (``D_rows @ x``), or the released x̃
    of a private party (``private=True``: ``normalize_rows(D_rows) @ x``, as in training).
    A private party that never released its block (``x is None``) cannot score rows.
    """
    if x is None:
        raise ValueError("a private party's model was never released; it cannot score rows")
    if private:
        D_rows = normalize_rows(D_rows)
    return np.asarray(D_rows @ np.asarray(x), dtype=float)


#: the older name of :func:`released_scores` (the party handlers call it)
party_scores = released_scores


def combine(parts: Mapping[int, np.ndarray], intercept, parties: Iterable[int], what: str = "scores") -> np.ndarray:
    """``f = sum_m parts[m] + intercept`` over ``parties`` (in party order).

    Raises :class:`~flower_vfl.errors.PartyMissing` naming every party in ``parties`` without
    a contribution: a score without one party's block is not the model's score.
    """
    parties = sorted(int(m) for m in parties)
    missing = [m for m in parties if m not in parts]
    if missing:
        raise PartyMissing(f"part{'ies' if len(missing) > 1 else 'y'} {missing} returned no {what}; the score "
                           "needs every party's block (no zero-filling): restart their SuperNodes and run again")
    f = sum(parts[m] for m in parties)
    return f + intercept


# ------------------------------------------------ labels and classes (estimator and predict job)
BINARY_LOSSES = ("logistic", "hinge", "sigmoid", "logistic_rr")   # logistic_rr: core/label_noise.py


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
