"""A private party that releases one noisy label moment g~ = D^T v + N(0, sigma^2 I) (issue 21 item 3).

No Flower imports. Used by :mod:`flower_vfl.estimator.moment_route`; the route, its derivation and
its numbers are in docs/privacy_parties.md.

Why one moment is enough for a joint logistic fit. The score equation of L2 logistic regression,

    (1/N) sum_i D_i (p(f_i) - t_i) + lam x = 0,       f_i = sum_m D_mi x_m + b,

splits into a part linear in the labels, (1/N) D_m^T (t - pi) for each party m, and a part that
does not involve labels at all, (1/N) sum_i D_i (p(f_i) - pi): an average over the rows' features
only. The route estimates the label-free part on unlabelled rows that the parties score anyway
(prediction rows: the "pool"), and the label part from one release per party:

    g~_m = D_m^T v + N(0, sigma^2 I_{d_m}),     v = clip(kappa (t - pi), -c_v, c_v),

the target v sent by the label owner (a function of the labels only, as the stacked route's).

Sensitivity (sample-level relation: one row of D_m replaced, both rows of norm <= 1, v fixed by
the transcript): the release changes by v_i (a - b), so ||v_i (a - b)|| <= c_v ||a - b|| <= 2 c_v,
C = 2 c_v, and sigma = z C with z from the party's accountant for one release at its (epsilon,
delta). The party clips v itself, so a server sending a larger target cannot raise C. Everything
after the noise (the fit on the pool, every score) is post-processing. Each party adds its whole
noise to its own coordinates: the guarantee holds against a server colluding with any other party
(the strict model). There is no cross-party sum in this release, so distributed noise has nothing
to share here (docs/privacy_parties.md).
"""

from __future__ import annotations

import math

import numpy as np

from flower_vfl.privacy.ssp import OneReleaseParty

__all__ = ["MomentParty", "moment_sensitivity", "UNIT"]

#: the neighbouring relation this party protects (kept in every ledger entry)
UNIT = "moment:row"


def moment_sensitivity(c_v: float) -> float:
    """L2 sensitivity of D^T v when one row of norm <= 1 is replaced and |v_i| <= c_v: 2 c_v."""
    if not (isinstance(c_v, (int, float)) and math.isfinite(c_v) and c_v > 0):
        raise ValueError(f"c_v must be a finite number > 0; got c_v={c_v!r}")
    return 2.0 * float(c_v)


class MomentParty(OneReleaseParty):
    """One private party: one release of its noisy label moment per run, charged in its own ledger.

    Parameters
    ----------
    D : (N, d) array or sparse matrix
        The party's training block (rows normalized here).
    config : PrivacyConfig
        ``epsilon``, ``delta``, ``accountant``, ``c_v`` (the clip of the target) and ``seed``
        (in-process experiments only) are used; ``calibration='strict'``, ``noise_form='output'``,
        ``train_rounds=0`` and ``eval_rounds=1`` are required (one release, no iterate, no ball).
    party_id, store, run, source, about :
        As for :class:`~flower_vfl.privacy.ssp.SSPParty` (the ledger's key is the declared source;
        ``None``: ``in-process:<party_id>`` in an in-memory store).
    """

    WHAT, TAG, RELEASE = "a moment party", "moment", "moment"
    UNIT = UNIT
    _sensitivity = staticmethod(moment_sensitivity)

    def statistic(self, v):
        """The noise-free D^T clip(v) (for tests and audits; never sent)."""
        return np.asarray(self.D.T @ self._check_target(v), dtype=float).ravel()

    def _payload(self, v, rng):
        """g~ = D^T v + N(0, sigma^2 I): what :meth:`release` sends."""
        g = np.asarray(self.D.T @ v, dtype=float).ravel()
        return {"g_tilde": g + self.sigma * rng.standard_normal(self.d)}

    def _unpack(self, payload):
        self._answer = np.asarray(payload["g_tilde"], float)
        return self._answer

    @property
    def g_released(self):
        """The released g~ (None before the release)."""
        if self._answer is None:
            ans = self.ledger.last_answer(self.run, "eval")
            if ans is not None:
                self._unpack(ans.payload)
        return self._answer

    def report(self) -> dict:
        """What the party tells the label owner and the run report (no data, no noise seed)."""
        return self._report("Gaussian on the label moment D^T v (one release)",
                            "features of each training row of this party (row-level DP), against a server "
                            "colluding with any other party (each party adds its whole noise)",
                            "labels (the target is a function of them); the rows of the unlabelled pool "
                            "and of every scored row")
