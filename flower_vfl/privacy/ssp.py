"""A private party that releases one ridge fit by sufficient-statistics perturbation (SSP).

No Flower imports. Used by :mod:`flower_vfl.estimator.stacked` (several private parties, issue 21
item 2); see docs/privacy_parties.md.

The central node (the label owner) sends the party one target vector v (one value per training
row: a function of the labels only). The party clips it to [-c_v, c_v], forms its sufficient
statistics on its own rows (unit-norm rows, as every private party here),

    G = D^T D        (d x d),         g = D^T v        (d),

and adds Gaussian noise to (upper triangle of G, g) in one release. Sample-level relation (one
row of D replaced, both rows of norm <= 1; v fixed by the transcript): with a = D_i, b = D'_i,

    ||triu(aa^T - bb^T)||_F^2 <= ||aa^T - bb^T||_F^2 = |a|^4 + |b|^4 - 2 (a.b)^2 <= 2,
    ||v_i (a - b)||^2 <= 4 c_v^2,

so the L2 sensitivity of the release is C = sqrt(2 + 4 c_v^2) and sigma = z C, with z from the
party's accountant for one release at its (epsilon, delta). Everything after the noise is
post-processing (free): the noisy Gram is symmetrized and projected onto the PSD cone, and the
party solves the ridge problem

    x~ = (G~_+ + lam' I)^{-1} g~,     lam' = ridge * sigma * sqrt(d)

(lam' from public quantities only: the noise scale and the block's width; the AdaSSP rule of
Wang 2018 has the same sigma sqrt(d) scale). The party releases x~ and the scalar x~^T g~
(the label owner's calibration uses it); scores D_eval x~ of any rows are post-processing of x~.
The noisy statistics themselves never leave the party.

Compared with output perturbation of the ADMM x-update (:class:`~flower_vfl.privacy.party.PrivateParty`,
sensitivity 2 rho_x (b1 + c_v) / lam of x), the noise here does not grow as the ridge shrinks, so a
much weaker ridge is affordable: on a9a at epsilon = 1 the fit is close to the non-private ridge fit.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict

import numpy as np
from scipy.special import logit

from flower_vfl.core.scoring import normalize_rows
from flower_vfl.privacy.accounting import noise_multiplier_for
from flower_vfl.privacy.boundary import InvalidMessage, Refused
from flower_vfl.privacy.ledger import Budget, Ledger
from flower_vfl.privacy.mechanism import GaussianOutputMechanism
from flower_vfl.privacy.party import PlanExceeded, PrivacyConfig, ReplayRefused
from flower_vfl.privacy.store import PartyStore

__all__ = ["OneReleaseParty", "SSPParty", "ssp_sensitivity", "ssp_ridge", "DEFAULT_RIDGE", "stacking_target",
           "lda_calibration", "calibrate_scores", "cross_fit_halves", "cross_fitted_decision"]

#: lam' = DEFAULT_RIDGE * sigma * sqrt(d): chosen on a 20 % validation split of the a9a TRAINING set over
#: {0.5, 1, 1.5, 2, 3, 5} x c_v {0.5, 0.75, 1, 1.5} at epsilon {0.25, 1, 4} (flat optimum; docs/privacy_parties.md)
DEFAULT_RIDGE = 1.0

#: the neighbouring relation this party protects (kept in every ledger entry)
UNIT = "ssp:row"


def ssp_sensitivity(c_v: float) -> float:
    """L2 sensitivity of (triu(D^T D), D^T v) when one unit-norm row of D is replaced: sqrt(2 + 4 c_v^2)."""
    if not (isinstance(c_v, (int, float)) and math.isfinite(c_v) and c_v > 0):
        raise ValueError(f"c_v must be a finite number > 0; got c_v={c_v!r}")
    return math.sqrt(2.0 + 4.0 * c_v * c_v)


def ssp_ridge(sigma: float, d: int, ridge: float = DEFAULT_RIDGE) -> float:
    """The ridge lam' = ridge * sigma * sqrt(d) of the post-processing solve (public quantities only)."""
    return float(ridge) * float(sigma) * math.sqrt(int(d))


