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
"""

from __future__ import annotations

from logging import INFO, WARNING

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.common.logger import log

from flower_vfl.secagg import Advert, Roster, SecAggError, secure_sum
from flower_vfl.secagg.masking import ADVERTS, PARTIES
from flower_vfl.strategies.exchange import Exchange, ReplyError

__all__ = ["CentralSecAgg", "SecureExchange", "REKEY"]

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
