"""A party's one ledger: every release on its declared data source, and the budget it keeps.

The data belongs to the party, so the ledger lives on the party's disk, in its
:class:`~flower_vfl.privacy.store.PartyStore`, under the *source key* of the data its node
config declares (:mod:`flower_vfl.clients.source`). Every release on any view of that
source (any run, row order, subset, column split, ``num-parties``, preprocessing or agent
split) is a row of the same ledger, and a release is charged by :meth:`Ledger.commit`:
the budget is re-checked against every row on the source inside the store's write lock
and the release is durable before it is returned. There is no other way to charge.

Releases may differ: a ledger composes Gaussian releases of any noise multipliers with the
party's accountant (``"exact"``: ``1/z_eff² = Σ 1/z_t²``; ``"paper"``: Theorem 3 +
advanced composition; ``"pld"``, ``"rdp"``, ``"prv"``), and a mix of Gaussian and Laplace
releases (the horizontal agents) in one privacy-loss distribution
(:func:`~flower_vfl.privacy.accounting.epsilon_for_events`).

No Flower imports.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flower_vfl.privacy.accounting import (
    check_delta,
    check_method,
    check_positive,
    available_methods,
    epsilon_for_events,
)
from flower_vfl.privacy.boundary import Refused
from flower_vfl.privacy.store import Answer, PartyStore, Plan

__all__ = ["Budget", "BudgetExceeded", "BudgetReserved", "KINDS", "PlanUnaffordable", "Ledger", "PLAN_EXPIRY"]

#: seconds without a release or an identify after which an open plan's reservation lapses (node config
#: ``dp-plan-expiry``): a run that died and is never resumed does not hold the party's budget forever
PLAN_EXPIRY = 86400.0

KINDS = ("train", "eval")
# float slack so a σ calibrated to the budget is not refused on its last round
_RTOL = 1e-9


class BudgetExceeded(Refused):
    """A release would take a party past its own privacy budget."""

    code = "budget"

    def __init__(self, party_id, *, round, kind, noise_multiplier, requested, spent,
                 budget, delta, method, releases, reserved=None):
        self.party_id = party_id
        self.round = round
        self.kind = kind
        self.noise_multiplier = noise_multiplier
        self.requested = requested
        self.spent = spent
        self.budget = budget
        self.delta = delta
        self.method = method
        self.releases = releases
        super().__init__(
            f"party {party_id!r} refuses the {kind} release for round {round} "
            f"(noise multiplier z={noise_multiplier:.4g}): it would bring the total to "
            f"ε={requested:.4g}, above the budget ε={budget:g} (δ={delta:g}, "
            f"method={method!r}); already spent ε={spent:.4g} over {releases} release(s)"
            + ("" if reserved is None else f"; with what other runs' open plans reserved, ε={reserved:.4g} "
               "of the budget is taken")
        )


class BudgetReserved(Refused):
    """A new run's plan does not fit beside the plans other runs reserved (two runs at once)."""

    code = "budget"


class PlanUnaffordable(Refused):
    """A new run's plan does not fit in what the releases already made left of the budget."""

    code = "budget"


@dataclass(frozen=True)
class Budget:
    """A party's (ε, δ) budget over all its releases on one source, and its accountant."""

    epsilon: float
    delta: float
    accountant: str = "exact"

    def __post_init__(self):
        check_positive("epsilon", self.epsilon)
        check_delta(self.delta)
        check_method(self.accountant)
        if self.accountant not in available_methods():      # fail now, not on the first release
            from flower_vfl.privacy.accounting import import_opacus_accountants
            import_opacus_accountants()


def _events(entries):
    return [(e.mechanism, e.noise_multiplier) for e in entries if e.noise_multiplier > 0]