class OneReleaseParty:
    """What a private party that makes one release per run of a statistic of (D, clip(v)) shares
    (:class:`SSPParty`, :class:`~flower_vfl.privacy.label_moments.MomentParty`): the checks of its
    config, its row-normalized block, the noise multiplier from its accountant, its one ledger,
    the target's check and clip, and the release's replay / plan / budget rule. A subclass gives
    :attr:`WHAT`, :attr:`TAG`, :attr:`UNIT`, :meth:`_sensitivity`, :meth:`_payload` and :meth:`_unpack`."""

    WHAT, TAG, RELEASE, UNIT = "a one-release party", "one-release", "one-release", "one-release:row"

    def __init__(self, D, config: PrivacyConfig, party_id=0, store=None, run="local", source=None, about=None):
        self.config = config.validate()
        if config.calibration != "strict" or config.noise_form != "output":
            raise ValueError(f"{self.WHAT} is differentially private only with calibration='strict' and "
                             f"noise_form='output'; got calibration={config.calibration!r}, "
                             f"noise_form={config.noise_form!r}")
        if int(config.eval_rounds) != 1 or int(config.train_rounds) != 0:
            raise ValueError(f"{self.WHAT} makes exactly one release per run: give train_rounds=0, "
                             f"eval_rounds=1; got train_rounds={config.train_rounds!r}, "
                             f"eval_rounds={config.eval_rounds!r}")
        self._check_settings()
        self.party_id = party_id
        self.D = normalize_rows(D)
        self.n, self.d = self.D.shape
        #: the noise multiplier of the one release, from the party's accountant
        self.z = noise_multiplier_for(config.epsilon, config.delta, 1, config.accountant)
        self.sensitivity = self._sensitivity(config.c_v)
        self.sigma = self.z * self.sensitivity
        self.mechanism = GaussianOutputMechanism(1.0, party_id, seed=config.seed)
        store = store if isinstance(store, PartyStore) else PartyStore(store or ":memory:")
        self.run = str(run)
        self.ledger = Ledger(store, source or f"in-process:{party_id}",
                             Budget(config.epsilon, config.delta, config.accountant), party_id, about)
        self._answer = None

    def _check_settings(self):
        """A subclass's own settings, checked before anything is set up."""

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

    def digest(self, round, v, run=None) -> str:
        """The inputs hash of a release of the clipped target ``v`` at ``round`` in the ledger run
        ``run`` (default this party's): what identifies the same release in the ledger."""
        run = self.run if run is None else str(run)
        return hashlib.sha256(b"%s|%s|%d|" % (self.TAG.encode(), run.encode(), int(round))
                              + np.asarray(v, dtype=float).tobytes()).hexdigest()

    def stored_release_of(self, round, v) -> str | None:
        """The ledger run of a stored release of this party's statistic on the same (round, clipped
        target) as this request, in any run (None: there is none). Serving it again is
        post-processing of that one draw: a re-run that asks for the same release gets it, charged
        once; another target is another release."""
        v = self._check_target(v)
        for e in self.ledger.entries:
            if e.kind == "eval" and e.unit == self.UNIT and e.round == int(round) \
                    and e.inputs_hash == self.digest(round, v, e.run):
                return e.run
        return None

    def release(self, round, v):
        """Release the statistic of ``clip(v)`` once; an identical re-send gets the stored answer.

        Refuses (nothing charged) a malformed target, a second release in this run with another
        target or round (:class:`ReplayRefused` / :class:`PlanExceeded`) and a release over budget
        (:class:`~flower_vfl.privacy.ledger.BudgetExceeded`).
        """
        if isinstance(round, bool) or not isinstance(round, (int, np.integer)) or round < 0:
            raise InvalidMessage(f"party {self.party_id}: round={round!r} must be an integer >= 0", field="round")
        v = self._check_target(v)
        h = self.digest(round, v)
        prior = self.ledger.answer(self.run, int(round), "eval")
        if prior is not None:
            if prior.inputs_hash != h:
                raise ReplayRefused(f"party {self.party_id} already answered round {round} with another target; "
                                    "a second answer would reveal the noise, so it is refused")
            return self._unpack(prior.payload)
        if any(e.run == self.run and e.kind == "eval" for e in self.ledger.entries):
            raise PlanExceeded(f"party {self.party_id} refuses a second {self.RELEASE} release in run "
                               f"{self.run!r}: its plan allows one release per run")
        self.ledger.check(self.ledger.entries, round=int(round), kind="eval", mechanism="gaussian",
                          noise_multiplier=self.z)
        payload = self._payload(v, self.mechanism.rng(int(round), "eval"))
        self.ledger.commit(self.run, int(round), "eval", h, unit=self.UNIT, noise_multiplier=self.z,
                           sigma=self.sigma, sensitivity=self.sensitivity, payload=payload)
        return self._unpack(payload)

    def _report(self, mechanism, protects, does_not_protect, **extra) -> dict:
        """The report both subclasses give (no data, no noise seed)."""
        cfg = {k: v for k, v in asdict(self.config).items()
               if k in ("epsilon", "delta", "accountant", "c_v", "eval_rounds")}
        this_run = [e for e in self.ledger.entries if e.run == self.run]
        rep = {
            "party_id": self.party_id,
            "mechanism": mechanism,
            "config": dict(cfg, **extra.pop("config", {})),
            "neighbouring_relation": "sample-level: one row of D_m replaced (both rows of norm <= 1); the "
                                     "target v is fixed by the transcript",
            "protects": protects,
            "does_not_protect": does_not_protect,
            "noise_multiplier": self.z,
            "sensitivity": self.sensitivity,
            "sigma": self.sigma,
        }
        rep.update(extra)
        rep.update({
            "ledger": {"entries": [{"round": e.round, "kind": e.kind, "sigma": e.sigma,
                                    "sensitivity": e.sensitivity, "noise_multiplier": e.noise_multiplier}
                                   for e in this_run],
                       "releases_all_runs": len(self.ledger.entries)},
            "totals": self.ledger.totals(),
            "remaining_epsilon": self.ledger.remaining(),
        })
        return rep


