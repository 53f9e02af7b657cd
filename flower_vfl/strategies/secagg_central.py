"""The central node's side of secure aggregation (run config ``secagg=true``; docs/secagg.md).

Once per run (and again when a party comes back without its key) the central node asks every
party for its signed key advert (``query.secagg_keys``) and relays the whole set, the roster, in
every train / evaluate message (``config['secagg.adverts']``, with ``config['secagg.parties']``
naming the parties of that sum). The message is the same for every party. The replies are
masked uint64 vectors; the central node adds them mod 2^64 and decodes the sum only
(:func:`flower_vfl.secagg.secure_sum`): a party missing means no sum (the round is retried), masks
that do not cancel (parties shown different messages or rosters) are refused. Glue only.

:class:`SecureExchange` wraps the run's :class:`~flower_vfl.strategies.exchange.Exchange` (as Flower's
DP strategies wrap a strategy): the key agreement, and a request one party refused for want of a key
(restarted) sent again to every party after a new key agreement, happen inside it; every other
request and attribute is the wrapped exchange's.

:class:`SecureSums` is the run's :class:`~flower_vfl.strategies.sums.Sums` under secure aggregation:
the vertical strategy calls it where it would read a party's own release. It wraps the exchange,
relays the roster (:meth:`CentralSecAgg.fields`), decodes the masked totals, checks the run's plan
before the first round (every sum over 2 or more parties, one roster per run) and has a party that
restarts restore its own state of the last round summed from its disk (the identify query's
``resume-round``): the central node, which never saw its release, cannot re-synchronize it.
"""

from __future__ import annotations

import json
from logging import INFO, WARNING

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.common.logger import log

from flower_vfl.core.rounds import SUM
from flower_vfl.secagg import Advert, Roster, SecAggError, secure_sum
from flower_vfl.secagg.masking import ADVERTS, PARTIES
from flower_vfl.strategies.checkpointing import ResumeRefused
from flower_vfl.strategies.exchange import Exchange, ReplyError
from flower_vfl.strategies.vertical_rounds import penalties

__all__ = ["CentralSecAgg", "SecureExchange", "SecureSums", "REKEY"]

#: the refusal code of a party that holds no key for this run (restarted): re-key, retry the round
REKEY = "secagg-rekey"


class CentralSecAgg:
    """The roster of this run and the sums of the masked replies."""

    def __init__(self):
        self.roster: Roster | None = None
        self.name_of: dict[int, str] = {}
        self.key_agreements = 0
        self.advert_bytes = 0

    @staticmethod
    def check_phases(phases, private_parties) -> None:
        """Refuse, before any round, a run whose sums are over two sets of parties: the
        non-private parties alone in the warm start, then every party (private parties and
        non-private ones mixed). Each party answers sums over one roster only (docs/secagg.md);
        it would refuse the second set anyway, after rounds had run."""
        sets = sorted({tuple(m for m, a in enumerate(active) if a) for _, active, _ in phases if any(active)})
        if len(sets) > 1:
            from flower_vfl.config.schema import ConfigError
            raise ConfigError(
                f"secagg=true: this run sums parties {list(sets[0])} alone in the warm start (private parties "
                f"{sorted(private_parties)} sit it out) and parties {list(sets[-1])} after it; a party's values go "
                "into secure sums over one set of parties only (the difference of two sums over different sets "
                "is the release of the parties in one and not the other, docs/secagg.md), so the parties would "
                "refuse. Run with every party private, no party private, or secagg=false")

    def keys(self, exchange, num_parties: int) -> Roster:
        """Ask every party for its advert; the roster (names unique, one run)."""
        what = "secure-aggregation key advert"
        got = exchange.send(lambda p, nid: RecordDict({"config": ConfigRecord({"want": "advert"})}),
                            "query.secagg_keys", range(num_parties), what)
        adverts, names = {}, {}
        for p, rep in sorted(got.items()):
            recs = rep.content.config_records
            if "refusal" in recs:
                raise ReplyError(f"party {p} refused the {what} request: {recs['refusal'].get('reason', '')}")
            if "secagg" not in recs or not isinstance(recs["secagg"].get("advert"), bytes):
                raise ReplyError(f"party {p} (node {rep.metadata.src_node_id}): the reply to the {what} request has "
                                 "no 'secagg' record with an 'advert' (bytes); is its ClientApp flower-vfl's?")
            try:
                adverts[p] = Advert.from_bytes(recs["secagg"]["advert"])
            except SecAggError as exc:
                raise ReplyError(f"party {p}: {exc}") from None
            names.setdefault(adverts[p].name, []).append(p)
        dup = {n: ps for n, ps in names.items() if len(ps) > 1}
        if dup:
            raise ReplyError(f"parties {sorted(dup.values())} advertise the same secagg name(s) {sorted(dup)}; give "
                             "each party a distinct secagg-name in its node config")
        self.roster = Roster(list(adverts.values()))
        self.name_of = {p: a.name for p, a in adverts.items()}
        self.key_agreements += 1
        self.advert_bytes = sum(len(a.to_bytes()) for a in adverts.values())
        log(INFO, "secure aggregation: roster of %d parties (%s), digest %s", len(self.roster),
            ", ".join(f"{p}={n}" for p, n in sorted(self.name_of.items())), self.roster.digest.hex()[:16])
        return self.roster

    def fields(self, parties) -> dict:
        """The config fields of a message for the sum over ``parties`` (the same for each)."""
        return {ADVERTS: [a.to_bytes() for a in self.roster.adverts],
                PARTIES: sorted(self.name_of[p] for p in parties)}

    def sub(self, parties) -> Roster:
        names = {self.name_of[p] for p in parties}
        return Roster([a for a in self.roster.adverts if a.name in names])

    def total(self, replies: dict, parties, key: str, shape, what: str) -> np.ndarray:
        """sum_m release[key] over ``parties`` from their masked replies (party -> Message)."""
        masked = {}
        for p, rep in replies.items():
            node = rep.metadata.src_node_id
            rec = rep.content.array_records.get("release")
            if rec is None or key not in rec:
                raise ReplyError(f"party {p} (node {node}), {what}: no masked release[{key!r}]")
            v = rec[key].numpy()
            if v.dtype != np.uint64 or v.shape != tuple(shape):
                raise ReplyError(f"party {p} (node {node}), {what}: masked release[{key!r}] of dtype {v.dtype} and "
                                 f"shape {v.shape}; expected uint64 of shape {tuple(shape)} (secagg=true)")
            masked[self.name_of[p]] = v
        return secure_sum(masked, self.sub(parties))


