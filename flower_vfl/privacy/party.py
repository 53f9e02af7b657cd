"""A differentially private vertical party: Assumption 2 enforced, noise drawn, ledger kept.

No Flower imports: the Flower client and the in-process engine both use this class.

What the party does to make its sensitivity bound true whatever the server sends:
rows of D_m (train and test) normalized to unit norm; x_m constrained to the ball
||x|| <= b1; the x-update target v clipped entry-wise to [-c_v, c_v]; released values
clipped to [-c_s, c_s]. Training release: s~ = clip(D x) + N(0, sigma_t^2 I) with
sigma_t = z * C (C from the chosen calibration). Evaluation release: x~ = x + N(0,
sigma_e^2 I) with sigma_e = z * C_x and D_test x~ released (post-processing of x~).
Every release is recorded in the party's own ledger first; a release that would exceed
its budget raises :class:`~flower_vfl.privacy.ledger.BudgetExceeded`. A repeated
request for an answered (round, kind) returns the identical vector.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp

from ..core.party import PartyUpdate
from ..core.penalties import Ball, get_penalty
from .ledger import PrivacyLedger
from .accounting import noise_multiplier_for
from .mechanism import GaussianOutputMechanism
from .sensitivity import (NEIGHBOURING_RELATIONS, paper_sensitivity, strict_param_sensitivity,
                          strict_sensitivity)

__all__ = ["PrivacyConfig", "PrivateParty", "normalize_rows"]


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


def normalize_rows(D):
    """Scale every non-zero row to unit L2 norm (Assumption 2.3)."""
    if sp.issparse(D):
        D = sp.csr_matrix(D, dtype=float)
        norms = np.sqrt(np.asarray(D.multiply(D).sum(axis=1)).ravel())
        norms[norms == 0] = 1.0
        return sp.diags(1.0 / norms) @ D
    D = np.asarray(D, dtype=float)
    norms = np.linalg.norm(D, axis=1)
    norms[norms == 0] = 1.0
    return D / norms[:, None]


class PrivateParty:
    """One party's private x-update and releases.

    Parameters
    ----------
    D, D_test : (N, d_m) and (N_test, d_m) blocks (normalized here).
    lam : float
        L2 coefficient (> 0: the strict bound needs strong convexity).
    config : PrivacyConfig
    party_id : int
    n_parties : int
        M, for the paper's Lemma 1.
    """

    def __init__(self, D, D_test, lam, config: PrivacyConfig, party_id=0, n_parties=2):
        self.config = config.validate()
        lam = lam if config.lam is None else config.lam
        if not lam > 0:
            raise ValueError(f"a private party needs lam > 0 (strong convexity of its x-update); got lam={lam!r}")
        self.party_id = party_id
        self.n_parties = n_parties
        self.lam = float(lam)
        self.D = normalize_rows(D)
        self.D_test = None if D_test is None else normalize_rows(D_test)
        self.update = PartyUpdate(self.D, get_penalty("l2"), lam, Ball(config.b1), v_clip=config.c_v)
        releases = config.train_rounds + config.eval_rounds
        #: one noise multiplier for every planned release, from the party's accountant
        self.z = noise_multiplier_for(config.epsilon, config.delta, releases, config.accountant)
        self.ledger = PrivacyLedger(party_id, config.epsilon, config.delta, releases,
                                    method=config.accountant, sensitivity=1.0, sigma=self.z)
        self.mechanism = GaussianOutputMechanism(1.0, party_id, seed=config.seed,
                                                 form=config.noise_form)
        self.answered: dict[tuple[int, str], np.ndarray] = {}

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
    def train_release(self, round, q, y, rho, alpha=1.0, theta=1.0):
        """x-update (eq. 6) then the noisy release s~ (eq. 16 with output noise)."""
        key = (int(round), "train")
        if key in self.answered:                       # replay: same vector, no new draw
            return self.answered[key]
        C = self.sensitivity(rho, theta, "train")
        sigma = self.z * C
        self.ledger.record(round, "train", sigma=sigma, sensitivity=C)   # refuses over budget
        s = self.update.step(q, y, rho, alpha, theta)
        if self.config.noise_form == "paper":
            s_tilde = self.mechanism.release(round=round, kind="train", D=self.D, x=self.update.x)
            s_tilde = s + sigma * (s_tilde - s)        # mechanism drew at sigma=1: rescale
        else:
            s_tilde = np.clip(s, -self.config.c_s, self.config.c_s) + \
                sigma * self.mechanism.output_noise(round, "train", s.shape)
        self.update.commit(s_tilde)
        self.answered[key] = s_tilde
        return s_tilde

    def eval_release(self, round, rho, theta=1.0, D_eval=None):
        """D_test x~ with x~ = x + N(0, sigma_e^2 I): a post-processing of the private x~."""
        key = (int(round), "eval")
        if key in self.answered:
            return self.answered[key]
        D_eval = self.D_test if D_eval is None else normalize_rows(D_eval)
        # C_x depends on the rho_x that produced x, whatever rho this request carries: a
        # server sending a smaller rho now must not shrink the noise
        rho_x = self.update.rho_x if self.update.rho_x is not None else rho / theta
        C = self.sensitivity(rho_x, 1.0, "eval")
        sigma = self.z * C
        self.ledger.record(round, "eval", sigma=sigma, sensitivity=C)
        xi = self.mechanism.rng(round, "eval").standard_normal(self.update.x.shape)
        out = D_eval @ (self.update.x + sigma * xi)
        self.answered[key] = out
        return out

    def final_update(self, q, y, rho, alpha=1.0, theta=1.0):
        """The x-update from the last message, kept inside the party (never released on
        training rows, so it costs nothing); later evaluation releases perturb this x."""
        self.update.step(q, y, rho, alpha, theta)

    # same read-only view as PartyUpdate, for the engine's objective
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
        return {
            "party_id": self.party_id,
            "config": asdict(self.config),
            "neighbouring_relation": NEIGHBOURING_RELATIONS[self.config.calibration],
            "noise_multiplier": self.z,
            "ledger": self.ledger.to_dict(),
            "totals": self.ledger.totals(),
        }
