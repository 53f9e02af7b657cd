"""Several private parties that beat one party alone: SSP releases stacked by the label owner.

Issue 21 item 2; the route, its numbers and its limits are in docs/privacy_parties.md.

1. The label owner sends every private party the same target v = kappa (t - pi) (t in {0, 1}
   its training labels, pi their mean, kappa = c_v / max(pi, 1 - pi) so v fills the clip).
2. Each party makes one release (:class:`~flower_vfl.privacy.ssp.SSPParty`): its ridge fit
   x~_m of v on its own block from Gaussian-perturbed sufficient statistics, and x~_m^T g~_m.
   That is the party's whole privacy cost (its own ledger, one Gaussian release).
3. The label owner combines the released scores s_m = D_m x~_m (post-processing of x~_m, free)
   with weights from a closed-form LDA calibration (:func:`lda_calibration`). Its inputs are
   the label mean pi, the released scalars x~_m^T g~_m (they give sum_i (t_i - pi) s_mi over
   the training rows) and the first and second moments of the scores over rows the parties
   score anyway (prediction rows, no labels). The weights correct each party's scale and the
   double counting of what the parties' features share (the cross moment of their scores).

No training-row score of a private party is ever released and no label of a scored row is used.
Only public APIs are used (no change to the ADMM engine).
"""

from __future__ import annotations

import numpy as np

from flower_vfl.core.validation import check_blocks
from flower_vfl.privacy.party import PrivacyConfig
from flower_vfl.privacy.ssp import DEFAULT_RIDGE, SSPParty, calibrate_scores, lda_calibration, stacking_target

__all__ = ["StackedPrivateParties", "lda_calibration"]
# the label owner's math (target, calibration) is in flower_vfl.privacy.ssp, shared with the Flower
# strategy flower_vfl.strategies.stacked_ssp: the two paths call the same functions


def binary_targets(model, blocks, y):
    """Check ``model.privacy`` (one PrivacyConfig per block) and the binary ``y``; set
    ``classes_``, ``n_train_`` and ``pi_`` on ``model`` and return t (1.0 for classes_[1])."""
    if model.privacy is None or len(model.privacy) != len(blocks) or \
            not all(isinstance(c, PrivacyConfig) for c in model.privacy):
        raise ValueError(f"privacy must list one PrivacyConfig per block ({len(blocks)} blocks); got "
                         f"{model.privacy!r}")
    y = np.asarray(y)
    model.classes_ = np.unique(y)
    if model.classes_.size != 2:
        raise ValueError(f"y has {model.classes_.size} classes; this route is binary")
    t = (y == model.classes_[1]).astype(float)
    model.n_train_ = t.size
    model.pi_ = float(t.mean())
    return t


def seeded_config(cfg: PrivacyConfig, random_state, m: int) -> PrivacyConfig:
    """Party m's config with the in-process experiments' seed ``random_state * 1000 + m``, unless
    it has a seed of its own (or ``random_state`` is None)."""
    if cfg.seed is None and random_state is not None:
        import dataclasses
        return dataclasses.replace(cfg, seed=int(random_state) * 1000 + m)
    return cfg


class StackedPrivateParties:
    """Binary logistic model over vertically split private parties (the label owner has labels only).

    Parameters
    ----------
    privacy : list of PrivacyConfig
        One per party (every party is private); see :class:`~flower_vfl.privacy.ssp.SSPParty`.
        Set ``c_v`` (the target clip): the PrivacyConfig default 10 is the ADMM route's and makes
        the SSP noise ~7x larger than c_v = 1.5, the value chosen on a9a's training set
        (docs/privacy_parties.md).
    ridge : float
        The parties' post-processing ridge multiplier (lam' = ridge sigma sqrt(d_m)).
    random_state : int or None
        Seeds the parties' noise (in-process experiments only), party m: random_state * 1000 + m,
        unless its PrivacyConfig has a seed.

    Attributes (after fit / calibrate)
    ----------
    coef_ : list of ndarray         the released x~_m
    weights_ : ndarray (M,)         the label owner's weight of each party's scores
    intercept_ : float
    classes_ : ndarray (2,)         classes_[1] is the positive class
    """

    def __init__(self, privacy, ridge=DEFAULT_RIDGE, random_state=None):
        self.privacy = privacy
        self.ridge = ridge
        self.random_state = random_state

    def fit(self, X_blocks, y, calibration_blocks):
        """Each party's one release, then the calibration on ``calibration_blocks`` (unlabelled rows)."""
        blocks = check_blocks(X_blocks, n_rows=np.shape(y)[0])
        t = binary_targets(self, blocks, y)
        self._parties, self._kappa, self._xg = [], [], []
        for m, (D, cfg) in enumerate(zip(blocks, self.privacy)):
            cfg = seeded_config(cfg, self.random_state, m)
            party = SSPParty(D, cfg, ridge=self.ridge, party_id=m)
            v, kappa = stacking_target(t, cfg.c_v)
            _, xg = party.release(1, v)
            self._parties.append(party)
            self._kappa.append(kappa)
            self._xg.append(xg)
        self.coef_ = [p.x_released for p in self._parties]
        self.n_features_in_ = [p.d for p in self._parties]
        return self.calibrate(calibration_blocks)

    def party_scores(self, X_blocks):
        """(n, M) scores D_m x~_m of the given rows: post-processing of the released models."""
        blocks = check_blocks(X_blocks)
        if [b.shape[1] for b in blocks] != self.n_features_in_:
            raise ValueError(f"blocks have widths {[b.shape[1] for b in blocks]}; the model was fitted on "
                             f"widths {self.n_features_in_}")
        return np.column_stack([p.predict(b) for p, b in zip(self._parties, blocks)])

    def calibrate(self, calibration_blocks):
        """Set ``weights_`` and ``intercept_`` from unlabelled rows (free: scores of x~ and pi)."""
        S = self.party_scores(calibration_blocks)
        self.weights_, self.intercept_ = calibrate_scores(S, self._xg, self._kappa, self.n_train_, self.pi_)
        return self

    def decision_function(self, X_blocks):
        return self.party_scores(X_blocks) @ self.weights_ + self.intercept_

    def predict(self, X_blocks):
        return np.where(self.decision_function(X_blocks) >= 0, self.classes_[1], self.classes_[0])

    def predict_proba(self, X_blocks):
        p = 1.0 / (1.0 + np.exp(-self.decision_function(X_blocks)))
        return np.column_stack([1 - p, p])

    def privacy_report(self):
        """Each party's own report, its ledger's totals included."""
        return [p.report() for p in getattr(self, "_parties", [])]
