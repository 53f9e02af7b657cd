"""``BlockedVerticalADMM``: :class:`~flower_vfl.estimator.engine.VerticalADMM` on one matrix X
whose columns are declared party blocks, so scikit-learn's model selection works.

``GridSearchCV``, ``cross_val_score``, ``cross_validate`` and pipelines split X by rows; a list
of blocks has one "row" per party (scikit-learn reads two blocks as two samples). Here X is one
matrix and ``blocks`` says which columns each party holds; every method splits X with
:func:`~flower_vfl.estimator.sklearn_api.split_columns` and calls VerticalADMM unchanged, so
a fit on a fold equals ``VerticalADMM().fit([X[rows][:, cols_m] ...], y[rows])``.

    search = GridSearchCV(BlockedVerticalADMM(blocks=[66, 57], max_rounds=50),
                          {"lam": [1e-4, 1e-3, 1e-2]}, cv=3).fit(X, y)

``blocks`` defaults to 2 (two contiguous halves). A step that changes the number of columns
(one-hot, polynomial) goes inside: ``blocks=PartyColumnTransformer([66, 57], OneHotEncoder())``
fits each party's transformer on its own columns only and trains on the transformed blocks
(widths re-derived, ``block_widths_``). The class keeps scikit-learn's estimator contract
(tests/test_sklearn_contract.py runs ``check_estimator`` on every loss).

Private parties (docs/model-selection.md): each fit releases the party's block again, so
each fit charges the party's ledger. The in-process VerticalADMM keeps a ledger in memory,
new at every fit, which model selection (k folds x grid points + the refit) would silently
reset; here a private party needs ``privacy_ledger`` (a file every fit and every clone opens)
and each fit is one run in it, refused before any round once the budget
(``privacy_budget``, default the party's PrivacyConfig.epsilon) cannot cover its plan.
"""

from __future__ import annotations

import inspect
import uuid

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin, clone
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_array, check_is_fitted

from flower_vfl.estimator.engine import VerticalADMM, loss_has_proba
from flower_vfl.estimator.sklearn_api import column_blocks, split_columns

__all__ = ["BlockedVerticalADMM", "PartyColumnTransformer"]

#: the parameters this class adds to VerticalADMM's (the first three of its signature)
_OWN = ("blocks", "privacy_ledger", "privacy_budget")
#: their defaults (blocks=2: the columns split in two contiguous halves, two parties)
_OWN_DEFAULTS = {"blocks": 2, "privacy_ledger": None, "privacy_budget": None}


class PartyColumnTransformer(TransformerMixin, BaseEstimator):
    """Each party preprocesses its own columns: ``transformers`` fitted on party m's columns
    only (one-hot, polynomial, scaling ...), and the blocks' widths re-derived after the
    transform (``widths_``). As ``blocks`` of :class:`BlockedVerticalADMM` it makes the
    preprocessing part of the estimator, so GridSearchCV and pipelines refit it per fold:

        BlockedVerticalADMM(blocks=PartyColumnTransformer([3, 2], OneHotEncoder(handle_unknown="ignore")))

    Parameters
    ----------
    blocks : int or list, default=2
        The parties' columns of the raw X (:func:`~flower_vfl.estimator.sklearn_api.column_blocks`).
    transformers : transformer, list or None, default=None
        One transformer cloned for every party, or one per party (None or 'passthrough': the
        party's columns as they are); None: no preprocessing.

    Attributes
    ----------
    columns_ : list of ndarray
        Party m's columns of the raw X.
    transformers_ : list
        Party m's fitted transformer (None: passthrough).
    widths_ : list of int
        The width of party m's block after its transform (the blocks the model trains on).
    """

    def __init__(self, blocks=2, transformers=None):
        self.blocks = blocks
        self.transformers = transformers

    def __sklearn_tags__(self):
        """Sparse X is split into CSR blocks when every party's transformer takes sparse input;
        NaN is left to the parties' transformers (an imputer may be one)."""
        from sklearn.utils import get_tags
        tags = super().__sklearn_tags__()
        t = self.transformers
        steps = [s for s in (t if isinstance(t, (list, tuple)) else [t]) if s is not None and not isinstance(s, str)]
        tags.input_tags.sparse = all(get_tags(s).input_tags.sparse for s in steps)
        tags.input_tags.allow_nan = True
        return tags

    def _per_party(self, m):
        t = self.transformers
        if isinstance(t, (list, tuple)):
            if len(t) != len(self.columns_):
                raise ValueError(f"transformers has {len(t)} entries but blocks declares {len(self.columns_)} "
                                 "parties; give one transformer (or None) per party, or one for all")
            t = t[m]
        return None if t is None or (isinstance(t, str) and t == "passthrough") else clone(t)

    def fit(self, X, y=None):
        self.fit_transform_blocks(X, y)
        return self

    def fit_transform_blocks(self, X, y=None) -> list:
        """Fit each party's transformer on its own columns; return the transformed blocks."""
        X = check_array(X, accept_sparse="csr", dtype=None, ensure_all_finite=False)
        self.n_features_in_ = X.shape[1]
        self.columns_ = column_blocks(self.blocks, X.shape[1])
        self.transformers_, out = [], []
        for m, cols in enumerate(self.columns_):
            t = self._per_party(m)
            block = X[:, cols]
            out.append(block if t is None else t.fit_transform(block, y))
            self.transformers_.append(t)
        out = [_numeric(b, m) for m, b in enumerate(out)]
        self.widths_ = [b.shape[1] for b in out]
        return out

    def transform_blocks(self, X) -> list:
        """Party m's columns of X through its fitted transformer: the blocks the model scores."""
        check_is_fitted(self, "transformers_")
        X = check_array(X, accept_sparse="csr", dtype=None, ensure_all_finite=False)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but PartyColumnTransformer is expecting "
                             f"{self.n_features_in_} features as input")
        return [_numeric(X[:, c] if t is None else t.transform(X[:, c]), m)
                for m, (c, t) in enumerate(zip(self.columns_, self.transformers_))]

    def transform(self, X):
        blocks = self.transform_blocks(X)
        return sp.hstack(blocks, format="csr") if any(sp.issparse(b) for b in blocks) else np.hstack(blocks)


