"""A differentially private vertical party: Assumption 2 enforced, noise drawn, ledger kept.

No Flower imports: the Flower client and the in-process engine both use this class.

What the party does to make its sensitivity bound true whatever the server sends:
rows of D_m (train and test) normalized to unit norm; x_m constrained to the ball
||x|| <= b1; the x-update target v clipped entry-wise to [-c_v, c_v]; released values
clipped to [-c_s, c_s]. Training release: s~ = clip(D x) + N(0, sigma_t^2 I) with
sigma_t = z * C (C from the chosen calibration). Evaluation release: x~ = x + N(0,
sigma_e^2 I) with sigma_e = z * C_x and D_test x~ released (post-processing of x~).

Every release is charged by the party's one :class:`~flower_vfl.privacy.ledger.Ledger`,
which lives in its :class:`~flower_vfl.privacy.store.PartyStore` (its own disk) under the
key of the data source its node config declares (:mod:`flower_vfl.clients.source`), so
every run and every view of the same people composes there. A release is checked before
it is computed (ρ, θ and the sensitivity finite), checked again once computed (finite
values), then charged and made durable by :meth:`Ledger.commit` before it is returned; a
release that would exceed the budget raises :class:`~flower_vfl.privacy.ledger.BudgetExceeded`.
A re-sent request for an answered (round, kind) with identical inputs gets the stored
vector; with different inputs, or an older round, it is refused (:class:`ReplayRefused`).
The evaluation release is the model itself: x~ is drawn once, charged once, and every
later prediction is ``D_eval @ x~`` (post-processing, free).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from flower_vfl.core.party import PartyUpdate
from flower_vfl.core.scoring import normalize_rows, released_scores
from flower_vfl.core.penalties import Ball, get_penalty
from flower_vfl.core.xsolve import GRAM_MAX
from flower_vfl.privacy.accounting import noise_multiplier_for
from flower_vfl.privacy.boundary import InvalidMessage, Refused, RoundInputs, inputs_hash
from flower_vfl.privacy.ledger import PLAN_EXPIRY, Budget, Ledger
from flower_vfl.privacy.store import PartyStore
from flower_vfl.privacy.mechanism import GaussianOutputMechanism
from flower_vfl.privacy.sensitivity import (NEIGHBOURING_RELATIONS, paper_sensitivity, strict_param_sensitivity,
                                            strict_sensitivity)

__all__ = ["PrivacyConfig", "PrivateParty", "ReplayRefused", "PlanExceeded", "PlanViewChanged", "BlockTooWide",
           "normalize_rows"]


class BlockTooWide(Refused, ValueError):
    """A private party whose block is too wide for the exact x-update its sensitivity bound assumes."""

    code = "block"


class PlanViewChanged(Refused):
    """A resume whose run shows the party another block than the plan it continues was made on."""

    code = "plan"


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
    plan_expiry : seconds without a release (nor a first resume since) after which a Flower run's open plan
        stops holding its reservation (node config ``dp-plan-expiry``; docs/privacy.md, "A failure
        does not spend the budget").
    seed : in-process experiments only (the figures, the README's numbers): the noise of
        (party, round, kind) is then the seed's stream, the same in every run. A Flower
        party never has one (its node config's ``dp-seed`` is refused; docs/privacy.md).
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
    plan_expiry: float = PLAN_EXPIRY

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
        if not (isinstance(self.plan_expiry, (int, float)) and np.isfinite(self.plan_expiry)
                and self.plan_expiry >= 0):
            raise ValueError(f"plan_expiry must be a finite number >= 0 (seconds); got plan_expiry={self.plan_expiry!r}")
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
    """One party's private x-update and releases, charged in its one ledger.

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
    source : str or None
        The ledger's key: the data source the party's node config declares
        (:func:`flower_vfl.clients.source.declared_source`). None: ``in-process:<party_id>``
        (the in-process engine, whose store lives and dies with the fit).
    about : dict, optional
        What the source is, in words (kept in the store for ``flower-vfl ledger``).
    """

    def __init__(self, D, D_test, lam, config: PrivacyConfig, party_id=0, n_parties=2, store=None,
                 run="local", source=None, about=None):
        self.config = config.validate()
        lam = lam if config.lam is None else config.lam
        if not lam > 0:
            raise ValueError(f"a private party needs lam > 0 (strong convexity of its x-update); got lam={lam!r}")
        self.party_id = party_id
        self.n_parties = n_parties
        self.lam = float(lam)
        self.D = normalize_rows(D)
        self.D_test = None if D_test is None else normalize_rows(D_test)
        if self.D.shape[1] > GRAM_MAX:
            raise BlockTooWide(
                f"party {party_id} is private and its block has {self.D.shape[1]} columns (after its party-model "
                f"map), more than {GRAM_MAX}: its x-update would be iterative, stopped by a tolerance the central "
                "node's messages set (q, q_norm, theta), not the exact minimizer its sensitivity bound is derived "
                "for (docs/privacy.md); refused before any release. Give it at most "
                f"{GRAM_MAX} columns (fewer party-model features or knots, more num-parties), or run it without dp",
                field="block")
        # the exact x-update (eigendecomposition of D^T D and the ball's secular equation): never an
        # iterative solve warm-started from the last x with a tolerance tied to the server's residual,
        # which 'auto' picks for a sparse block wider than the rows a run aligned (the strict bound
        # holds for the minimizer only)
        self.update = PartyUpdate(self.D, get_penalty("l2"), lam, Ball(config.b1), v_clip=config.c_v,
                                  x_solver="gram")
        releases = config.train_rounds + config.eval_rounds
        #: one noise multiplier for every planned release, from the party's accountant
        self.z = noise_multiplier_for(config.epsilon, config.delta, releases, config.accountant)
        self.mechanism = GaussianOutputMechanism(1.0, party_id, seed=config.seed, form=config.noise_form)
        store = store if isinstance(store, PartyStore) else PartyStore(store or ":memory:")
        self.run = str(run)
        #: the privacy unit / neighbouring relation of this party's calibration (kept per release)
        self.unit = f"{config.calibration}:{'row' if config.calibration == 'strict' else 'feature'}"
        #: the party's one ledger: every release on its declared source, all runs
        self.ledger = Ledger(store, source or f"in-process:{party_id}",
                             Budget(config.epsilon, config.delta, config.accountant), party_id, about)
        self._x_tilde = None

    @property
    def store(self) -> PartyStore:
        return self.ledger.store

    def _check_request(self, kind, inputs: RoundInputs, h):
        """Stored answer for an identical re-send; refuse other inputs, old rounds, over-plan."""
        prior = self.ledger.answer(self.run, inputs.round, kind)
        if prior is not None:
            if prior.inputs_hash != h:
                raise ReplayRefused(f"party {self.party_id} already answered the {kind} request of round "
                                    f"{inputs.round} with other inputs; a second answer would reveal the "
                                    "noise, so it is refused")
            return prior
        last = self.ledger.last_round(self.run, kind)
        if last is not None and inputs.round <= last:
            raise ReplayRefused(f"party {self.party_id}: {kind} round {inputs.round} is not after the last "
                                f"answered round {last}; round numbers must increase")
        planned = self.config.train_rounds if kind == "train" else self.config.eval_rounds
        done = sum(e.run == self.run and e.kind == kind for e in self.ledger.entries)
        if done >= planned:
            raise PlanExceeded(f"party {self.party_id} refuses a {kind} release: its plan allows "
                               f"{planned} {kind} release(s) per run (node config dp-{kind}-rounds) and "
                               f"{done} were made in this run")
        return None

    def _finite(self, kind, rho, **values):
        """Refuse (nothing charged) a release whose calibration or values are not finite numbers:
        a crafted ρ (say 1e300) must never produce a charged ±inf or NaN."""
        for name, v in values.items():
            if not np.all(np.isfinite(v)):
                raise InvalidMessage(f"party {self.party_id}: the {kind} release at rho={rho!r} would have a "
                                     f"non-finite {name}; refused, nothing charged (the party's node config "
                                     "can narrow the accepted rho with min-rho / max-rho)", field="config.rho")

    # --------------------------------------------------------------- calibration
    def _calibrate(self, kind, rho, theta):
        """(C, σ = z C) for a release at (rho, theta), refused unless both are finite numbers."""
        with np.errstate(over="ignore"):
            try:
                C = self.sensitivity(rho, theta, kind)
            except (ValueError, OverflowError):          # rho / theta overflowed before C
                C = float("inf")
            sigma = self.z * C
        self._finite(kind, rho, sensitivity=C, sigma=sigma)
        return C, sigma

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
        """x-update (eq. 6) then the noisy release s~, durable in the ledger before it returns."""
        inputs = inputs or RoundInputs(int(round), float(rho), float(alpha), float(theta),
                                       np.asarray(q, float), np.asarray(y, float), False)
        h = inputs_hash(self.run, "train", inputs)
        prior = self._check_request("train", inputs, h)
        if prior is not None:                          # identical re-send: same vector, no draw
            return prior.payload["s"]
        C, sigma = self._calibrate("train", inputs.rho, inputs.theta)
        self.ledger.check(self.ledger.entries, round=inputs.round, kind="train", mechanism="gaussian",
                          noise_multiplier=self.z)     # refuse before any work; re-checked in commit
        before = {k: np.array(v, copy=True) for k, v in self.update.get_state().items()}, self.update.rho_x
        s = self.update.step(inputs.q, inputs.y, inputs.rho, inputs.alpha, inputs.theta,   # v: clipped there
                             v=inputs.v, q_norm=inputs.q_norm)
        if self.config.noise_form == "paper":
            s_tilde = self.mechanism.release(round=inputs.round, kind="train", D=self.D, x=self.update.x)
            s_tilde = s + sigma * (s_tilde - s)        # mechanism drew at sigma=1: rescale
        else:
            s_tilde = np.clip(s, -self.config.c_s, self.config.c_s) + \
                sigma * self.mechanism.output_noise(inputs.round, "train", s.shape)
        try:
            self._finite("train", inputs.rho, release=s_tilde)
            self.update.commit(s_tilde)
            self.ledger.commit(self.run, inputs.round, "train", h, unit=self.unit, noise_multiplier=self.z,
                               sigma=sigma, sensitivity=C, payload={"s": s_tilde}, state=self.update.get_state())
        except BaseException:
            self.update.set_state(before[0])           # refused: the iterate is as it was
            self.update.rho_x = before[1]
            raise
        return s_tilde

    def final_update(self, q, y, rho, alpha=1.0, theta=1.0):
        """The x-update from the last message, kept inside the party (never released on
        training rows, so it costs nothing); the model release perturbs this x."""
        if self.x_released is not None:
            return                                     # the model is already out: x stays as released
        # not stored: the model release that follows in the same request stores it (a crash before
        # it restarts from the last training round's state, so the final step is never taken twice)
        self.update.step(q, y, rho, alpha, theta)

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
        C, sigma = self._calibrate("eval", self.update.rho_x, 1.0)
        self.ledger.check(self.ledger.entries, round=int(round), kind="eval", mechanism="gaussian",
                          noise_multiplier=self.z)
        xi = self.mechanism.rng(int(round), "eval").standard_normal(self.update.x.shape)
        x_tilde = self.update.x + sigma * xi
        self._finite("eval", self.update.rho_x, release=x_tilde)
        self.ledger.commit(self.run, int(round), "eval", inputs_digest, unit=self.unit, noise_multiplier=self.z,
                           sigma=sigma, sensitivity=C, payload={"x_tilde": x_tilde}, state=self.update.get_state())
        self._x_tilde = x_tilde
        return x_tilde

    @property
    def x_released(self):
        """The released model x~ of this run (None before the release): the only model
        block a private party ever shows; predictions are post-processing of it."""
        if self._x_tilde is None:
            ans = self.ledger.last_answer(self.run, "eval")
            if ans is not None:
                self._x_tilde = ans.payload["x_tilde"]
        return self._x_tilde

    def predict(self, D_eval):
        """D_eval x~ (rows normalized as in training): free once x~ is released."""
        if self.x_released is None:
            raise Refused(f"party {self.party_id} has not released its model yet")
        return released_scores(D_eval, self.x_released, private=True)     # every scoring site's function

    def eval_release(self, round, rho=None, theta=1.0, D_eval=None):
        """Scores of ``D_eval`` (default the party's held-out block) from x~, released once."""
        self.release_model(round)
        return self.D_test @ self.x_released if D_eval is None else self.predict(D_eval)

    def restore(self, state: dict | None = None):
        """Resume this run's iterate from the ledger's store (a restarted node) or from ``state``."""
        state = state if state is not None else self.ledger.get_state(self.run)
        if state:
            for k in ("x", "s"):      # a resume must keep the party's view: its block's columns and rows
                have, want = np.asarray(state.get(k, ())).size, getattr(self.update, k).size
                if k in state and have != want:
                    raise PlanViewChanged(
                        f"party {self.party_id} refuses to continue plan {self.run}: that plan's iterate "
                        f"{k} has {have} entries, this run's block gives {want} ({self.D.shape[0]} rows x "
                        f"{self.D.shape[1]} columns): a resume must keep the party's view (the same num-parties, "
                        "split, preprocessing and files as the run it continues); resume with the original run's "
                        "settings, or start a new run once this plan's reservation is released "
                        "(flower-vfl ledger --release-plan)", field="plan")
            self.update.set_state(state)

    def admit(self, token=None):
        """Admit this Flower run (``run``) to a plan on the party's disk: its own plan reserved, or
        the plan ``token`` names continued (a resume), or the one it was admitted to before. From
        then on ``run`` is the plan's ledger run (a resumed run's releases are the plan's) and the
        plan's iterate is restored. Returns ``(plan, how)`` (:meth:`Ledger.admit`); refuses with
        :class:`~flower_vfl.privacy.ledger.BudgetReserved` /
        :class:`~flower_vfl.privacy.ledger.PlanUnaffordable` when a new plan does not fit."""
        c = self.config
        plan, how = self.ledger.admit(self.run, train=c.train_rounds, eval=c.eval_rounds, noise_multiplier=self.z,
                                      token=token, expiry=c.plan_expiry)
        self.run = plan.plan
        self._x_tilde = None
        self.restore()
        return plan, how

    def affordability(self) -> dict:
        """Whether the budget left after every other run covers this run's plan (identify)."""
        c = self.config
        return self.ledger.affordable([("gaussian", self.z)] * (c.train_rounds + c.eval_rounds),
                                      exclude_run=self.run)

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
        """What the party tells the server and the run report: no data, no x, nothing about
        where its noise comes from."""
        cfg = {k: v for k, v in asdict(self.config).items() if k != "seed"}
        entries = self.ledger.entries
        this_run = [e for e in entries if e.run == self.run]
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
                       "releases_all_runs": len(entries)},
            "totals": self.ledger.totals(),
            "remaining_epsilon": self.ledger.remaining(),
        }