class SSPParty(OneReleaseParty):
    """One private party: one SSP release of its ridge fit per run, charged in its own ledger.

    Parameters
    ----------
    D : (N, d) array or sparse matrix
        The party's training block (rows normalized here).
    config : PrivacyConfig
        ``epsilon``, ``delta``, ``accountant``, ``c_v`` (the clip of the target) and ``seed``
        (in-process experiments only) are used. The ADMM-specific fields must keep their
        defaults' meaning: ``calibration='strict'``, ``noise_form='output'``; ``b1``, ``c_s``,
        ``lam`` and ``train_rounds`` do not apply (the release has no iterate and no ball).
    ridge : float
        Multiplier of the post-processing ridge, lam' = ridge * sigma * sqrt(d).
    party_id, store, run, source, about :
        As for :class:`~flower_vfl.privacy.party.PrivateParty` (the ledger's key is the declared
        source; ``None``: ``in-process:<party_id>`` in an in-memory store).
    """

    WHAT, TAG, RELEASE = "an SSP party", "ssp", "SSP"
    UNIT = UNIT

    def __init__(self, D, config: PrivacyConfig, ridge: float = DEFAULT_RIDGE, party_id=0, store=None,
                 run="local", source=None, about=None):
        self.ridge = ridge
        super().__init__(D, config, party_id, store, run, source, about)
        self.ridge = float(ridge)
        self.lam = ssp_ridge(self.sigma, self.d, self.ridge)

    def _check_settings(self):
        ridge = self.ridge
        if not (isinstance(ridge, (int, float)) and math.isfinite(ridge) and ridge > 0):
            raise ValueError(f"ridge must be a finite number > 0; got ridge={ridge!r}")

    _sensitivity = staticmethod(ssp_sensitivity)

    # ------------------------------------------------------------------ the release
    def _payload(self, v, rng):
        """(x~, x~^T g~) from the noisy (triu(D^T D), D^T v): what :meth:`release` sends."""
        D = self.D
        G = D.T @ D
        G = np.asarray(G.toarray() if hasattr(G, "toarray") else G, dtype=float)
        g = np.asarray(D.T @ v, dtype=float).ravel()
        E = np.triu(rng.standard_normal((self.d, self.d)))
        G_noisy = G + self.sigma * (E + np.triu(E, 1).T)          # noise on the upper triangle, mirrored
        g_noisy = g + self.sigma * rng.standard_normal(self.d)
        x_tilde, xg = self._solve(G_noisy, g_noisy)               # post-processing of the noisy stats
        if not (np.all(np.isfinite(x_tilde)) and math.isfinite(xg)):
            raise InvalidMessage(f"party {self.party_id}: the release would not be finite; refused, nothing "
                                 "charged", field="v")
        return {"x_tilde": x_tilde, "xg": np.array([xg])}

    def _solve(self, G_noisy, g_noisy):
        """x~ = (G~_+ + lam' I)^{-1} g~ with G~_+ the PSD part of the noisy Gram; and x~^T g~."""
        w, V = np.linalg.eigh(G_noisy)
        x = V @ ((V.T @ g_noisy) / (np.maximum(w, 0.0) + self.lam))
        return x, float(x @ g_noisy)

    def _unpack(self, payload):
        self._answer = (np.asarray(payload["x_tilde"], float), float(np.asarray(payload["xg"]).ravel()[0]))
        return self._answer

    @property
    def x_released(self):
        """The released x~ (None before the release)."""
        if self._answer is None:
            ans = self.ledger.last_answer(self.run, "eval")
            if ans is not None:
                self._unpack(ans.payload)
        return None if self._answer is None else self._answer[0]

    def predict(self, D_eval):
        """D_eval x~ (rows normalized as in training): post-processing of x~, free."""
        if self.x_released is None:
            raise Refused(f"party {self.party_id} has not released its model yet")
        return np.asarray(normalize_rows(D_eval) @ self.x_released).ravel()

    # ------------------------------------------------------------------ reporting
    def report(self) -> dict:
        """What the party tells the label owner and the run report (no data, no noise seed)."""
        return self._report("sufficient-statistics perturbation (Gaussian on triu(D^T D), D^T v), one release",
                            "features of each training row of this party (row-level DP)",
                            "labels (the target is a function of them); the scores of rows that are scored",
                            config={"ridge": self.ridge}, lam_post=self.lam)