def _numeric(block, m):
    if sp.issparse(block):
        return sp.csr_matrix(block, dtype=float)
    return check_array(block, dtype="numeric", ensure_all_finite=False, input_name=f"party {m}'s block")


class BlockedVerticalADMM(VerticalADMM):
    """VerticalADMM taking one X (N x sum d_m) with declared column blocks.

    Parameters
    ----------
    blocks : int, list of int, list of range / slice / sequence of int, or PartyColumnTransformer, default=2
        Each party's columns of X: a number of parties (the columns split into that many
        contiguous blocks of near-equal width), widths in column order (``[66, 57]``) or
        explicit columns (``[range(0, 66), range(66, 123)]``); every column in exactly one block
        (:func:`~flower_vfl.estimator.sklearn_api.column_blocks`). A
        :class:`PartyColumnTransformer` declares the columns *and* each party's own
        preprocessing (one-hot, polynomial ...): it is fitted on every fit, and the blocks'
        widths are those after its transform (``block_widths_``).
    privacy_ledger : str, PathLike or None, default=None
        Only with private parties (``privacy``), and then required: the ``.sqlite`` file (or a
        folder for ``party.sqlite``) of the parties' ledgers, shared by every fit and every
        clone (GridSearchCV clones the estimator per fit; a path survives the copy, an
        in-memory ledger would not). Party m's releases are keyed ``in-process:m``.
    privacy_budget : float or None, default=None
        Each private party's total ε over every fit charging ``privacy_ledger`` (at its
        PrivacyConfig's δ and accountant); None: its PrivacyConfig.epsilon, which one fit
        spends entirely. For k-fold selection over G values, calibrate each fit with
        ``PrivacyConfig(epsilon=...)`` and set the total here; the ledger composes the fits.
    **VerticalADMM's parameters : see :class:`~flower_vfl.estimator.engine.VerticalADMM`.

    Every method taking ``X_blocks`` in VerticalADMM takes the one matrix ``X`` here.
    ``n_features_in_`` is X's number of columns (scikit-learn's meaning); ``block_widths_`` the
    parties' widths the model was trained on.
    """

    def __init__(self, blocks=2, privacy_ledger=None, privacy_budget=None, **params):
        super().__init__(**params)
        self.blocks = blocks
        self.privacy_ledger = privacy_ledger
        self.privacy_budget = privacy_budget

    # get_params / clone read the signature: VerticalADMM's parameters and the three above
    __init__.__signature__ = inspect.signature(VerticalADMM.__init__).replace(parameters=[
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(inspect.Parameter(k, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=_OWN_DEFAULTS[k]) for k in _OWN),
        *(p for name, p in inspect.signature(VerticalADMM.__init__).parameters.items() if name != "self")])

    def __sklearn_tags__(self):
        """VerticalADMM's; with ``blocks`` a PartyColumnTransformer, sparse X only when every
        party's transformer takes it."""
        tags = super().__sklearn_tags__()
        if isinstance(self.blocks, PartyColumnTransformer):
            from sklearn.utils import get_tags
            tags.input_tags.sparse = get_tags(self.blocks).input_tags.sparse
        return tags

    def _split(self, X):
        """X's columns as the declared blocks (through the parties' fitted transformers when
        ``blocks`` is a PartyColumnTransformer); blocks already split pass through (the inherited
        methods call each other with the blocks)."""
        check_is_fitted(self, "coef_")
        if isinstance(X, list) and len(X) == len(self.block_widths_) and all(getattr(b, "ndim", 0) == 2 for b in X):
            return X
        if getattr(self, "columns_", None) is not None:
            return self.columns_.transform_blocks(X)
        X = check_array(X, accept_sparse="csr", dtype="numeric")
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                             f"{self.n_features_in_} features as input")
        return split_columns(X, self.blocks)

    def fit(self, X, y):
        """Fit on the blocks of X (see VerticalADMM.fit)."""
        if isinstance(self.blocks, PartyColumnTransformer):
            self.columns_ = clone(self.blocks)
            blocks = self.columns_.fit_transform_blocks(X, y)
            n = self.columns_.n_features_in_
        else:
            self.columns_ = None
            X = check_array(X, accept_sparse="csr", dtype="numeric")
            blocks, n = split_columns(X, self.blocks), X.shape[1]
        super().fit(blocks, y)
        self.n_features_in_ = n
        return self

    def decision_function(self, X):
        return super().decision_function(self._split(X))

    def decision_function_nonprivate(self, X):
        return super().decision_function_nonprivate(self._split(X))

    def predict(self, X):
        return super().predict(self._split(X))

    @available_if(loss_has_proba)
    def predict_proba(self, X):
        return super().predict_proba(self._split(X))

    def objective(self, X, y):
        return super().objective(self._split(X), y)

    def save(self, path):
        """As VerticalADMM.save; a model whose ``blocks`` holds fitted transformers is refused
        (they are not written): pickle it instead."""
        if isinstance(self.blocks, PartyColumnTransformer):
            raise ValueError("save() writes coefficients, not the parties' fitted transformers of blocks="
                             "PartyColumnTransformer(...); pickle the estimator instead (pickle.dump)")
        return super().save(path)

    @classmethod
    def load(cls, path):
        est = super().load(path)
        est.n_features_in_ = int(sum(est.block_widths_))
        est.columns_ = None
        return est

    # score: SklearnAPIMixin.score calls self.predict(X), which splits X

    def _make_parties(self, blocks, penalty, constraint, loss):
        """VerticalADMM's parties; each private one then charges the shared ledger as one run."""
        parties = super()._make_parties(blocks, penalty, constraint, loss)
        private = [m for m, p in enumerate(parties) if hasattr(p, "ledger")]
        if not private:
            return parties
        if self.privacy_ledger is None:
            raise ValueError(
                f"privacy_ledger=None with private part{'y' if len(private) == 1 else 'ies'} {private}: every fit "
                "(each fold, each grid point, the refit) releases the private blocks again, and an in-memory ledger "
                "would start a fresh budget at each fit. Give privacy_ledger='ledger.sqlite' (one file every fit "
                "and clone charges) and privacy_budget= the total ε over all fits (docs/model-selection.md)")
        from flower_vfl.privacy.ledger import Budget, BudgetExceeded, Ledger
        from flower_vfl.privacy.store import PartyStore
        store, run = PartyStore(self.privacy_ledger), f"fit-{uuid.uuid4().hex}"
        for m in private:
            p, c = parties[m], parties[m].config
            total = c.epsilon if self.privacy_budget is None else float(self.privacy_budget)
            p.ledger = Ledger(store, f"in-process:{m}", Budget(total, c.delta, c.accountant), m,
                              {"kind": "BlockedVerticalADMM", "columns": int(blocks[m].shape[1])})
            p.run = run
            aff = p.affordability()
            if not aff["affordable"]:      # before any round: nothing of this fit is released
                from flower_vfl.privacy.accounting import epsilon_for_events
                plan = [(e.mechanism, e.noise_multiplier) for e in p.ledger.entries if e.noise_multiplier > 0]
                plan += [("gaussian", p.z)] * (c.train_rounds + c.eval_rounds)
                raise BudgetExceeded(m, round=1, kind="train", noise_multiplier=p.z,
                                     requested=epsilon_for_events(plan, c.delta, c.accountant),
                                     spent=aff["spent_before_run"], budget=total, delta=c.delta,
                                     method=c.accountant, releases=len(p.ledger.entries))
        return parties
