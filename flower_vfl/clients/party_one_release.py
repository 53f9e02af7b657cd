"""What a private party of a one-release route shares (issue 21 items 2 and 3).

:class:`~flower_vfl.clients.party_ssp.SSPPartyClient` (route='stacked-ssp') and
:class:`~flower_vfl.clients.party_moment.MomentPartyClient` (route='moment') both make one
release per run from the party's node config only: privacy settings (strict output noise, one
release, OS entropy), the party's store and ledger under the run ``"<run_id><RUN_SUFFIX>"`` keyed
by the source its node config declares. This module holds that part: the party object's build,
the identify reply (nothing charged), the release handler's shape, the refusal of a non-private
party, the target's boundary checks (:func:`flower_vfl.privacy.boundary.parse_round_number`,
:func:`~flower_vfl.privacy.boundary.parse_vector`) and the privacy report; the identify skeleton,
the one entry of every message and the refusal reply are every party's
(:class:`~flower_vfl.clients.base.PartyBase`). What a route releases and replies (the SSP
scores, the moment route's acknowledgement and ADMM rounds) stays in its own module.

A crash must not spend the budget: a new run that asks for the same release as a stored one (the
same round and clipped target, on the same declared source) is admitted to that stored draw
(:meth:`~flower_vfl.privacy.ssp.OneReleaseParty.stored_release_of`; the party's store notes the
new run as an alias of the release's ledger run), gets it again and is charged nothing: the same
draw is post-processing. Another target is another release, charged (or refused past the budget).
"""

from __future__ import annotations

import dataclasses
import json

from flwr.app import ConfigRecord, Context, Message, RecordDict

from flower_vfl.clients.base import PartyBase
from flower_vfl.clients.party_private import party_store
from flower_vfl.privacy.boundary import Refused, parse_round_number, parse_vector

__all__ = ["OneReleasePartyClient"]


