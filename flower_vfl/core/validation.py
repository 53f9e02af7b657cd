"""Input checks shared by the in-process engine and the Flower apps (errors name the fix).

The estimator's and the strategies' *arguments* are checked by the one parameter table
(:data:`flower_vfl.config.schema.PARAMS`); here only the data: the parties' blocks and labels.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from flower_vfl.errors import UserError

__all__ = ["InputError", "InputTypeError", "MAX_ABS_VALUE", "check_block", "check_blocks", "check_labels",
           "encode_test_labels"]

#: the largest |entry| of a block accepted: beyond it D^T D and D x lose every digit or overflow
#: in float64 (1e200 squares to inf); standardized or raw-unit columns are far below it
MAX_ABS_VALUE = 1e15


class InputError(UserError, ValueError):
    """A party block or a label vector the engine cannot use (names it and the fix)."""


class InputTypeError(UserError, TypeError):
    """A block given in a form the engine does not take (a single matrix, an object array)."""


def check_block(D, name="block"):
    """Return D as a float ndarray or CSR matrix; reject object and complex dtypes, empty,
    non-2-D, non-finite blocks and entries beyond +-:data:`MAX_ABS_VALUE`."""
    dtype = D.dtype if (sp.issparse(D) or isinstance(D, np.ndarray)) else np.asarray(D).dtype
    if dtype.kind == "O":
        raise InputTypeError(f"{name} has dtype object; the engine takes numeric blocks only: convert it first, "
                             "e.g. np.asarray(block, dtype=float) after encoding any categorical column "
                             "(or BlockedVerticalADMM, which converts as scikit-learn does)")
    if dtype.kind == "c":
        raise InputError(f"{name} has complex dtype {dtype}; complex data is not supported: pass the real "
                         "features (e.g. np.real(block) and np.imag(block) as separate columns)")
    if dtype.kind not in "biuf":
        raise InputTypeError(f"{name} has dtype {dtype}; expected a numeric (bool, integer or float) block")
    if sp.issparse(D):
        D = sp.csr_matrix(D, dtype=float)
        data = D.data
    else:
        D = np.asarray(D, dtype=float)
        if D.ndim == 1:
            raise InputError(f"{name} must be 2-D (N x d_m); got a 1-D array. Use x.reshape(-1, 1) "
                             "for a single feature.")
        if D.ndim != 2:
            raise InputError(f"{name} must be 2-D (N x d_m); got shape {D.shape}")
        data = D
    if D.shape[0] == 0 or D.shape[1] == 0:
        raise InputError(f"{name} is empty (shape {D.shape}); every party needs at least one row "
                         "and one column")
    if not np.all(np.isfinite(data)):
        bad = int(np.size(data) - np.count_nonzero(np.isfinite(data)))
        raise InputError(f"{name} contains {bad} NaN or inf value(s); impute or drop them first")
    big = float(np.max(np.abs(data))) if np.size(data) else 0.0
    if big > MAX_ABS_VALUE:
        raise InputError(f"{name} has an entry of magnitude {big:.3g}; expected |value| <= {MAX_ABS_VALUE:g} "
                         "(larger values overflow the float64 products of the x-update): standardize the "
                         "columns first, e.g. sklearn.preprocessing.StandardScaler")
    return D


def check_blocks(X_blocks, n_rows=None):
    if isinstance(X_blocks, np.ndarray) or sp.issparse(X_blocks):
        raise InputTypeError("X_blocks must be a list of per-party arrays (one N x d_m block per party), "
                             "not a single matrix; split the columns, e.g. [X[:, :66], X[:, 66:]]")
    blocks = [check_block(D, f"X_blocks[{m}]") for m, D in enumerate(X_blocks)]
    if not blocks:
        raise InputError("X_blocks is empty; pass at least one party block")
    rows = [D.shape[0] for D in blocks]
    if len(set(rows)) != 1:
        raise InputError(f"all blocks must have the same rows (aligned samples); got row counts "
                         f"{rows}. Align the parties on a common sample ID first")
    if n_rows is not None and rows[0] != n_rows:
        raise InputError(f"blocks have {rows[0]} rows but y has {n_rows}; they must be aligned")
    return blocks


def check_labels(y, name="y", loss=None):
    """Refuse NaN or inf in numeric labels (any loss: a NaN target of 'squared' would turn every
    iterate into NaN without an error), naming how many and the fix."""
    y = np.asarray(y)
    if y.dtype.kind in "fc" and not np.all(np.isfinite(y)):
        bad = int(y.size - np.count_nonzero(np.isfinite(y)))
        raise InputError(f"{name} contains {bad} NaN or inf value(s)"
                         f"{'' if loss is None else f' (loss={loss!r})'}; drop those rows (from every party's "
                         "block too) or impute the labels first")
    if y.dtype.kind == "c":
        raise InputError(f"{name} has complex dtype {y.dtype}; labels must be real numbers or class labels")
    return y


def encode_test_labels(loss, y_test):
    """``y_test`` encoded as the training labels were (``loss.encode_labels`` already ran on them):
    for 'multinomial' one column per *training* class (held-out labels that lack a class give
    it a zero column; a class never seen in training is refused, naming it), any other loss as
    ``loss.encode_labels``."""
    if getattr(loss, "name", "") != "multinomial" or getattr(loss, "classes_", None) is None:
        return loss.encode_labels(y_test)
    y_test, classes = np.asarray(y_test), np.asarray(loss.classes_)
    if y_test.ndim != 1:
        raise InputError(f"y_test must be 1-D class labels for loss='multinomial'; got shape {y_test.shape}")
    unseen = np.setdiff1d(np.unique(y_test), classes)
    if unseen.size:
        raise InputError(f"y_test holds class(es) {unseen[:5].tolist()} that y_train does not (training classes "
                         f"{classes.tolist()[:10]}); the model cannot score them: drop those held-out rows or "
                         "give training rows of every class")
    onehot = np.zeros((y_test.size, classes.size))
    onehot[np.arange(y_test.size), np.searchsorted(classes, y_test)] = 1.0
    return onehot
