"""A differentially private vertical party: Assumption 2 enforced, noise drawn, ledger kept.

No Flower imports: the Flower client and the in-process engine both use this class.

What the party does to make its sensitivity bound true whatever the server sends:
rows of D_m (train and test) normalized to unit norm; x_m constrained to the ball
||x|| <= b1; the x-update target v clipped entry-wise to [-c_v, c_v]; released values
clipped to [-c_s, c_s]. Training release: s~ = clip(D x) + N(0, sigma_t^2 I) with
sigma_t = z * C (C from the chosen calibration). Evaluation release: x~ = x + N(0,
sigma_e^2 I) with sigma_e = z * C_x and D_test x~ released (post-processing of x~).
Every release is charged in the party's own ledger, which lives in its
:class:`~flower_vfl.privacy.store.PartyStore` (on its disk, shared by every run on the
same data): a release that would exceed the budget raises
:class:`~flower_vfl.privacy.ledger.BudgetExceeded`; a release is durable in the store before
it is returned. A re-sent request for an answered (round, kind) with identical inputs gets
the stored vector; with different inputs, or an older round, it is refused
(:class:`ReplayRefused`). The evaluation release is the model itself: x~ is drawn once,
charged once, and every later prediction is ``D_eval @ x~`` (post-processing, free).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp

from flower_vfl.core.party import PartyUpdate
from flower_vfl.core.scoring import normalize_rows
from flower_vfl.core.penalties import Ball, get_penalty
from flower_vfl.privacy.accounting import epsilon_for_releases, noise_multiplier_for
from flower_vfl.privacy.boundary import Refused, RoundInputs, inputs_hash
from flower_vfl.privacy.ledger import _RTOL, BudgetExceeded, LedgerEntry, PrivacyLedger
from flower_vfl.privacy.store import PartyStore, data_fingerprint  # noqa: F401  (re-exported)
from flower_vfl.privacy.mechanism import GaussianOutputMechanism
from flower_vfl.privacy.sensitivity import (NEIGHBOURING_RELATIONS, paper_sensitivity, strict_param_sensitivity,
                          strict_sensitivity)

__all__ = ["PrivacyConfig", "PrivateParty", "ReplayRefused", "PlanExceeded", "data_fingerprint",
           "normalize_rows"]


@dataclass
class PrivacyConfig:
    """A party's own privacy settings (node config on a real SuperNode).

    epsilon, delta : the party's total budget over all its releases.
    train_rounds, eval_rounds : planned releases; sigma is calibrated so that exactly
        these spend the budget under ``accountant``. ``train_rounds=0`` is allowed: the
        party then releases only for evaluation (see docs/privacy.md, "Protocol").
    calibration : 'strict' (sample-level, docs/privacy.md) or 'paper' (Lemma 1).
    noise_form : 'output' (Gaussian mechanism on s) or 'paper' (eq. 16, not DP by itself).
    b1, c_v, c_s : ball radius of x_m, clip of the x-update target, clip of released values.
        The defaults match the run-config defaults (``dp-*`` keys) and what the a9a validation
        selects (docs/privacy.md); c_v = 10 is the bound 1/(N rho_x) of the warm-started
        target at the default rho with 2 parties.
    lam : the party's own L2 coefficient for its block (None: the run's lam). A larger lam
        lowers the sensitivity of x_m (C_x = 2 rho_x (b1 + c_v) / lam) at the cost of bias.
    """

    epsilon: float = 1.0
    delta: float = 1e-5
    train_rounds: int = 0
    eval_rounds: int = 1
    calibration: str = "strict"
    noise_form: str = "output"
    accountant: str = "exact"
    b1: float = 2.0
    c_v: float = 10.0
    c_s: float = 10.0
    seed: int | None = None
    lam: float | None = None

    def validate(self):
        if self.calibration not in ("strict", "paper"):
            raise ValueError(f"calibration={self.calibration!r}; choose 'strict' or 'paper'")
        if self.noise_form not in ("output", "paper"):
            raise ValueError(f"noise_form={self.noise_form!r}; choose 'output' or 'paper'")
        for k in ("epsilon", "b1", "c_v", "c_s"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
                raise ValueError(f"{k} must be a finite number > 0; got {k}={v!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1); got delta={self.delta!r}")
        for k in ("train_rounds", "eval_rounds"):
            if int(getattr(self, k)) < 0:
                raise ValueError(f"{k} must be >= 0; got {k}={getattr(self, k)!r}")
        if int(self.train_rounds) + int(self.eval_rounds) < 1:
            raise ValueError("train_rounds + eval_rounds must be >= 1 (a party that never releases "
                             f"needs no budget); got train_rounds={self.train_rounds!r}, "
                             f"eval_rounds={self.eval_rounds!r}")
        if self.lam is not None and not (isinstance(self.lam, (int, float)) and np.isfinite(self.lam)
                                         and self.lam > 0):
            raise ValueError(f"lam must be a finite number > 0 or None; got lam={self.lam!r}")
        return self


class ReplayRefused(Refused):
    """A request for an answered round with other inputs, or for an older round."""

    code = "replay"


class PlanExceeded(Refused):
    """More releases of one kind than the party's plan (train_rounds / eval_rounds) allows."""

    code = "plan"


