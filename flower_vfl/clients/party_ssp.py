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
where its exact releases join the model. What this route shares with the moment route (identify,
the build, the refusals, the target's checks, the replies) is
:class:`~flower_vfl.clients.party_one_release.OneReleasePartyClient`. Glue only: the math is in
:mod:`flower_vfl.privacy.ssp`.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from flower_vfl.clients.party_one_release import OneReleasePartyClient

__all__ = ["SSPPartyClient", "SSP_RUN_SUFFIX", "MAX_SSP_ROUND"]

#: the ledger run of a Flower run's SSP release: "<run_id>/ssp"
SSP_RUN_SUFFIX = "/ssp"
#: the largest round number a request may carry
MAX_SSP_ROUND = 10_000


class SSPPartyClient(OneReleasePartyClient):
    """Party ``party_id`` with training block ``D`` and held-out block ``D_test``; ``privacy``: its
    PrivacyConfig from its node config (None: not private, refuses); ``state_dir``, ``source``: its
    store and declared source (the ledger key), as :class:`~flower_vfl.clients.party_private.PrivatePartyClient`'s.
    Identify, the release handler, the build, the refusals and the target's checks:
    :class:`~flower_vfl.clients.party_one_release.OneReleasePartyClient`."""

    ROUTE, A_RELEASE, RELEASE, RUN_SUFFIX = "stacked SSP", "an SSP release", "SSP", SSP_RUN_SUFFIX
    TARGET_NAME = " (the target)"
    RELEASE_ROUNDS = (1, MAX_SSP_ROUND, "")

    def _party_class(self):
        from flower_vfl.privacy.ssp import SSPParty
        return SSPParty

    def _release_reply(self, rnd, v) -> RecordDict:
        """The one SSP release: the held-out rows' scores D_test x~ (post-processing, free) and x~^T g~."""
        _, xg = self.party.release(rnd, v)          # checks v (length, finite) before any charge
        s_test = self.party.predict(self.D_test) if self.D_test is not None else np.zeros(0)
        return RecordDict({
            "release": ArrayRecord({"s_test": Array(np.asarray(s_test, dtype=float)),
                                    "xg": Array(np.array([float(xg)]))}),
            "meta": MetricRecord({"party": self.party_id, "round": int(rnd)}),
        })
