"""A party's own privacy ledger: every release it makes, and the budget it will not exceed.

The data belongs to the party, so the ledger lives on the client. Every release of
``s̃_m`` counts, evaluation rounds included. Before a release the party asks
:meth:`PrivacyLedger.check_release`; if the total after the release would exceed
its configured ε (under its configured accounting method) it raises
:class:`BudgetExceeded`, whatever the server asked for. A re-sent request for a
round already recorded costs nothing (the mechanism returns the same vector).

Heterogeneous releases are allowed. ``"exact"`` composes multipliers ``z_t`` into one
Gaussian with ``1/z_eff² = Σ 1/z_t²``; ``"paper"`` composes the per-round Theorem 3
ε₀ by advanced composition with ``δ' = δ/2`` and ``δ₀ = δ/(2k)`` over the ``k``
releases made so far (a Gaussian release satisfies every point of its (ε₀, δ₀)
curve, so the split may be chosen when composing).

The ledger serialises to a JSON string (:meth:`to_json`) so it can live in Flower's
``context.state``.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import asdict, dataclass

import dp_accounting

from flower_vfl.privacy.boundary import Refused

from flower_vfl.privacy.accounting import (
    _check_delta,
    _check_method,
    _check_positive,
    _check_rounds,
    _paper_split,
    available_methods,
    composed_event,
    epsilon_for_releases,
    noise_multiplier_for,
    paper_round_epsilon,
)

__all__ = ["BudgetExceeded", "LedgerEntry", "PrivacyLedger", "calibrate_sigma"]

KINDS = ("train", "eval")
# float slack so a σ calibrated to the budget is not refused on its last round
_RTOL = 1e-9


class BudgetExceeded(Refused):
    """A release would take a party past its own privacy budget."""

    code = "budget"

    def __init__(self, party_id, *, round, kind, noise_multiplier, requested, spent,
                 budget, delta, method, releases):
        self.party_id = party_id
        self.round = round
        self.kind = kind
        self.noise_multiplier = noise_multiplier
        self.requested = requested
        self.spent = spent
        self.budget = budget
        self.delta = delta
        self.method = method
        super().__init__(
            f"party {party_id!r} refuses the {kind} release for round {round} "
            f"(noise multiplier z={noise_multiplier:.4g}): it would bring the total to "
            f"ε={requested:.4g}, above the budget ε={budget:g} (δ={delta:g}, "
            f"method={method!r}); already spent ε={spent:.4g} over {releases} release(s)"
        )


def calibrate_sigma(epsilon, delta, rounds, sensitivity, method="exact") -> float:
    """σ = z·C with z = :func:`noise_multiplier_for` (epsilon, delta, rounds, method)."""
    sensitivity = _check_positive("sensitivity", sensitivity)
    return noise_multiplier_for(epsilon, delta, rounds, method) * sensitivity


@dataclass(frozen=True)
class LedgerEntry:
    """One release. ``epsilon0``/``delta0``: Theorem 3 per-round (ε₀, δ₀), None if ε₀ > 1."""

    round: int
    kind: str
    sigma: float
    sensitivity: float
    noise_multiplier: float
    epsilon0: float | None
    delta0: float | None


class PrivacyLedger:
    """The releases of one party and its (ε, δ) budget.

    Parameters
    ----------
    party_id : int or str
        Who owns the data (used in messages and reports).
    epsilon : float
        Total ε budget (> 0) over all releases.
    delta : float
        Total δ budget, ``0 < delta < 1``.
    planned_rounds : int
        Planned number of releases, training and evaluation rounds included. Used to
        calibrate σ when ``sigma`` is not given, and for the per-round Theorem 3 view
        (δ₀ = δ / (2 planned_rounds)) stored with each entry.
    method : {"exact", "pld", "paper", "rdp", "prv"}, default="exact"
        The accountant that decides whether a release fits the budget.
    sensitivity : float, default=1.0
        L2 sensitivity C of one release (default for :meth:`record`).
    sigma : float or None, default=None
        Noise standard deviation (default for :meth:`record`). If None it is
        calibrated with :func:`calibrate_sigma` so that ``planned_rounds`` releases
        exactly spend the budget under ``method``.
    """

    def __init__(self, party_id, epsilon, delta, planned_rounds, method="exact",
                 sensitivity=1.0, sigma=None):
        self.party_id = party_id
        self.epsilon = _check_positive("epsilon", epsilon)
        self.delta = _check_delta(delta)
        self.planned_rounds = _check_rounds(planned_rounds)
        self.method = _check_method(method)
        if method not in available_methods():
            # fail now, not on the first release
            from flower_vfl.privacy.accounting import _import_opacus_accountants

            _import_opacus_accountants()
        self.sensitivity = _check_positive("sensitivity", sensitivity)
        if sigma is None:
            sigma = calibrate_sigma(self.epsilon, self.delta, self.planned_rounds,
                                    self.sensitivity, self.method)
        self.sigma = _check_positive("sigma", sigma)
        self.entries: list[LedgerEntry] = []

    # ------------------------------------------------------------------ queries

    @property
    def noise_multiplier(self) -> float:
        """Default z = sigma / sensitivity."""
        return self.sigma / self.sensitivity

    def _find(self, round, kind) -> LedgerEntry | None:
        for entry in self.entries:
            if entry.round == round and entry.kind == kind:
                return entry
        return None

    def _multipliers(self) -> list[float]:
        return [e.noise_multiplier for e in self.entries]

    def spent(self, method=None) -> float:
        """Total ε at the ledger's δ so far, by ``method`` (default: the ledger's)."""
        return epsilon_for_releases(self._multipliers(), self.delta, method or self.method)

    def epsilon_after(self, noise_multiplier, method=None) -> float:
        """Total ε if one more release at ``noise_multiplier`` were made."""
        z = _check_positive("noise_multiplier", noise_multiplier)
        return epsilon_for_releases(self._multipliers() + [z], self.delta, method or self.method)

    def can_release(self, noise_multiplier=None) -> bool:
        """Whether one more release at ``noise_multiplier`` (default: the ledger's) fits."""
        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        return self.epsilon_after(z) <= self.epsilon * (1.0 + _RTOL)

    def check_release(self, round, kind="train", sigma=None, sensitivity=None) -> float:
        """Total ε after the prospective release; raise :class:`BudgetExceeded` if too much.

        A round already recorded is a replay: it costs nothing and returns the current total.
        """
        round, kind, sigma, sensitivity = self._release_args(round, kind, sigma, sensitivity)
        if self._find(round, kind) is not None:
            return self.spent()
        z = sigma / sensitivity
        after = self.epsilon_after(z)
        if not after <= self.epsilon * (1.0 + _RTOL):
            raise BudgetExceeded(
                self.party_id, round=round, kind=kind, noise_multiplier=z, requested=after,
                spent=self.spent(), budget=self.epsilon, delta=self.delta,
                method=self.method, releases=len(self.entries),
            )
        return after

    def totals(self) -> dict[str, float]:
        """Total ε at the ledger's δ by every available method (opacus ones if installed)."""
        return {m: self.spent(m) for m in available_methods()}

    def dp_event(self) -> dp_accounting.DpEvent:
        """The dp-accounting event describing every release so far."""
        if not self.entries:
            return dp_accounting.NoOpDpEvent()
        return composed_event(self._multipliers())

    # ------------------------------------------------------------------ updates

    def _release_args(self, round, kind, sigma, sensitivity):
        if isinstance(round, bool) or not isinstance(round, numbers.Integral) or round < 0:
            raise ValueError(f"round={round!r} must be an integer >= 0")
        round = int(round)
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is not supported; accepted values: {KINDS}")
        sigma = self.sigma if sigma is None else _check_positive("sigma", sigma)
        sensitivity = (self.sensitivity if sensitivity is None
                       else _check_positive("sensitivity", sensitivity))
        return round, kind, sigma, sensitivity

    def record(self, round, kind="train", sigma=None, sensitivity=None) -> LedgerEntry:
        """Check and record one release; idempotent for a replayed (round, kind).

        Raises
        ------
        BudgetExceeded
            If the release would exceed the budget; nothing is recorded.
        ValueError
            If (round, kind) was already recorded with a different noise multiplier.
        """
        round, kind, sigma, sensitivity = self._release_args(round, kind, sigma, sensitivity)
        z = sigma / sensitivity
        previous = self._find(round, kind)
        if previous is not None:
            if not math.isclose(previous.noise_multiplier, z, rel_tol=1e-12):
                raise ValueError(
                    f"round={round} kind={kind!r} was already released at z="
                    f"{previous.noise_multiplier:.6g}; a replay must use the same noise, got z={z:.6g}"
                )
            return previous
        self.check_release(round, kind, sigma, sensitivity)
        delta0, _ = _paper_split(self.delta, self.planned_rounds)
        eps0 = paper_round_epsilon(z, delta0)
        entry = LedgerEntry(
            round=round, kind=kind, sigma=sigma, sensitivity=sensitivity, noise_multiplier=z,
            epsilon0=None if math.isinf(eps0) else eps0,
            delta0=None if math.isinf(eps0) else delta0,
        )
        self.entries.append(entry)
        return entry

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict:
        """A JSON-serialisable snapshot (no totals; recompute them with :meth:`totals`)."""
        return {
            "party_id": self.party_id,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "planned_rounds": self.planned_rounds,
            "method": self.method,
            "sensitivity": self.sensitivity,
            "sigma": self.sigma,
            "entries": [asdict(e) for e in self.entries],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "PrivacyLedger":
        ledger = cls(data["party_id"], data["epsilon"], data["delta"], data["planned_rounds"],
                     method=data["method"], sensitivity=data["sensitivity"], sigma=data["sigma"])
        ledger.entries = [LedgerEntry(**e) for e in data["entries"]]
        return ledger

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "PrivacyLedger":
        return cls.from_dict(json.loads(text))

    def __repr__(self) -> str:
        return (f"PrivacyLedger(party_id={self.party_id!r}, epsilon={self.epsilon:g}, "
                f"delta={self.delta:g}, method={self.method!r}, releases={len(self.entries)}, "
                f"spent={self.spent():.4g})")