class OneReleasePartyClient(PartyBase):
    """Party ``party_id`` with training block ``D`` and held-out block ``D_test``; ``privacy``: its
    PrivacyConfig from its node config (None: not private, refuses); ``state_dir``, ``source``: its
    store and declared source (the ledger key), as :class:`~flower_vfl.clients.party_private.PrivatePartyClient`'s.
    A base: a route sets the class attributes below, :meth:`_party_class` and :meth:`_release_reply`
    (identify's skeleton, the one entry and the refusal reply: :class:`~flower_vfl.clients.base.PartyBase`)."""

    #: the route in prose ("the <ROUTE> route is for private parties")
    ROUTE = ""
    #: the release in prose, with its article ("does not make <A_RELEASE>")
    A_RELEASE = ""
    #: the release's name in the node-config refusal ("the <RELEASE> release is differentially private")
    RELEASE = ""
    #: the ledger run of a Flower run's release: "<run_id><RUN_SUFFIX>"
    RUN_SUFFIX = ""
    #: the round number under which the release is kept
    ROUND = 1
    #: the target's name in the "missing" refusal (after ``vectors['v']``)
    TARGET_NAME = ""
    #: the release request's ``config['round']``: (lo, hi, what the refusal expects; "": "an integer lo..hi")
    RELEASE_ROUNDS = (1, 1, "")

    def __init__(self, party_id, D, D_test, privacy, state_dir=None, source=None):
        self.party_id = int(party_id)
        self.D, self.D_test = D, D_test
        self.state_dir, self.source = state_dir, source
        self.privacy = None
        if privacy is not None:
            from flower_vfl.config.schema import ConfigError
            if privacy.calibration != "strict" or privacy.noise_form != "output":
                raise ConfigError(f"party {self.party_id}: node config dp-calibration={privacy.calibration!r}, "
                                  f"dp-noise={privacy.noise_form!r}: the {self.RELEASE} release is differentially "
                                  "private only with dp-calibration='strict' and dp-noise='output'; refused")
            # one release per run (the ADMM plan's dp-train-rounds / dp-eval-rounds do not apply);
            # noise from OS entropy only (a node config seed is refused by the ClientApp)
            self.privacy = dataclasses.replace(privacy, train_rounds=0, eval_rounds=1, seed=None)
        self.party = None

    @property
    def private(self):
        return self.privacy is not None

    # ------------------------------------------------------------------ the party
    def _party_class(self):
        """The route's release object (SSPParty, MomentParty): imported on use."""
        raise NotImplementedError

    def _source_key(self):
        return self.source.key if self.source is not None else f"partition:{self.party_id}"

    def _run(self, context: Context):
        return f"{context.run_id}{self.RUN_SUFFIX}"

    def _ledger_run(self, context: Context):
        """The ledger run this Flower run's release lives under: its own, or the stored release it
        was admitted to (a re-run that asked for the same release)."""
        return party_store(self.state_dir).aliased(self._source_key(), self._run(context)) or self._run(context)

    def _build(self, context: Context):
        src = self.source
        return self._party_class()(self.D, self.privacy, party_id=self.party_id, store=party_store(self.state_dir),
                                   run=self._ledger_run(context), source=self._source_key(),
                                   about=src.about if src is not None else None)

    def _reuse(self, context: Context, rnd, v) -> None:
        """A run without a release of its own that asks for the same release as a stored one is
        admitted to it (noted on the party's disk): the same draw again, nothing charged."""
        party = self.party
        if party.run != self._run(context) or party.ledger.answer(party.run, rnd, "eval") is not None:
            return                                      # admitted before, or this run's own release exists
        stored = party.stored_release_of(rnd, v)
        if stored is not None:
            party.ledger.store.alias(party.ledger.source, self._run(context), stored)
            party.run, party._answer = stored, None

    def _refuse_if_public(self):
        if self.privacy is None:
            raise Refused(f"{self.who} is not private (its node config gives no dp budget): the {self.ROUTE} route is "
                          f"for private parties and a non-private party does not make {self.A_RELEASE}. Give this "
                          "party dp=true dp-epsilon=<ε> in its node config, or run route='admm', where its exact "
                          "releases join the model")

    def _refuse_if_unfit(self):
        """What refuses the route before anything is parsed (a route may add to it)."""
        self._refuse_if_public()

    # ------------------------------------------------------------------ handlers
    def _identity_extra(self) -> dict:
        """A route's own identity fields (after 'private')."""
        return {}

    def _identity_fields(self, msg: Message, context: Context) -> dict:
        info = {**self._rows_identity(), **self._identity_extra()}
        if self.privacy is not None:
            party = self._build(context)
            info["c_v"] = float(self.privacy.c_v)
            info.update(party.ledger.affordable([("gaussian", party.z)], exclude_run=party.run))
            if party.ledger.answer(party.run, self.ROUND, "eval") is not None:
                info["affordable"] = True       # this run's release is made: a re-send gets it
            # stored releases of this route: a run that asks for the same release gets one again, free
            info["stored"] = sum(e.kind == "eval" and e.unit == party.UNIT for e in party.ledger.entries)
        return info

    def _release_reply(self, rnd, v) -> RecordDict:
        """The route's release from ``self.party`` (built) and the reply's content (without the privacy report)."""
        raise NotImplementedError

    def release(self, msg: Message, context: Context) -> Message:
        """The one release: refused when the route does not fit this party, the request parsed
        (:meth:`_parse_release`) before the party is built or anything charged."""
        def parse(content):
            self._refuse_if_unfit()
            return self._parse_release(content)

        def answer(parsed):
            rnd, v = parsed
            self.party = self._build(context)
            self._reuse(context, rnd, v)
            content = self._release_reply(rnd, v)       # the party checks v (length, finite) before any charge
            self._privacy(content)
            return Message(content, reply_to=msg)
        return self._handle(msg, parse, answer)

    # ------------------------------------------------------------------ boundary and replies
    def _parse_release(self, content: RecordDict):
        """``config['round']`` (:attr:`RELEASE_ROUNDS`) and ``vectors['v']`` (a float vector, one value
        per training row, finite); anything else is refused, nothing charged."""
        lo, hi, expected = self.RELEASE_ROUNDS
        rnd = parse_round_number(content.config_records.get("config"), self.party_id, lo, hi, expected)
        return rnd, parse_vector(content, "v", int(self.D.shape[0]), "training row", self.party_id,
                                 name=self.TARGET_NAME)

    def _privacy(self, content):
        if self.party is not None:
            from flower_vfl.reporting.report import to_jsonable
            content["privacy"] = ConfigRecord({"report": json.dumps(to_jsonable(self.party.report()))})

    def _reply_extra(self, content: RecordDict, refusal: bool):
        self._privacy(content)