class PrivateParty:
    """One party's private x-update and releases, charged in its own store.

    Parameters
    ----------
    D, D_test : (N, d_m) and (N_test, d_m) blocks (normalized here).
    lam : float
        L2 coefficient (> 0: the strict bound needs strong convexity).
    config : PrivacyConfig
    party_id : int
    n_parties : int
        M, for the paper's Lemma 1.
    store : PartyStore, str or None
        Where the ledger and every answer live (a party's ``state-dir``); None keeps them
        in memory (the in-process engine).
    run : str
        The run these releases belong to (Flower's run id); the budget spans all runs.
    """

    def __init__(self, D, D_test, lam, config: PrivacyConfig, party_id=0, n_parties=2, store=None,
                 run="local", fingerprint=None):
        self.config = config.validate()
        lam = lam if config.lam is None else config.lam
        if not lam > 0:
            raise ValueError(f"a private party needs lam > 0 (strong convexity of its x-update); got lam={lam!r}")
        self.party_id = party_id
        self.n_parties = n_parties
        self.lam = float(lam)
        self.fingerprint = fingerprint or data_fingerprint(D)
        self.D = normalize_rows(D)
        self.D_test = None if D_test is None else normalize_rows(D_test)
        self.update = PartyUpdate(self.D, get_penalty("l2"), lam, Ball(config.b1), v_clip=config.c_v)
        releases = config.train_rounds + config.eval_rounds
        #: one noise multiplier for every planned release, from the party's accountant
        self.z = noise_multiplier_for(config.epsilon, config.delta, releases, config.accountant)
        self.mechanism = GaussianOutputMechanism(1.0, party_id, seed=config.seed,
                                                 form=config.noise_form)
        self.store = store if isinstance(store, PartyStore) else PartyStore(store or ":memory:")
        self.run = str(run)
        #: the privacy unit the budget is keyed by (with the data fingerprint)
        self.unit = f"{config.calibration}:{'row' if config.calibration == 'strict' else 'feature'}"
        self.store.note_budget(self.fingerprint, self.unit, {
            "epsilon": config.epsilon, "delta": config.delta, "accountant": config.accountant,
            "party_id": party_id})
        self._x_tilde = None

    # --------------------------------------------------------------- the ledger
    @property
    def ledger(self) -> PrivacyLedger:
        """The party's ledger over every release on this data (all runs), from its store."""
        c = self.config
        led = PrivacyLedger(self.party_id, c.epsilon, c.delta, c.train_rounds + c.eval_rounds,
                            method=c.accountant, sensitivity=1.0, sigma=self.z)
        led.entries = [LedgerEntry(e.round, e.kind, e.sigma, e.sensitivity, e.noise_multiplier, None, None)
                       for e in self.store.entries(self.fingerprint, self.unit)]
        return led

    def _check_budget(self, round, kind, z):
        c = self.config

        def check(zs):
            after = epsilon_for_releases(list(zs) + [z], c.delta, c.accountant)
            if not after <= c.epsilon * (1.0 + _RTOL):
                raise BudgetExceeded(self.party_id, round=round, kind=kind, noise_multiplier=z,
                                     requested=after, spent=epsilon_for_releases(zs, c.delta, c.accountant),
                                     budget=c.epsilon, delta=c.delta, method=c.accountant, releases=len(zs))
        return check

    def _check_request(self, kind, inputs: RoundInputs, h):
        """Stored answer for an identical re-send; refuse other inputs, old rounds, over-plan."""
        prior = self.store.answer(self.fingerprint, self.unit, self.run, inputs.round, kind)
        if prior is not None:
            if prior.inputs_hash != h:
                raise ReplayRefused(f"party {self.party_id} already answered the {kind} request of round "
                                    f"{inputs.round} with other inputs; a second answer would reveal the "
                                    "noise, so it is refused")
            return prior
        last = self.store.last_round(self.fingerprint, self.unit, self.run, kind)
        if last is not None and inputs.round <= last:
            raise ReplayRefused(f"party {self.party_id}: {kind} round {inputs.round} is not after the last "
                                f"answered round {last}; round numbers must increase")
        planned = self.config.train_rounds if kind == "train" else self.config.eval_rounds
        done = sum(e.run == self.run and e.kind == kind for e in self.store.entries(self.fingerprint, self.unit))
        if done >= planned:
            raise PlanExceeded(f"party {self.party_id} refuses a {kind} release: its plan allows "
                               f"{planned} {kind} release(s) per run (node config dp-{kind}-rounds) and "
                               f"{done} were made in this run")
        return None

    # --------------------------------------------------------------- calibration
    def sensitivity(self, rho, theta, kind="train"):
        c = self.config
        rho_x = rho / theta
        if kind == "eval":
            return strict_param_sensitivity(rho_x, self.lam, c.b1, c.c_v)
        if c.calibration == "paper":
            return paper_sensitivity(self.D.shape[1], rho, self.lam, c.b1, self.n_parties)
        return strict_sensitivity(rho_x, self.lam, c.b1, c.c_v, c.c_s)

    # ------------------------------------------------------------------ releases
    def train_release(self, round, q, y, rho, alpha=1.0, theta=1.0, inputs: RoundInputs | None = None):
        """x-update (eq. 6) then the noisy release s~, durable in the store before it returns."""
        inputs = inputs or RoundInputs(int(round), float(rho), float(alpha), float(theta),
                                       np.asarray(q, float), np.asarray(y, float), False)
        h = inputs_hash(self.run, "train", inputs)
        prior = self._check_request("train", inputs, h)
        if prior is not None:                          # identical re-send: same vector, no draw
            return prior.payload["s"]
        C = self.sensitivity(inputs.rho, inputs.theta, "train")
        sigma = self.z * C
        self._check_budget(inputs.round, "train", self.z)(
            [e.noise_multiplier for e in self.store.entries(self.fingerprint, self.unit)])
        s = self.update.step(inputs.q, inputs.y, inputs.rho, inputs.alpha, inputs.theta)
        if self.config.noise_form == "paper":
            s_tilde = self.mechanism.release(round=inputs.round, kind="train", D=self.D, x=self.update.x)
            s_tilde = s + sigma * (s_tilde - s)        # mechanism drew at sigma=1: rescale
        else:
            s_tilde = np.clip(s, -self.config.c_s, self.config.c_s) + \
                sigma * self.mechanism.output_noise(inputs.round, "train", s.shape)
        self.update.commit(s_tilde)
        self.store.commit_release(self.fingerprint, self.unit, self.run, inputs.round, "train", h,
                                  noise_multiplier=self.z, sigma=sigma, sensitivity=C,
                                  payload={"s": s_tilde}, check=self._check_budget(inputs.round, "train", self.z),
                                  state=self.update.get_state())
        return s_tilde

    def final_update(self, q, y, rho, alpha=1.0, theta=1.0):
        """The x-update from the last message, kept inside the party (never released on
        training rows, so it costs nothing); the model release perturbs this x."""
        if self.x_released is not None:
            return                                     # the model is already out: x stays as released
        self.update.step(q, y, rho, alpha, theta)
        self.store.put_state(self.fingerprint, self.unit, self.run, self.update.get_state())

    def release_model(self, round, inputs_digest="model"):
        """Draw x~ = x + N(0, sigma_e^2 I) once, charge it, store it; later calls return it."""
        if self.x_released is not None:
            return self.x_released
        if self.update.rho_x is None:
            raise Refused(f"party {self.party_id} has made no x-update in this run; there is no model to "
                          "release")
        inputs = RoundInputs(int(round), self.update.rho_x, 1.0, 1.0, None, None, True)
        prior = self._check_request("eval", inputs, inputs_digest)
        if prior is not None:
            self._x_tilde = prior.payload["x_tilde"]
            return self._x_tilde
        # C_x depends on the rho_x that produced x, whatever rho a later request carries
        C = self.sensitivity(self.update.rho_x, 1.0, "eval")
        sigma = self.z * C
        check = self._check_budget(int(round), "eval", self.z)
        check([e.noise_multiplier for e in self.store.entries(self.fingerprint, self.unit)])
        xi = self.mechanism.rng(int(round), "eval").standard_normal(self.update.x.shape)
        x_tilde = self.update.x + sigma * xi
        self.store.commit_release(self.fingerprint, self.unit, self.run, int(round), "eval", inputs_digest,
                                  noise_multiplier=self.z, sigma=sigma, sensitivity=C,
                                  payload={"x_tilde": x_tilde}, check=check, state=self.update.get_state())
        self._x_tilde = x_tilde
        return x_tilde

    @property
    def x_released(self):
        """The released model x~ of this run (None before the release): the only model
        block a private party ever shows; predictions are post-processing of it."""
        if self._x_tilde is None:
            ans = self.store.last_answer(self.fingerprint, self.unit, self.run, "eval")
            if ans is not None:
                self._x_tilde = ans.payload["x_tilde"]
        return self._x_tilde

    def predict(self, D_eval):
        """D_eval x~ (rows normalized as in training): free once x~ is released."""
        if self.x_released is None:
            raise Refused(f"party {self.party_id} has not released its model yet")
        return normalize_rows(D_eval) @ self.x_released

    def eval_release(self, round, rho=None, theta=1.0, D_eval=None):
        """Scores of ``D_eval`` (default the party's held-out block) from x~, released once."""
        self.release_model(round)
        return self.D_test @ self.x_released if D_eval is None else self.predict(D_eval)

    def restore(self, state: dict | None = None):
        """Resume this run's iterate from the store (a restarted node) or from ``state``."""
        state = state if state is not None else self.store.get_state(self.fingerprint, self.unit, self.run)
        if state:
            self.update.set_state(state)

    # same read-only view as PartyUpdate, for the engine (internal: never a public attribute)
    @property
    def x(self):
        return self.update.x

    @property
    def s(self):
        """The last released training vector (zeros before the first release)."""
        return self.update.s

    @property
    def solver(self):
        return self.update.solver

    def penalty_value(self):
        return self.update.penalty_value()

    # ------------------------------------------------------------------ reporting
    def report(self) -> dict:
        """What the party tells the server and the run report: no seed, no data, no x."""
        cfg = {k: v for k, v in asdict(self.config).items() if k != "seed"}
        cfg["noise_source"] = "os-entropy" if self.config.seed is None else "party-seed (kept on the party)"
        ledger = self.ledger
        this_run = [e for e in self.store.entries(self.fingerprint, self.unit) if e.run == self.run]
        return {
            "party_id": self.party_id,
            "config": cfg,
            "neighbouring_relation": NEIGHBOURING_RELATIONS[self.config.calibration],
            "protects": "features of each training row of this party (row-level DP)"
                        if self.config.calibration == "strict" and self.config.noise_form == "output"
                        else "NOT differentially private as configured (paper noise form or calibration)",
            "does_not_protect": "labels (unless the label owner uses label DP); the scores of rows "
                                "that are scored (test/prediction rows) as functions of those rows",
            "noise_multiplier": self.z,
            "ledger": {"entries": [{"round": e.round, "kind": e.kind, "sigma": e.sigma,
                                    "sensitivity": e.sensitivity, "noise_multiplier": e.noise_multiplier}
                                   for e in this_run],
                       "releases_all_runs": len(ledger.entries)},
            "totals": ledger.totals(),
            "remaining_epsilon": max(0.0, self.config.epsilon - ledger.spent()),
        }