# ---------------------------------------------------------------------- the label owner's side
# (post-processing of the parties' releases; used by flower_vfl.estimator.stacked in process and by
# the Flower strategy flower_vfl.strategies.stacked_ssp, so that the two cannot drift)

def stacking_target(t, c_v):
    """The target v = kappa (t - pi) the label owner sends a party whose clip is ``c_v``, and kappa.

    ``t``: the training labels in {0, 1}; pi = mean(t); kappa = c_v / max(pi, 1 - pi), so v fills
    the party's clip [-c_v, c_v]."""
    t = np.asarray(t, dtype=float)
    pi = float(t.mean())
    kappa = float(c_v) / max(pi, 1 - pi)
    return kappa * (t - pi), kappa


def lda_calibration(S, xg_over_n, pi):
    """Logistic weights (w, b) for the scores S (rows x parties) of the released models.

    Parameters
    ----------
    S : (n_pool, M) array
        Scores of unlabelled rows from the released models (their moments stand for the
        training rows' moments: same distribution).
    xg_over_n : (M,) array
        (1/N) sum_i (t_i - pi) s_mi over the training rows, from the released x~_m^T g~_m / (N kappa).
    pi : float
        Mean of the training labels in {0, 1}.

    Least squares of t on (1, s) from the moments, then the linear discriminant with shared
    variance on f = beta^T s: delta = Cov(f, t) / (pi (1 - pi)), sigma_w^2 = Var f - pi (1 - pi)
    delta^2, weight k = delta / sigma_w^2, intercept logit(pi) - k (mu_1 + mu_0) / 2. For Gaussian
    scores with a shared covariance in both classes this is the Bayes rule.
    """
    S = np.asarray(S, dtype=float)
    if S.ndim != 2 or S.shape[0] < 10 * (S.shape[1] + 1):
        raise ValueError(f"the calibration pool has shape {S.shape}; give at least 10 (M + 1) unlabelled rows "
                         "scored by the M parties (calibration_blocks)")
    if not 0 < pi < 1:
        raise ValueError(f"pi={pi!r}: both classes must occur in the training labels")
    Es = S.mean(axis=0)
    S2 = S.T @ S / S.shape[0]
    Ets = np.asarray(xg_over_n, float) + pi * Es                   # E[t s] over the training rows
    A = np.block([[np.ones((1, 1)), Es[None, :]], [Es[:, None], S2]])
    beta = np.linalg.lstsq(A, np.r_[pi, Ets], rcond=None)[0][1:]
    f = S @ beta
    delta = float(beta @ (Ets - pi * Es)) / (pi * (1 - pi))
    var_w = float(f.var()) - pi * (1 - pi) * delta ** 2
    if not (delta > 0 and var_w > 0):
        raise ValueError(f"the released scores carry no usable signal (class-mean gap {delta:.3g}, within-class "
                         f"variance {var_w:.3g}); raise the parties' epsilon or give a larger calibration pool")
    k = delta / var_w
    mean_f = float(f.mean())
    mu1, mu0 = mean_f + (1 - pi) * delta, mean_f - pi * delta
    return k * beta, float(logit(pi) - k * (mu1 + mu0) / 2)


def calibrate_scores(S, xg, kappa, n_train, pi):
    """(weights, intercept) of :func:`lda_calibration` from the parties' released scalars
    x~_m^T g~_m (``xg``), the kappa_m of their targets, the number of training rows and pi:
    (1/N) sum_i (t_i - pi) s_mi = x~_m^T g~_m / (N kappa_m)."""
    xg_over_n = np.array([x / (k * n_train) for x, k in zip(xg, kappa)])
    return lda_calibration(S, xg_over_n, pi)


def cross_fit_halves(n, seed=12345):
    """Two halves of ``n`` pool rows (a fixed public permutation, no data): each half is scored with
    the calibration computed on the other half (docs/privacy_parties.md, "The calibration pool")."""
    perm = np.random.default_rng(seed).permutation(int(n))
    return perm[: n // 2], perm[n // 2:]


def cross_fitted_decision(S, xg, kappa, n_train, pi, halves):
    """Decision values of the pool rows ``S`` (n x M scores), each half calibrated on the other half
    (:func:`calibrate_scores`); also returns the two (weights, intercept)."""
    S = np.asarray(S, dtype=float)
    f = np.empty(S.shape[0])
    fits = []
    for mine, other in ((halves[1], halves[0]), (halves[0], halves[1])):
        w, b = calibrate_scores(S[other], xg, kappa, n_train, pi)
        f[mine] = S[mine] @ w + b
        fits.append((w, b))
    return f, fits
