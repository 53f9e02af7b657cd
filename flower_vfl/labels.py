"""Class encoding shared by the estimator and the label owner's saved model (no Flower imports).

A binary loss works on t in {-1, +1}; users' labels are anything with two values (0/1,
'no'/'yes', -1/1). ``classes`` are the sorted original labels, ``classes[1]`` the positive
class (as in scikit-learn), so ``predict`` returns the user's own labels.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BINARY_LOSSES", "encode_classes", "decode_scores"]

BINARY_LOSSES = ("logistic", "hinge", "sigmoid")


def encode_classes(y, loss_name: str):
    """``(y_for_the_loss, classes)``; classes is None for regression ('squared')."""
    y = np.asarray(y)
    if loss_name == "squared":
        return y.astype(float), None
    if loss_name not in BINARY_LOSSES:          # multinomial keeps its own encoding
        return y, np.unique(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D for loss={loss_name!r}; got shape {y.shape}")
    classes = np.unique(y)
    if classes.size != 2:
        raise ValueError(f"loss={loss_name!r} needs exactly 2 classes; got {classes.size} "
                         f"({classes[:5].tolist()}{'...' if classes.size > 5 else ''}). Use loss='multinomial' "
                         "for more classes or loss='squared' for regression")
    return np.where(y == classes[1], 1.0, -1.0), classes


def decode_scores(f, loss, classes):
    """(predicted labels in the original encoding, probabilities or None) for scores f."""
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