class Ledger:
    """The releases of one party on one declared source, and its budget.

    Parameters
    ----------
    store : PartyStore
        The party's own store (``":memory:"`` for the in-process engine).
    source : str
        The source key (:func:`flower_vfl.clients.source.declared_source`); every release
        on this key composes here, whatever run or view it came from.
    budget : Budget
    party_id : int or str
        Who owns the data (in refusals and reports).
    about : dict, optional
        What the source is (kept in the store for ``flower-vfl ledger``).
    note : bool, default=True
        Record ``budget`` and ``about`` as the source's current settings (False: a read-only
        view, e.g. ``flower-vfl ledger``).
    """

    def __init__(self, store: PartyStore, source: str, budget: Budget, party_id, about: dict | None = None,
                 note: bool = True):
        self.store, self.source, self.budget, self.party_id = store, str(source), budget, party_id
        if note:
            store.note_source(self.source, {"epsilon": budget.epsilon, "delta": budget.delta,
                                            "accountant": budget.accountant, "party_id": party_id,
                                            "about": dict(about or {})})

    # ------------------------------------------------------------------ queries
    @property
    def entries(self) -> list[Answer]:
        """Every charged release on the source, all runs, oldest first."""
        return self.store.entries(self.source)

    def epsilon_of(self, entries, method=None) -> float:
        """ε at the budget's δ of ``entries`` (stored releases), by ``method`` (default: the budget's)."""
        return epsilon_for_events(_events(entries), self.budget.delta, method or self.budget.accountant)

    def spent(self, method=None) -> float:
        """Total ε at the budget's δ over every release on the source."""
        return self.epsilon_of(self.entries, method)

    def totals(self) -> dict[str, float]:
        """Total ε by every available method that can compose this ledger's mechanisms."""
        entries = self.entries
        mixed = any(e.mechanism != "gaussian" for e in entries)
        methods = ("exact", "pld") if mixed else available_methods()
        return {m: self.epsilon_of(entries, m) for m in methods}

    def remaining(self) -> float:
        return max(0.0, self.budget.epsilon - self.spent())

    def affordable(self, plan: list[tuple[str, float]], exclude_run=None) -> dict:
        """Whether the releases ``plan`` ((mechanism, z) each) fit on top of what releases of
        other runs than ``exclude_run`` spent and what other runs' open plans reserved (identify:
        can this run's plan be afforded?)."""
        before = [e for e in self.entries if str(e.run) != str(exclude_run)]
        b = self.budget
        reserved = self.store.reserved_events(self.source, exclude_plan=exclude_run)
        after = epsilon_for_events(_events(before) + reserved + list(plan), b.delta, b.accountant)
        return {"epsilon": float(b.epsilon), "spent_before_run": float(self.epsilon_of(before)),
                "affordable": bool(after <= b.epsilon * (1 + _RTOL))}

    def answer(self, run, round, kind) -> Answer | None:
        return self.store.answer(self.source, run, round, kind)

    def last_answer(self, run, kind) -> Answer | None:
        return self.store.last_answer(self.source, run, kind)

    def last_round(self, run, kind) -> int | None:
        return self.store.last_round(self.source, run, kind)

    def get_state(self, run) -> dict | None:
        return self.store.get_state(self.source, run)

    def put_state(self, run, arrays: dict):
        self.store.put_state(self.source, run, arrays)

    # ------------------------------------------------------------------ plans
    def plan_of(self, run) -> Plan | None:
        """The plan the Flower run ``run`` was admitted to, or None."""
        return self.store.plan_of(self.source, run)

    def admit(self, run, *, train: int, eval: int, noise_multiplier: float, mechanism="gaussian", token=None,
              expiry=PLAN_EXPIRY) -> tuple[Plan, str]:
        """Admit the Flower run ``run``: its plan of ``train`` + ``eval`` releases at ``noise_multiplier``
        is reserved, or the plan ``token`` names is continued (a resume: its releases, its allowance;
        re-checked only when the plan had lapsed, since its reservation was given up then), or the
        run was admitted before. Returns ``(plan, how)``
        (:meth:`PartyStore.admit_plan`). A new plan that does not fit beside the releases made and
        the other open plans is refused: :class:`BudgetReserved` naming the runs that hold the
        reservations, or :class:`PlanUnaffordable` when nothing is reserved."""
        b, n = self.budget, int(train) + int(eval)
        new = [(mechanism, float(noise_multiplier))] * n

        def decide(entries, open_plans, reopen=None):
            # reopen: a lapsed plan a resume continues; what must fit again is its unmade releases
            if reopen is None:
                ask, what, this = new, f"its plan of {n} release(s)", f"this run's plan of {n} release(s)"
            else:
                ask = replace(reopen, status="open").reserved_events()
                gave_up = "it lapsed" if reopen.status == "lapsed" else "the party's operator released it"
                what = this = (f"the {reopen.status} plan of run {reopen.plan} it resumes ({reopen.made} of "
                               f"{reopen.train + reopen.eval} planned releases made, {len(ask)} left; its "
                               f"reservation was given up when {gave_up})")
            events = _events(entries)
            reserved = [e for p in open_plans for e in p.reserved_events()]
            after = epsilon_for_events(events + reserved + ask, b.delta, b.accountant)
            if after <= b.epsilon * (1.0 + _RTOL):
                return
            spent = epsilon_for_events(events, b.delta, b.accountant)
            holders = [p for p in open_plans if p.reserved_events()]
            if not holders:
                raise PlanUnaffordable(
                    f"party {self.party_id!r} refuses run {run}: {what} would bring its total to "
                    f"ε={after:.4g}, above the budget ε={b.epsilon:g} (δ={b.delta:g}, method={b.accountant!r}); "
                    f"already spent ε={spent:.4g} over {len(entries)} release(s)")
            held = epsilon_for_events(events + reserved, b.delta, b.accountant)
            names = ", ".join(f"run {p.runs[-1] if p.runs else p.plan} ({p.made} of {p.train + p.eval} planned "
                              "releases made)" for p in holders)
            raise BudgetReserved(
                f"party {self.party_id!r} refuses run {run}: its budget is reserved by {names}. With that "
                f"reservation ε={held:.4g} of its budget ε={b.epsilon:g} is taken (δ={b.delta:g}, "
                f"method={b.accountant!r}; spent ε={spent:.4g}), and {this} would "
                f"bring it to ε={after:.4g}. Wait for that run to end, or resume it (resume='<its state-dir>'); "
                f"a reservation whose run made no release (nor a first resume since) for dp-plan-expiry={float(expiry):g} s "
                "(the party's node config) lapses")

        return self.store.admit_plan(self.source, run, mechanism=mechanism, noise_multiplier=float(noise_multiplier),
                                     train=int(train), eval=int(eval), token=token, decide=decide, expiry=expiry)

    # ------------------------------------------------------------------ the one charge
    def check(self, entries, *, round, kind, mechanism, noise_multiplier, reserved=()):
        """Raise :class:`BudgetExceeded` if one more release at ``noise_multiplier`` on top of
        ``entries`` (and the ``reserved`` events of other runs' open plans) would exceed the
        budget; return the total after it."""
        b = self.budget
        events = _events(entries)
        if noise_multiplier == 0:
            return epsilon_for_events(events, b.delta, b.accountant)
        after = epsilon_for_events(events + list(reserved) + [(mechanism, noise_multiplier)], b.delta, b.accountant)
        if not after <= b.epsilon * (1.0 + _RTOL):
            held = epsilon_for_events(events + list(reserved), b.delta, b.accountant) if reserved else None
            raise BudgetExceeded(self.party_id, round=round, kind=kind, noise_multiplier=noise_multiplier,
                                 requested=after, spent=epsilon_for_events(events, b.delta, b.accountant),
                                 budget=b.epsilon, delta=b.delta, method=b.accountant, releases=len(entries),
                                 reserved=held)
        return after

    def commit(self, run, round, kind, inputs_hash, *, unit, noise_multiplier, sigma, sensitivity,
               payload: dict, mechanism="gaussian", state: dict | None = None) -> Answer:
        """Check the budget and store the release in one durable transaction; refuse
        (:class:`BudgetExceeded`, nothing written) if it does not fit. The caller sends the
        payload only after this returns."""
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is not supported; accepted values: {KINDS}")
        if sensitivity == 0 and noise_multiplier == 0:
            z = 0.0            # nothing data-dependent released (e.g. an agent whose residuals vanished): free
        else:
            z = check_positive("noise_multiplier", noise_multiplier)

        def check(entries):
            # what other runs' open plans reserved is not this release's to spend (inside the write lock)
            self.check(entries, round=round, kind=kind, mechanism=mechanism, noise_multiplier=z,
                       reserved=self.store.reserved_events(self.source, exclude_plan=run))

        return self.store.commit_release(self.source, run, round, kind, inputs_hash, unit=unit, mechanism=mechanism,
                                         noise_multiplier=z, sigma=sigma, sensitivity=sensitivity, payload=payload,
                                         check=check, state=state)

    def __repr__(self) -> str:
        return (f"Ledger(party_id={self.party_id!r}, source={self.source!r}, epsilon={self.budget.epsilon:g}, "
                f"delta={self.budget.delta:g}, accountant={self.budget.accountant!r}, "
                f"releases={len(self.entries)})")
