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

import hashlib
import math
from dataclasses import asdict

import numpy as np

from flower_vfl.core.scoring import normalize_rows
from flower_vfl.privacy.accounting import noise_multiplier_for
from flower_vfl.privacy.boundary import InvalidMessage
from flower_vfl.privacy.ledger import Budget, Ledger
from flower_vfl.privacy.mechanism import GaussianOutputMechanism
from flower_vfl.privacy.party import PlanExceeded, PrivacyConfig, ReplayRefused
from flower_vfl.privacy.store import PartyStore

__all__ = ["MomentParty", "moment_sensitivity", "UNIT"]

#: the neighbouring relation this party protects (kept in every ledger entry)
UNIT = "moment:row"


def moment_sensitivity(c_v: float) -> float:
    """L2 sensitivity of D^T v when one row of norm <= 1 is replaced and |v_i| <= c_v: 2 c_v."""
    if not (isinstance(c_v, (int, float)) and math.isfinite(c_v) and c_v > 0):
        raise ValueError(f"c_v must be a finite number > 0; got c_v={c_v!r}")
    return 2.0 * float(c_v)


class MomentParty:
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

    def __init__(self, D, config: PrivacyConfig, party_id=0, store=None, run="local", source=None, about=None):
        self.config = config.validate()
        if config.calibration != "strict" or config.noise_form != "output":
            raise ValueError("a moment party is differentially private only with calibration='strict' and "
                             f"noise_form='output'; got calibration={config.calibration!r}, "
                             f"noise_form={config.noise_form!r}")
        if int(config.eval_rounds) != 1 or int(config.train_rounds) != 0:
            raise ValueError("a moment party makes exactly one release per run: give train_rounds=0, "
                             f"eval_rounds=1; got train_rounds={config.train_rounds!r}, "
                             f"eval_rounds={config.eval_rounds!r}")
        self.party_id = party_id
        self.D = normalize_rows(D)
        self.n, self.d = self.D.shape
        #: the noise multiplier of the one release, from the party's accountant
        self.z = noise_multiplier_for(config.epsilon, config.delta, 1, config.accountant)
        self.sensitivity = moment_sensitivity(config.c_v)
        self.sigma = self.z * self.sensitivity
        self.mechanism = GaussianOutputMechanism(1.0, party_id, seed=config.seed)
        store = store if isinstance(store, PartyStore) else PartyStore(store or ":memory:")
        self.run = str(run)
        self.ledger = Ledger(store, source or f"in-process:{party_id}",
                             Budget(config.epsilon, config.delta, config.accountant), party_id, about)
        self._answer = None

    def _check_target(self, v):
        try:
            v = np.asarray(v, dtype=float)
        except (TypeError, ValueError):
            raise InvalidMessage(f"party {self.party_id}: the target must be a numeric vector", field="v")
        if v.shape != (self.n,):
            raise InvalidMessage(f"party {self.party_id}: the target has shape {v.shape}; expected ({self.n},) "
                                 "(one value per training row)", field="v")
        if not np.all(np.isfinite(v)):
            raise InvalidMessage(f"party {self.party_id}: the target has NaN or inf values", field="v")
        return np.clip(v, -self.config.c_v, self.config.c_v)

    def statistic(self, v):
        """The noise-free D^T clip(v) (for tests and audits; never sent)."""
        return np.asarray(self.D.T @ self._check_target(v), dtype=float).ravel()

    def release(self, round, v):
        """Release ``g~ = D^T clip(v) + N(0, sigma^2 I)`` once; an identical re-send gets the stored answer.

        Refuses (nothing charged) a malformed target, a second release in this run with another
        target or round (:class:`ReplayRefused` / :class:`PlanExceeded`) and a release over budget
        (:class:`~flower_vfl.privacy.ledger.BudgetExceeded`).
        """
        if isinstance(round, bool) or not isinstance(round, (int, np.integer)) or round < 0:
            raise InvalidMessage(f"party {self.party_id}: round={round!r} must be an integer >= 0", field="round")
        v = self._check_target(v)
        h = hashlib.sha256(b"moment|%s|%d|" % (self.run.encode(), int(round)) + v.tobytes()).hexdigest()
        prior = self.ledger.answer(self.run, int(round), "eval")
        if prior is not None:
            if prior.inputs_hash != h:
                raise ReplayRefused(f"party {self.party_id} already answered round {round} with another target; "
                                    "a second answer would reveal the noise, so it is refused")
            return self._unpack(prior.payload)
        if any(e.run == self.run and e.kind == "eval" for e in self.ledger.entries):
            raise PlanExceeded(f"party {self.party_id} refuses a second moment release in run {self.run!r}: "
                               "its plan allows one release per run")
        self.ledger.check(self.ledger.entries, round=int(round), kind="eval", mechanism="gaussian",
                          noise_multiplier=self.z)
        g = np.asarray(self.D.T @ v, dtype=float).ravel()
        rng = self.mechanism.rng(int(round), "eval")
        payload = {"g_tilde": g + self.sigma * rng.standard_normal(self.d)}
        self.ledger.commit(self.run, int(round), "eval", h, unit=UNIT, noise_multiplier=self.z, sigma=self.sigma,
                           sensitivity=self.sensitivity, payload=payload)
        return self._unpack(payload)

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
        cfg = {k: v for k, v in asdict(self.config).items()
               if k in ("epsilon", "delta", "accountant", "c_v", "eval_rounds")}
        this_run = [e for e in self.ledger.entries if e.run == self.run]
        return {
            "party_id": self.party_id,
            "mechanism": "Gaussian on the label moment D^T v (one release)",
            "config": cfg,
            "neighbouring_relation": "sample-level: one row of D_m replaced (both rows of norm <= 1); the "
                                     "target v is fixed by the transcript",
            "protects": "features of each training row of this party (row-level DP), against a server "
                        "colluding with any other party (each party adds its whole noise)",
            "does_not_protect": "labels (the target is a function of them); the rows of the unlabelled pool "
                                "and of every scored row",
            "noise_multiplier": self.z,
            "sensitivity": self.sensitivity,
            "sigma": self.sigma,
            "ledger": {"entries": [{"round": e.round, "kind": e.kind, "sigma": e.sigma,
                                    "sensitivity": e.sensitivity, "noise_multiplier": e.noise_multiplier}
                                   for e in this_run],
                       "releases_all_runs": len(self.ledger.entries)},
            "totals": self.ledger.totals(),
            "remaining_epsilon": self.ledger.remaining(),
        }
