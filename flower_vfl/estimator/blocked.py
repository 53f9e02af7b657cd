"""``BlockedVerticalADMM``: :class:`~flower_vfl.estimator.engine.VerticalADMM` on one matrix X
whose columns are declared party blocks, so scikit-learn's model selection works.

``GridSearchCV``, ``cross_val_score``, ``cross_validate`` and pipelines split X by rows; a list
of blocks has one "row" per party (scikit-learn reads two blocks as two samples). Here X is one
matrix and ``blocks`` says which columns each party holds; every method splits X with
:func:`~flower_vfl.estimator.sklearn_api.split_columns` and calls VerticalADMM unchanged, so
a fit on a fold equals ``VerticalADMM().fit([X[rows][:, cols_m] ...], y[rows])``.

    search = GridSearchCV(BlockedVerticalADMM(blocks=[66, 57], max_rounds=50),
                          {"lam": [1e-4, 1e-3, 1e-2]}, cv=3).fit(X, y)

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

from flower_vfl.estimator.engine import VerticalADMM
from flower_vfl.estimator.sklearn_api import split_columns

__all__ = ["BlockedVerticalADMM"]

#: the parameters this class adds to VerticalADMM's (the first three of its signature)
_OWN = ("blocks", "privacy_ledger", "privacy_budget")


class BlockedVerticalADMM(VerticalADMM):
    """VerticalADMM taking one X (N x sum d_m) with declared column blocks.

    Parameters
    ----------
    blocks : list of int, or list of range / slice / sequence of int
        Each party's columns of X: widths in column order (``[66, 57]``) or explicit columns
        (``[range(0, 66), range(66, 123)]``); every column in exactly one block
        (:func:`~flower_vfl.estimator.sklearn_api.column_blocks`). Required.
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
    """

    def __init__(self, blocks=None, privacy_ledger=None, privacy_budget=None, **params):
        super().__init__(**params)
        self.blocks = blocks
        self.privacy_ledger = privacy_ledger
        self.privacy_budget = privacy_budget

    # get_params / clone read the signature: VerticalADMM's parameters and the three above
    __init__.__signature__ = inspect.signature(VerticalADMM.__init__).replace(parameters=[
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(inspect.Parameter(k, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for k in _OWN),
        *(p for name, p in inspect.signature(VerticalADMM.__init__).parameters.items() if name != "self")])

    def _split(self, X):
        """X's columns as the declared blocks; blocks already split pass through (the inherited
        methods call each other with the blocks)."""
        if isinstance(X, list) and len(X) == len(self.blocks) and all(getattr(b, "ndim", 0) == 2 for b in X):
            return X
        return split_columns(X, self.blocks)

    def fit(self, X, y):
        """Fit on the blocks of X (see VerticalADMM.fit)."""
        return super().fit(split_columns(X, self.blocks), y)

    def decision_function(self, X):
        return super().decision_function(self._split(X))

    def decision_function_nonprivate(self, X):
        return super().decision_function_nonprivate(self._split(X))

    def predict(self, X):
        return super().predict(self._split(X))

    def predict_proba(self, X):
        return super().predict_proba(self._split(X))

    def objective(self, X, y):
        return super().objective(self._split(X), y)

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
