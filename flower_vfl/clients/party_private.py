"""A private vertical party: noisy releases charged in its one ledger, on its own disk.

The shared boundary and reply are :class:`~flower_vfl.clients.party_base.PartyClient`'s; here:
the party's :class:`~flower_vfl.privacy.party.PrivateParty` (Assumption 2 enforced, noise
drawn), whose :class:`~flower_vfl.privacy.ledger.Ledger` lives in the party's
:class:`~flower_vfl.privacy.store.PartyStore` (``state-dir``) under the data source its node
config declares (:mod:`flower_vfl.clients.source`), shared by every run and every view of
that data. The iterate is kept there too, so a restarted node resumes. The model is released
once (x~, after the final update) and every score is post-processing of it.

A run is admitted to a **plan** when it identifies (or at its first release): the party's plan
(``dp-train-rounds`` + ``dp-eval-rounds`` releases) is reserved on its disk, so a second run that
would not fit beside it is refused before any round, naming the run that holds it. The identify
reply gives the plan's token; a resumed run presents it (the identify query's ``plans``) and
continues that plan: its releases, its iterate, its allowance, no second charge and no new check.
Glue only.
"""

from __future__ import annotations

import json

from flwr.app import ConfigRecord, Context

from flower_vfl.clients.party_base import PartyClient
from flower_vfl.core.penalties import penalty_class
from flower_vfl.core.scoring import released_scores
from flower_vfl.privacy.boundary import Refused, inputs_hash
from flower_vfl.privacy.ledger import BudgetReserved, PlanUnaffordable
from flower_vfl.privacy.store import OPEN_STORES, party_store  # noqa: F401  (re-exported: one store per process)

__all__ = ["PrivatePartyClient"]

class PrivatePartyClient(PartyClient):
    """A party with a :class:`~flower_vfl.privacy.party.PrivacyConfig` (``privacy``); parameters
    as :class:`~flower_vfl.clients.party_base.PartyClient`."""

    private = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.privacy is None:
            raise ValueError(f"party {self.party_id}: a PrivatePartyClient needs privacy=PrivacyConfig(...)")
        # never trained silently with another penalty than asked (core/penalties.py: supports_private_parties)
        if not getattr(penalty_class(str(self.penalty)), "supports_private_parties", False):
            from flower_vfl.config.schema import ConfigError
            raise ConfigError(f"party {self.party_id} is private and its x-update is L2-regularized (its "
                              f"sensitivity bound needs the L2 term's strong convexity, docs/privacy.md); the run "
                              f"config's penalty={self.penalty!r} is refused. Use penalty=l2, or run this party "
                              "without dp")
        # distributed noise (node config dp-distributed-max-colluders): the advert declares the profile
        self._sum_plan = None
        if self.secagg is not None and self.secagg.colluders is not None:
            from flower_vfl.privacy.distributed import profile
            lam = self.privacy.lam if self.privacy.lam is not None else self.lam
            self.secagg.noise = profile(self.privacy, lam, self.secagg.colluders)

    @property
    def distributed(self) -> bool:
        """True when the node config sets dp-distributed-max-colluders (a share of the noise only)."""
        return self.secagg is not None and self.secagg.colluders is not None

    def _build(self, context: Context, n_outputs: int, plain: bool = False):
        # ``plain`` is never read: the server's hint does not change a private party's x-update
        party = self._party(context)
        party.admit()                  # the run's plan (admitted at identify; else reserved now, or refused)
        return party

    def _party(self, context: Context):
        """The party object of this Flower run, not yet admitted to a plan."""
        from flower_vfl.privacy.party import PrivateParty
        from flower_vfl.privacy.distributed import DistributedParty
        src = self.source
        cls, extra = (DistributedParty, {"colluders": self.secagg.colluders}) if self.distributed else (PrivateParty, {})
        party = cls(self.D, self.D_test, self.lam, self.privacy, party_id=self.party_id, n_parties=self.n_parties,
                    store=party_store(self.state_dir), run=str(context.run_id),
                    source=src.key if src is not None else f"partition:{self.party_id}",
                    about=src.about if src is not None else None, **extra)
        return party

    def identify(self, msg, context: Context):
        """Identify, admitting this run to a plan: the token of a plan to continue comes from the
        query's ``config['plans']`` (a JSON object party -> token, sent by a resumed run); a token
        that names none of this party's plans is ignored (a new plan is reserved, if it fits)."""
        self._token = None
        try:
            plans = json.loads(str(msg.content["config"]["plans"]))
            token = plans.get(str(self.party_id)) if isinstance(plans, dict) else None
            self._token = token if isinstance(token, str) and len(token) <= 200 else None
        except Exception:
            self._token = None
        return super().identify(msg, context)

    def _identity(self, context: Context) -> dict:
        party = self._party(context)
        c, eps = self.privacy, float(self.privacy.epsilon)
        try:
            plan, how = party.admit(getattr(self, "_token", None))
        except BudgetReserved as exc:
            return {"epsilon": eps, "spent_before_run": float(party.ledger.spent()), "affordable": False,
                    "refused": str(exc)}
        except PlanUnaffordable:
            return {"epsilon": eps, "spent_before_run": float(party.ledger.spent()), "affordable": False}
        before = [e for e in party.ledger.entries if e.run != plan.plan]
        return {"epsilon": eps, "spent_before_run": float(party.ledger.epsilon_of(before)), "affordable": True,
                "plan": plan.token, "continued": how == "continued",
                "plan_made": int(plan.made), "plan_size": int(c.train_rounds + c.eval_rounds)}

    def _train_release(self, inputs, meta, context):
        if self.distributed and self._sum_plan is not None:
            adders, max_bits = self._sum_plan
            r = self.party.distributed_release(inputs.round, None, None, inputs.rho, adders=adders,
                                               max_bits=max_bits, inputs=inputs)
            g = self.party.ledger.answer(self.party.run, inputs.round, "train").payload["guarantees"]
            return r, int(g[4])                     # (round(gamma s) + share, j): gamma = 2^j
        return self.party.train_release(inputs.round, None, None, inputs.rho, inputs=inputs)

    def _answer(self, content, context, kind, rnd, compute):
        """A distributed party's training release goes into a secure sum as an integer vector
        (its plain release is refused by :class:`~flower_vfl.privacy.distributed.DistributedParty`)."""
        sa = self._secagg(content) if self.distributed and kind == "train" else None
        if sa is None:
            return super()._answer(content, context, kind, rnd, compute)

        def integer(adders, max_bits):
            self._sum_plan = (adders, max_bits)
            try:
                return compute()
            finally:
                self._sum_plan = None
        return sa.masked_answer(content, context, kind, rnd, integer, integer=True)

    def _eval_scores(self, inputs, final, context):
        """The first request carrying ``final_update`` makes the last x-update (kept inside the
        party) and draws x~ once (charged once); every later request is post-processing, free."""
        if self.party.x_released is None:
            if not final:
                raise Refused(f"party {self.party_id} is private and releases its model once, after its "
                              "final update; evaluation before that is refused (no budget spent)")
            self.party.final_update(inputs.q, inputs.y, inputs.rho, inputs.alpha, inputs.theta)
            self.party.release_model(inputs.round, inputs_hash(self.party.run, "eval", inputs))
        return released_scores(self.D_test, self.party.x_released, private=True)    # x~: free

    def _reply_extra(self, content, refusal):
        if self.party is not None:
            content["privacy"] = ConfigRecord({"report": json.dumps(_jsonable(self.party.report()))})


def _jsonable(obj):
    from flower_vfl.reporting.report import to_jsonable
    return to_jsonable(obj)
