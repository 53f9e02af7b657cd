"""Distributed noise inside the secure sum: each private party adds a share of Skellam noise.

Issue 21 item 3; docs/privacy.md ("Distributed noise") gives the trust model. No Flower imports.

A party that opts in (its node config's ``dp-distributed-max-colluders = k``; never the run config)
accepts that the central node colludes with at most k of the other parties of a sum. Its training
release then goes into the secure sum (:mod:`flower_vfl.secagg`) as an integer vector carrying only
its *share* of the noise:

1. clip: s = clip(D_m x_m, -c_s, c_s) (the party's release, as in :mod:`flower_vfl.privacy.party`);
2. quantize: r = round(gamma s), gamma = 2^j a power of two (:func:`noise_bits`; j <= the roster's
   fixed-point exponent, so the secure sum carries r * 2^(k_fp - j) exactly);
3. noise share: r + Sk(v_share), v_share = v / h, where Sk(v) is the symmetric Skellam noise of
   variance v per entry (Poisson(v/2) - Poisson(v/2)), and h = max(1, A - k) with A the number of
   parties of the sum that add shares under the same profile (every one of them declared it in its
   signed key advert). The addition is in Z_{2^64}: nothing is clipped after the noise, so what the
   central node decodes is the modular sum, a post-processing of sum_m (r_m + Sk_m).

A sum of independent Skellams is Skellam, so the h honest shares carry Sk(v): the noise one party
alone would add. The privacy of party m's release in the integer domain (Agarwal, Kairouz & Liu 2021,
"The Skellam Mechanism for Differentially Private Federated Learning", Corollary 3.6; integer
alpha > 1, v the per-entry variance):

    eps(alpha) <= alpha D2^2 / (2 v) + min(((2 alpha - 1) D2^2 + 6 D1) / (4 v^2), 3 D1 / (2 v)),

with the integer sensitivities after rounding (:func:`integer_sensitivity`): each entry's rounding
moves it by at most 1/2, so two neighbours' encodings differ by at most gamma C + sqrt(n) in L2 and
sqrt(n) times that in L1 (C the real-valued L2 sensitivity of s, n its length).

Two guarantees are recorded for every release (:class:`DistributedNoise`):

- against the central node with k colluders: the h honest shares, variance h v_share = v;
- against the central node alone: every share of the sum, variance A v_share.

The charge against the party's budget is the first (the weaker): the party's own node config says
the central node may have k colluders, so that is the guarantee it holds. In vertical ADMM every
party receives the broadcast, from which the sum can be recovered, so a curious *other party* is in
the colluder's position too: k = 0 also assumes that no other party of the sum attacks its view.

Accounting: the bound above is dominated, at every integer order alpha >= 2, by the Gaussian RDP
curve alpha / (2 z^2) of :func:`dominating_multiplier`; the ledger stores that z with mechanism
``"skellam"`` and composes every release by RDP at integer orders, converted to (eps, delta) by
dp-accounting (:func:`flower_vfl.privacy.accounting.epsilon_rdp`). The party calibrates z with
the same accountant (:func:`flower_vfl.privacy.accounting.noise_multiplier_rdp`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from flower_vfl.privacy.accounting import INTEGER_ORDERS, check_positive, noise_multiplier_rdp
from flower_vfl.privacy.boundary import Refused
from flower_vfl.privacy.party import PrivacyConfig, PrivateParty

__all__ = ["DistributedNoise", "DistributedParty", "DistributedRefused", "skellam_rdp", "integer_sensitivity",
           "dominating_multiplier", "variance_for", "noise_bits", "skellam_noise", "MAX_VARIANCE",
           "INFLATION_BITS", "NODE_KEY", "PROFILE_TAG", "profile"]

#: the node-config key (a party's own, never the run config's)
NODE_KEY = "dp-distributed-max-colluders"
#: gamma C >= 2^INFLATION_BITS sqrt(n): the rounding adds at most 2^-INFLATION_BITS (0.1 %) to D2
INFLATION_BITS = 10
#: Poisson means stay far inside numpy's int64 sampler
MAX_VARIANCE = 1e17
#: the distributed-noise profile's version tag (the optional field of a secure-aggregation key advert)
PROFILE_TAG = "skellam/v1"


class DistributedRefused(Refused):
    """A distributed release the party will not make (settings, roster or range)."""

    code = "distributed"


def _check_int(name, v, lo=0):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise ValueError(f"{name}={v!r} must be an integer >= {lo}")
    return int(v)


def skellam_rdp(alpha, l1, l2, variance) -> float:
    """Agarwal, Kairouz & Liu (2021), Corollary 3.6: RDP of order ``alpha`` (integer > 1) of the
    multidimensional Skellam mechanism of per-entry variance ``variance`` for integer vectors of
    L1 / L2 sensitivity ``l1`` / ``l2``."""
    a = _check_int("alpha", alpha, 2)
    l1, l2, v = float(l1), float(l2), float(variance)
    return a * l2 * l2 / (2 * v) + min(((2 * a - 1) * l2 * l2 + 6 * l1) / (4 * v * v), 3 * l1 / (2 * v))


def dominating_multiplier(l1, l2, variance) -> float:
    """z with alpha / (2 z^2) >= :func:`skellam_rdp` (alpha, l1, l2, variance) at every integer alpha >= 2:
    1/z^2 = l2^2 / v + (2 l2^2 + 6 l1) / (2 v^2), since (2 alpha - 1) l2^2 + 6 l1 <= alpha (2 l2^2 + 6 l1)."""
    l1, l2, v = (check_positive(n, x) for n, x in (("l1", l1), ("l2", l2), ("variance", variance)))
    return 1.0 / math.sqrt(l2 * l2 / v + (2 * l2 * l2 + 6 * l1) / (2 * v * v))


def variance_for(z, l1, l2) -> float:
    """The smallest per-entry variance v whose :func:`dominating_multiplier` is >= z."""
    z, l1, l2 = (check_positive(n, x) for n, x in (("z", z), ("l1", l1), ("l2", l2)))
    a, b, c = (2 * l2 * l2 + 6 * l1) / 2.0, l2 * l2, 1.0 / (z * z)
    x = 2 * c / (b + math.sqrt(b * b + 4 * a * c))         # 1/v, the positive root of a x^2 + b x - c (stable)
    v = 1.0 / x
    while dominating_multiplier(l1, l2, v) < z:              # float rounding: never below z
        v = math.nextafter(v, math.inf)
    return v


def integer_sensitivity(C, gamma, n) -> tuple[float, float]:
    """(D1, D2) of round(gamma s) when s moves by at most C in L2 (n entries, deterministic rounding):
    D2 = gamma C + sqrt(n), D1 = sqrt(n) D2."""
    C, gamma = check_positive("C", C), check_positive("gamma", gamma)
    n = _check_int("n", n, 1)
    l2 = gamma * C + math.sqrt(n)
    return math.sqrt(n) * l2, l2


def noise_bits(C, n, max_bits) -> int:
    """j with gamma = 2^j: the smallest j >= 0 with gamma C >= 2^INFLATION_BITS sqrt(n), at most ``max_bits``
    (the roster's fixed-point exponent: the secure sum must carry round(gamma s) exactly)."""
    C = check_positive("C", C)
    n, max_bits = _check_int("n", n, 1), _check_int("max_bits", max_bits, 0)
    j = max(0, math.ceil(math.log2(2.0 ** INFLATION_BITS * math.sqrt(n) / C)))
    return min(j, max_bits)


def skellam_noise(rng: np.random.Generator, variance: float, shape) -> np.ndarray:
    """Symmetric Skellam noise of per-entry variance ``variance``: Poisson(v/2) - Poisson(v/2), int64."""
    v = check_positive("variance", variance)
    if v > MAX_VARIANCE:
        raise ValueError(f"variance={v:g} is above {MAX_VARIANCE:g}: use a coarser quantization (fewer noise bits)")
    return rng.poisson(v / 2.0, shape).astype(np.int64) - rng.poisson(v / 2.0, shape).astype(np.int64)


def profile(config: PrivacyConfig, lam: float, colluders: int) -> bytes:
    """The profile a party declares in its signed key advert: everything that fixes its plan
    (:meth:`DistributedNoise.plan`) for a given broadcast, i.e. k, the budget and its split, the
    clips, the ball and the party's own lam. Parties of one sum whose verified adverts carry the
    same profile draw the same share on the same lattice 2^-j for every broadcast (n, rho and theta
    are the message's, the fixed-point exponent the roster's): only they count as adders."""
    k = _check_int(NODE_KEY, colluders, 0)
    c = config
    fields = (PROFILE_TAG, f"k={k}", f"eps={float(c.epsilon)!r}", f"delta={float(c.delta)!r}",
              f"T={int(c.train_rounds)}", f"E={int(c.eval_rounds)}", f"b1={float(c.b1)!r}", f"c_v={float(c.c_v)!r}",
              f"c_s={float(c.c_s)!r}", f"lam={float(lam)!r}", f"cal={c.calibration}", f"form={c.noise_form}")
    return ";".join(fields).encode()


@dataclass(frozen=True)
class DistributedNoise:
    """One distributed release's plan: quantization, noise share and the two guarantees.

    Parameters
    ----------
    n : int              entries of the release
    sensitivity : float  C, the L2 sensitivity of the clipped real release s
    z : float            target multiplier (from the party's RDP calibration) against the central node
                         with ``colluders`` colluders
    adders : int         A, parties of the sum that add shares under this profile (this party included)
    colluders : int      k, from the party's node config
    bits : int           j, gamma = 2^j (:func:`noise_bits`)
    """

    n: int
    sensitivity: float
    z: float
    adders: int
    colluders: int
    bits: int

    def __post_init__(self):
        _check_int("n", self.n, 1)
        check_positive("sensitivity", self.sensitivity)
        check_positive("z", self.z)
        _check_int("adders", self.adders, 1)
        _check_int("colluders", self.colluders, 0)
        _check_int("bits", self.bits, 0)

    @classmethod
    def plan(cls, n, sensitivity, z, adders, colluders, max_bits) -> "DistributedNoise":
        return cls(int(n), float(sensitivity), float(z), int(adders), int(colluders),
                   noise_bits(sensitivity, n, max_bits))

    @property
    def gamma(self) -> float:
        return float(2.0 ** self.bits)

    @property
    def l1_l2(self) -> tuple[float, float]:
        return integer_sensitivity(self.sensitivity, self.gamma, self.n)

    @property
    def honest(self) -> int:
        """h = max(1, A - k): the shares that are certainly not the colluders' (this party's included)."""
        return max(1, self.adders - self.colluders)

    @property
    def variance(self) -> float:
        """v, the variance per entry the h honest shares must carry together."""
        return variance_for(self.z, *self.l1_l2)

    @property
    def share(self) -> float:
        """This party's share v / h."""
        return self.variance / self.honest

    def multiplier(self, shares: int) -> float:
        """The dominating multiplier of ``shares`` shares of noise (the ledger's z)."""
        return dominating_multiplier(*self.l1_l2, shares * self.share)

    @property
    def z_colluding(self) -> float:
        """Against the central node with k colluders (h shares): the charged guarantee, >= z."""
        return self.multiplier(self.honest)

    @property
    def z_own(self) -> float:
        """Against the central node colluding with every other party (this party's share only): for
        information, what the strict model of item 2 would grant this release."""
        return self.multiplier(1)

    @property
    def z_server(self) -> float:
        """Against the central node alone (every one of the A shares)."""
        return self.multiplier(self.adders)

    def encode(self, s, c_s, rng) -> np.ndarray:
        """round(gamma clip(s, c_s)) + Sk(share), int64 (the caller adds it into Z_{2^64})."""
        s = np.clip(np.asarray(s, dtype=np.float64), -c_s, c_s)
        if s.shape != (self.n,):
            raise ValueError(f"release of shape {s.shape}; the plan is for ({self.n},)")
        return np.rint(s * self.gamma).astype(np.int64) + skellam_noise(rng, self.share, s.shape)

    def summary(self) -> dict:
        l1, l2 = self.l1_l2
        return {"mechanism": "distributed Skellam (integer domain, inside the secure sum)", "n": self.n,
                "sensitivity": self.sensitivity, "gamma_bits": self.bits, "l1_int": l1, "l2_int": l2,
                "adders": self.adders, "colluders": self.colluders, "honest_shares": self.honest,
                "variance_total": self.variance, "variance_share": self.share,
                "z_target": self.z, "z_colluding": self.z_colluding, "z_server": self.z_server, "z_own": self.z_own,
                "orders": f"integer {INTEGER_ORDERS[0]}..{INTEGER_ORDERS[-1]}"}


class DistributedParty(PrivateParty):
    """A private party whose training releases carry only its share of the noise (secure sum only).

    Same x-update, clips, model release and ledger as :class:`PrivateParty`; the differences:

    - ``z`` is calibrated by the RDP accountant at integer orders for ``train_rounds + eval_rounds``
      releases (the ledger composes Skellam releases that way);
    - :meth:`distributed_release` returns the integer vector round(gamma s) + Sk(share) for the secure
      sum and charges the ledger with the guarantee against the central node and ``colluders`` colluders
      (mechanism ``"skellam"``); the stored payload keeps both guarantees.

    ``colluders`` is k from the party's node config (:data:`NODE_KEY`).
    """

    def __init__(self, D, D_test, lam, config: PrivacyConfig, colluders: int, party_id=0, n_parties=2,
                 store=None, run="local", source=None, about=None):
        super().__init__(D, D_test, lam, config, party_id, n_parties, store, run, source, about)
        if config.calibration != "strict" or config.noise_form != "output":
            raise ValueError("distributed noise needs calibration='strict' and noise_form='output'")
        self.colluders = _check_int(NODE_KEY, colluders, 0)
        self.z = noise_multiplier_rdp(config.epsilon, config.delta, config.train_rounds + config.eval_rounds)
        self.unit = "strict:row:distributed"
        self.last_plan: DistributedNoise | None = None

    def distributed_release(self, round, q, y, rho, *, adders: int, max_bits: int, alpha=1.0, theta=1.0,
                            inputs=None) -> np.ndarray:
        """x-update (eq. 6), then round(gamma clip(s)) + Sk(share) as int64, charged and durable first.

        ``adders``: parties of this sum (this one included) whose verified adverts declare the same
        distributed profile; ``max_bits``: the roster's fixed-point exponent. An identical re-send gets
        the stored vector."""
        from flower_vfl.privacy.boundary import RoundInputs, inputs_hash
        inputs = inputs or RoundInputs(int(round), float(rho), float(alpha), float(theta),
                                       np.asarray(q, float), np.asarray(y, float), False)
        h = inputs_hash(self.run, "train", inputs)
        prior = self._check_request("train", inputs, h)
        if prior is not None:
            return prior.payload["s_int"]
        C, _ = self._calibrate("train", inputs.rho, inputs.theta)
        plan = DistributedNoise.plan(self.D.shape[0], C, self.z, adders, self.colluders, max_bits)
        z_charge = plan.z_colluding
        if plan.share > MAX_VARIANCE:
            raise DistributedRefused(f"party {self.party_id}: the noise share {plan.share:.3g} is too large to "
                                     "draw; refused, nothing charged")
        self.ledger.check(self.ledger.entries, round=inputs.round, kind="train", mechanism="skellam",
                          noise_multiplier=z_charge)
        before = {k: np.array(v, copy=True) for k, v in self.update.get_state().items()}, self.update.rho_x
        s = self.update.step(inputs.q, inputs.y, inputs.rho, inputs.alpha, inputs.theta,
                             v=inputs.v, q_norm=inputs.q_norm)
        s_int = plan.encode(s, self.config.c_s, self.mechanism.rng(inputs.round, "train"))
        own = s_int / plan.gamma                    # this party's term of the sum (its last release)
        try:
            self.update.commit(own)
            guarantees = np.array([plan.z_colluding, plan.z_server, plan.adders, plan.colluders, plan.bits,
                                   plan.share, plan.variance], dtype=float)
            self.ledger.commit(self.run, inputs.round, "train", h, unit=self.unit, noise_multiplier=z_charge,
                               sigma=math.sqrt(plan.honest * plan.share) / plan.gamma, sensitivity=C,
                               mechanism="skellam", payload={"s_int": s_int, "s": own, "guarantees": guarantees},
                               state=self.update.get_state())
        except BaseException:
            self.update.set_state(before[0])
            self.update.rho_x = before[1]
            raise
        self.last_plan = plan
        return s_int

    def train_release(self, *args, **kwargs):
        raise DistributedRefused(f"party {self.party_id} adds only its share of the noise ({NODE_KEY} is set in "
                                 "its node config): its training release goes into a secure sum only; refused "
                                 "in the clear")

    def guarantees(self) -> list[dict]:
        """Per distributed release of this run: the charged (colluding) and the server-alone guarantee."""
        out = []
        for e in self.ledger.entries:
            if e.run != self.run or e.mechanism != "skellam":
                continue
            g = self.ledger.answer(self.run, e.round, "train").payload["guarantees"]
            out.append({"round": e.round, "z_colluding": float(g[0]), "z_server": float(g[1]), "adders": int(g[2]),
                        "colluders": int(g[3]), "gamma_bits": int(g[4]), "variance_share": float(g[5])})
        return out

    def report(self) -> dict:
        rep = super().report()
        from flower_vfl.privacy.accounting import epsilon_rdp
        rel = self.guarantees()
        delta = self.config.delta
        others = [("gaussian" if e.mechanism == "gaussian" else e.mechanism, e.noise_multiplier)
                  for e in self.ledger.entries if e.mechanism != "skellam" and e.noise_multiplier > 0]
        rep["distributed"] = {
            "node_config": {NODE_KEY: self.colluders},
            "releases": rel,
            "epsilon_charged_colluding": epsilon_rdp(others + [("skellam", r["z_colluding"]) for r in rel], delta),
            "epsilon_server_alone": epsilon_rdp(others + [("skellam", r["z_server"]) for r in rel], delta),
            "charge": "the guarantee against the central node with k colluders (the party's own assumption)",
        }
        return rep