class SecureExchange:
    """An :class:`~flower_vfl.strategies.exchange.Exchange` under secure aggregation (see the module doc).

    ``exchange``: the run's exchange (identify made it); ``secagg``: the run's roster and sums."""

    #: the sums come masked (the central node reads their total only)
    secure = True

    def __init__(self, exchange: Exchange, secagg: CentralSecAgg):
        self.exchange, self.secagg = exchange, secagg

    def __getattr__(self, name):
        return getattr(self.__dict__["exchange"], name)

    def agree(self) -> Roster:
        """The key agreement: every party's advert, the roster relayed in every request."""
        return self.secagg.keys(self.exchange, self.exchange.num_parties)

    def send_messages(self, messages, what: str, rebuild=None, stale_ok: bool = False, parties=None):
        """As :meth:`Exchange.send_messages`; a party that holds no key for this run (restarted) refuses
        with ``secagg-rekey``: then every party is asked for its advert again (the others keep theirs),
        the new roster is relayed and the whole request is sent again: never a sum with a hole."""
        ex = self.exchange
        got = ex.send_messages(messages, what, rebuild, stale_ok=stale_ok, parties=parties)
        if stale_ok:          # (got, lost): stragglers='stale' is refused with secagg=true (StrategyConfig)
            return got
        for _ in range(max(1, 2 * ex.num_parties)):
            rekey = sorted(p for p, rep in got.items() if "refusal" in rep.content.config_records
                           and rep.content.config_records["refusal"].get("code") == REKEY)
            if not rekey:
                return got
            log(WARNING, "parties %s hold no secure-aggregation key for this run (restarted): new key "
                "adverts, then %s again for every party", rekey, what)
            self.agree()
            got = ex.send_messages([], what, rebuild, parties=parties)
        raise ReplyError(f"{what}: parties kept losing their secure-aggregation keys; check their SuperNodes")


