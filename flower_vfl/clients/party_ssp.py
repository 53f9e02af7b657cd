"""A private party of the stacked SSP route (issue 21 item 2): one SSP release per run, through Flower.

The label owner (:class:`~flower_vfl.strategies.stacked_ssp.StackedSSPStrategy`) asks two things:

``query.ssp_identify``
    which party this node serves, its row counts, whether it is private, its target clip
    ``c_v`` (node config ``dp-clip``: the label owner scales the target to it) and whether its
    remaining budget covers the one release (nothing charged).
``query.ssp_release``
    ``vectors['v']`` (the target, one value per training row) and ``config['round']``. The party
    makes its one release (:class:`~flower_vfl.privacy.ssp.SSPParty`) and replies with the scores
    D_test x~ of its held-out rows (post-processing of x~, free) and the scalar x~^T g~ (the label
    owner's calibration needs it), with its privacy report. Never a training-row score: given the
    public x~, the score of a training row is a noiseless function of that row
    (docs/privacy_parties.md, "What is free and what is not").

Everything that decides the party's data, privacy settings and budget comes from its node config
(the ClientApp builds this object exactly as it builds the ADMM party, :mod:`flower_vfl.apps.client`).
The ledger is the one of the party's ``state-dir``, keyed by the source its node config declares:
the same ledger as its ADMM releases, so both routes compose there. The release of run r is kept
under the ledger run ``"<r>/ssp"`` (an ADMM release of the same Flower run is another plan, never
mistaken for this one); an identical re-send gets the stored answer, another target or a second
release in the run is refused, and a release past the budget is refused naming it. A target that
is missing, not a float vector, of the wrong length or not finite is refused before any charge.

A non-private party (its node config gives no budget) **refuses**: the route exists for parties
that protect their rows; a party with nothing to protect takes part in the ADMM route (route='admm'),
where its exact releases join the model. Glue only: the math is in :mod:`flower_vfl.privacy.ssp`.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from flower_vfl.clients.party_private import party_store
from flower_vfl.privacy.boundary import InvalidMessage, Refused

__all__ = ["SSPPartyClient", "SSP_RUN_SUFFIX", "MAX_SSP_ROUND"]

#: the ledger run of a Flower run's SSP release: "<run_id>/ssp"
SSP_RUN_SUFFIX = "/ssp"
#: the largest round number a request may carry
MAX_SSP_ROUND = 10_000


class SSPPartyClient:
    """Party ``party_id`` with training block ``D`` and held-out block ``D_test``; ``privacy``: its
    PrivacyConfig from its node config (None: not private, refuses); ``state_dir``, ``source``: its
    store and declared source (the ledger key), as :class:`~flower_vfl.clients.party_private.PrivatePartyClient`'s."""

    def __init__(self, party_id, D, D_test, privacy, state_dir=None, source=None):
        self.party_id = int(party_id)
        self.D, self.D_test = D, D_test
        self.state_dir, self.source = state_dir, source
        self.privacy = None
        if privacy is not None:
            from flower_vfl.config.schema import ConfigError
            if privacy.calibration != "strict" or privacy.noise_form != "output":
                raise ConfigError(f"party {self.party_id}: node config dp-calibration={privacy.calibration!r}, "
                                  f"dp-noise={privacy.noise_form!r}: the SSP release is differentially private only "
                                  "with dp-calibration='strict' and dp-noise='output'; refused")
            # one release per run (the ADMM plan's dp-train-rounds / dp-eval-rounds do not apply);
            # noise from OS entropy only (a node config seed is refused by the ClientApp)
            self.privacy = dataclasses.replace(privacy, train_rounds=0, eval_rounds=1, seed=None)
        self.party = None

    # ------------------------------------------------------------------ the party
    def _build(self, context: Context):
        from flower_vfl.privacy.ssp import SSPParty
        src = self.source
        return SSPParty(self.D, self.privacy, party_id=self.party_id, store=party_store(self.state_dir),
                        run=f"{context.run_id}{SSP_RUN_SUFFIX}",
                        source=src.key if src is not None else f"partition:{self.party_id}",
                        about=src.about if src is not None else None)

    def _refuse_if_public(self):
        if self.privacy is None:
            raise Refused(f"party {self.party_id} is not private (its node config gives no dp budget): the stacked "
                          "SSP route is for private parties and a non-private party does not make an SSP release. "
                          "Give this party dp=true dp-epsilon=<ε> in its node config, or run route='admm', where "
                          "its exact releases join the model")

    # ------------------------------------------------------------------ handlers
    def identify(self, msg: Message, context: Context) -> Message:
        info = {"party": self.party_id, "n_rows": int(self.D.shape[0]),
                "n_test": int(self.D_test.shape[0]) if self.D_test is not None else 0,
                "private": self.privacy is not None}
        if self.privacy is not None:
            party = self._build(context)
            info["c_v"] = float(self.privacy.c_v)
            info.update(party.ledger.affordable([("gaussian", party.z)], exclude_run=party.run))
            if party.ledger.answer(party.run, 1, "eval") is not None:
                info["affordable"] = True       # this run's release is made: a re-send gets it
        return Message(RecordDict({"identity": ConfigRecord(info)}), reply_to=msg)

    def release(self, msg: Message, context: Context) -> Message:
        try:
            self._refuse_if_public()
            rnd, v = self._parse(msg)
            self.party = self._build(context)
            _, xg = self.party.release(rnd, v)          # checks v (length, finite) before any charge
            s_test = self.party.predict(self.D_test) if self.D_test is not None else np.zeros(0)
        except Refused as exc:
            return self._refusal(msg, exc)
        content = RecordDict({
            "release": ArrayRecord({"s_test": Array(np.asarray(s_test, dtype=float)),
                                    "xg": Array(np.array([float(xg)]))}),
            "meta": MetricRecord({"party": self.party_id, "round": int(rnd)}),
        })
        self._privacy(content)
        return Message(content, reply_to=msg)

    # ------------------------------------------------------------------ boundary and replies
    def _parse(self, msg: Message):
        """``config['round']`` (an integer 1..MAX_SSP_ROUND) and ``vectors['v']`` (a float vector,
        one value per training row, finite); anything else is refused, nothing charged."""
        who = f"party {self.party_id}"
        content = msg.content
        cfg = content.config_records.get("config")
        rnd = None if cfg is None else cfg.get("round")
        if isinstance(rnd, bool) or not isinstance(rnd, int) or not 1 <= rnd <= MAX_SSP_ROUND:
            raise InvalidMessage(f"{who}: config['round']={rnd!r}; expected an integer 1..{MAX_SSP_ROUND}",
                                 field="config.round")
        vectors = content.array_records.get("vectors")
        if vectors is None or "v" not in vectors:
            raise InvalidMessage(f"{who}: message field vectors['v'] (the target) is missing", field="vectors.v")
        try:
            v = vectors["v"].numpy()
        except Exception:
            raise InvalidMessage(f"{who}: vectors['v'] is not a readable array", field="vectors.v") from None
        if v.dtype.kind != "f":
            raise InvalidMessage(f"{who}: vectors['v'] has dtype {v.dtype}; expected float64", field="vectors.v")
        n = int(self.D.shape[0])
        if v.shape != (n,):
            raise InvalidMessage(f"{who}: vectors['v'] has shape {v.shape}; expected ({n},) (one value per "
                                 "training row)", field="vectors.v")
        if not np.all(np.isfinite(v)):
            raise InvalidMessage(f"{who}: vectors['v'] holds NaN or inf values", field="vectors.v")
        return int(rnd), np.asarray(v, dtype=np.float64)

    def _privacy(self, content):
        if self.party is not None:
            from flower_vfl.reporting.report import to_jsonable
            content["privacy"] = ConfigRecord({"report": json.dumps(to_jsonable(self.party.report()))})

    def _refusal(self, msg, exc):
        info = {"party": self.party_id, "reason": str(exc), "code": getattr(exc, "code", "refused")}
        if getattr(exc, "field", None):
            info["field"] = exc.field
        content = RecordDict({"refusal": ConfigRecord(info)})
        self._privacy(content)
        return Message(content, reply_to=msg)