class SecureSums:
    """The run's sums under secure aggregation (see the module doc; the methods are
    :class:`~flower_vfl.strategies.sums.Sums`'s). ``agreement``: the run's roster and sums."""

    #: the central node holds no party's own release: no per-party target, no replay
    sees_releases = False
    #: theta stays 1/M: following the parties' alignment needs each party's release
    adapts_theta = False

    def __init__(self):
        self.agreement = CentralSecAgg()

    def wrap(self, exchange) -> SecureExchange:
        """The exchange of every later request: key agreement, re-keying."""
        return SecureExchange(exchange, self.agreement)

    @staticmethod
    def resume_fields(state) -> dict:
        """A non-private party restores its own state of the checkpoint's round."""
        return {"resume-round": int(state.resume_round)}

    @staticmethod
    def refuse_early_answer(party) -> None:
        """Nothing refused: a state at a rejoin is the one the party restored from its own disk at identify."""

    @staticmethod
    def rejoin_without_state(state, party) -> bool:
        """True before any round was summed (x_m = 0 is its state in this run); refused after."""
        k = int(state.identify_query.get("resume-round", 0) or 0)
        if k <= 0:
            return True
        raise ResumeRefused(f"party {party} came back without its state (a restarted SuperNode) and secagg=true, "
                            f"and its state-dir holds no state of round {k} under the run's resume token (another "
                            "state-dir, partition-id or secagg-name): re-synchronizing it needs its own last "
                            "release s_m, which the central node does not hold under secure aggregation. Restart "
                            "it with its node config and state-dir, and resume the run (resume='<state-dir>')")

    @staticmethod
    def train_vectors(st, state, party) -> tuple:
        """One message for every party: the round's q and y."""
        return state.central.q, None

    def fields(self, parties) -> dict:
        """The roster and the sum's parties (:meth:`CentralSecAgg.fields`)."""
        return self.agreement.fields(parties)

    def train(self, st, state, got: dict, k: int, what: str) -> tuple:
        """The masked total of the round's releases (``state.fresh[SUM]``); every party of the round
        answered it (else the exchange would have retried), so none is stale."""
        for p, rep in got.items():
            st.refused(state, rep, p)
        shape = state.central.z.shape
        state.fresh = {SUM: self.agreement.total(got, state.active, "s", shape, what) if state.active
                       else np.zeros(shape)}
        state.stale = dict.fromkeys(state.active, 0)
        state = self.rejoin_round(st, state, k)
        state.penalties = penalties(got, what)
        return state, {"releases": len(got), "stale": 0}

    @staticmethod
    def rejoin_round(st, state, k):
        """Every party of round ``k`` answered it, so each non-private party holds its state after
        round ``k`` on its own disk (party_secagg.py). A node that restarts from now on is identified
        again with its run's resume token and this round, and restores that state (the central node,
        which never saw its release, cannot re-synchronize it)."""
        if set(state.private_parties) == set(range(st.num_parties)) or not state.party_plans:
            return state
        state.identify_query["plans"] = json.dumps({str(m): t for m, t in sorted(state.party_plans.items())},
                                                   sort_keys=True)
        state.identify_query["resume-round"] = int(k)
        return state

    @staticmethod
    def final_update(state, party) -> bool:
        """One message for every party of the sum: the private parties' (q, y) too."""
        return bool(state.private_parties)

    def test_total(self, st, state, got: dict, shape, what: str, everyone: bool) -> np.ndarray:
        """The masked total of the parties' test scores, plus the intercept."""
        for p, rep in got.items():
            st.refused(state, rep, p)
        return (self.agreement.total(got, state.ask, "s_test", shape, what) if state.ask else np.zeros(shape)) \
            + state.central.b

    @staticmethod
    def acceleration(requested: str) -> str:
        """'none': per-party Anderson needs each party's release."""
        if requested != "none":
            log(WARNING, "secagg=true: acceleration=%s turned off (per-party Anderson needs each party's release, "
                "which the central node does not see under secure aggregation)", requested)
        return "none"

    def begin(self, st, state, driver):
        """Before the first round: a resume that would need a release the central node never saw,
        a sum over fewer than 2 parties, or sums over two rosters are refused; then the key agreement."""
        public = [m for m in range(st.num_parties) if m not in state.private_parties]
        lost = sorted(set(public) & state.stateless)
        if state.checkpoint is not None and lost and state.resume_round > 0:
            raise ResumeRefused(f"resume={str(st.resume)!r} with secagg=true: non-private parties {lost} hold no "
                                f"state of round {state.resume_round} under the checkpoint's resume token (their "
                                "state-dir, partition-id or secagg-name is not the run's, or the run kept no token): "
                                "re-synchronizing them needs their own last release, which the central node never "
                                "saw under secure aggregation. Resume with the parties' original node configs and "
                                "state-dirs, or start a new run without resume")
        small = [sum(active) for _, active, _ in driver.phases if 0 < sum(active) < 2]
        if small or st.num_parties < 2:
            n = small[0] if small else st.num_parties
            raise ValueError(f"secagg=true needs at least 2 parties in every sum; this run has a phase of {n} "
                             f"part{'y' if n == 1 else 'ies'} (private parties {sorted(state.private_parties)} "
                             "sit out the warm start): run with 2 or more non-private parties, every party "
                             "private, or secagg=false")
        self.agreement.check_phases(driver.phases, state.private_parties)      # one roster per run
        state.exchange.agree()
        return state
