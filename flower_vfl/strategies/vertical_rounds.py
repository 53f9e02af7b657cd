"""What the vertical central node reads from the parties, and how it reaches them each round.

- :func:`read_identity`: a node's identify reply, every field range-checked (party index,
  row counts, the private plan ``train_rounds`` within 0..``MAX_TRAIN_ROUNDS``);
- :func:`check_penalty`: the lam R(x_m) a non-private party reports (finite, >= 0);
- :class:`FlowerRounds`: the strategy's :class:`~flower_vfl.core.rounds.RoundExchange`,
  Flower's hooks over the :class:`~flower_vfl.strategies.exchange.Exchange` (a lost party is
  waited for, or counted stale with ``stragglers='stale'``; under secure aggregation the run's sums
  (:mod:`~flower_vfl.strategies.sums`) made the exchange a
  :class:`~flower_vfl.strategies.secagg_central.SecureExchange`, which re-keys on its own), and the
  re-synchronization of a party that came back without its state (:meth:`FlowerRounds.resync`)
  before it is asked anything else.
"""

from __future__ import annotations

import math
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.common.logger import log

from flower_vfl.config.schema import SCHEMA
from flower_vfl.core.party import target_norm, x_update_target
from flower_vfl.strategies.checkpointing import ResumeRefused
from flower_vfl.strategies.exchange import MAX_LOSSES, ReplyError, identity_record

__all__ = ["MAX_TRAIN_ROUNDS", "read_identity", "check_penalty", "penalties", "sends_target", "target_vectors",
           "FlowerRounds"]

#: the most training rounds a private party may declare (the range of its dp-train-rounds)
MAX_TRAIN_ROUNDS = int(SCHEMA["dp-train-rounds"].hi)


def _int_field(info, field, nid, lo=None, hi=None, default=None):
    v = info.get(field, default) if default is not None else info.get(field)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ReplyError(f"node {nid}: identity[{field!r}]={v!r}; expected an integer")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ReplyError(f"node {nid}: identity[{field!r}]={v!r} is outside {lo}..{hi}; refused")
    return int(v)


def read_identity(st, nid, rep):
    """The party a node claims in its identify reply and what it says of itself, checked
    (the exchange checks the index range). ``st``: the strategy (rows, held-out rows)."""
    info = identity_record(nid, rep)
    party = _int_field(info, "party", nid)
    n_rows = _int_field(info, "n_rows", nid)
    if 0 <= party < st.num_parties and n_rows != st.central.n:
        raise ValueError(f"party {party} (node {nid}) holds {n_rows} rows but the labels have "
                         f"{st.central.n}; the parties' samples are not aligned")
    private = info.get("private", False)
    if not isinstance(private, bool):
        raise ReplyError(f"node {nid}: identity['private']={private!r}; expected true or false")
    n_test = _int_field(info, "n_test", nid, lo=0, default=0) if "n_test" in info else None
    if n_test is not None and st.t_test is not None and n_test != st.t_test.shape[0]:
        raise ValueError(f"party {party} (node {nid}) holds {n_test} held-out rows but the held-out labels have "
                         f"{st.t_test.shape[0]}; the parties' test samples are not aligned")
    # a private party's declared plan adds its rounds to the run: bounded (10**9 would never end)
    train_rounds = _int_field(info, "train_rounds", nid, lo=0, hi=MAX_TRAIN_ROUNDS, default=0) \
        if "train_rounds" in info else 0
    if private and info.get("affordable", True) is False and isinstance(info.get("refused"), str):
        raise ReplyError(f"party {party} (node {nid}) refused: {info['refused']}")   # its reason (a reservation)
    if private and info.get("affordable", True) is False:
        raise ReplyError(
            f"party {party} (node {nid}) is private and its remaining budget cannot cover its plan: it "
            f"has spent epsilon={float(info.get('spent_before_run', float('nan'))):.4g} of "
            f"{float(info.get('epsilon', float('nan'))):g} on this data in earlier runs, so every release "
            "of this run would be refused. The party can see its spend with `flower-vfl ledger "
            "--state-dir <its state-dir>`; only its operator can grant a new budget")
    last = info.get("last_train", -1)
    data = {"n_rows": n_rows, **({"n_test": n_test} if n_test is not None else {})}
    fp = info.get("data_fingerprint")
    if isinstance(fp, str) and fp:
        data["data_fingerprint"] = fp
    plan = info.get("plan")       # a private party's plan token: a resume presents it to continue the plan
    model = info.get("party_model")   # its block kind and settings, as it says (shown in the report only)
    return party, {"private": private, "train_rounds": train_rounds, "data": data,
                   "party_model": model if isinstance(model, str) and len(model) <= 300 else "linear",
                   "restored": isinstance(last, int) and not isinstance(last, bool) and last >= 0,
                   "plan": plan if isinstance(plan, str) and len(plan) <= 200 else None}


def check_penalty(rep, party, what) -> float | None:
    """lam R(x_m) of a non-private party's reply (None when it reports none): finite and >= 0."""
    meta = rep.content.metric_records.get("meta")
    if meta is None or "penalty" not in meta:
        return None
    v = meta["penalty"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ReplyError(f"party {party} (node {rep.metadata.src_node_id}), {what}: meta['penalty']={v!r}; a "
                         "penalty lam R(x_m) is a finite number >= 0; refused")
    return float(v)


def penalties(got: dict, what: str) -> dict:
    """party -> lam R(x_m) of the replies ``got`` (party -> Message) that report it (non-private
    parties, :func:`check_penalty`): the objective column."""
    return {p: v for p, rep in got.items() if (v := check_penalty(rep, p, what)) is not None}


def sends_target(st, party) -> bool:
    """Whether ``party``'s train request carries its x-update target ``v`` alone (one N-vector,
    8 N bytes) instead of q and y (16 N): at alpha = 1 the party's x-update reads only
    ``v = s_m - theta q - y / rho_x`` (:func:`~flower_vfl.core.party.x_update_target`), which the
    central node forms bitwise as the party would from the party's last release s_m, which it
    holds (with wire-dtype float32, the release as it travelled: the value the sum holds, which
    the target then starts from, 4 N bytes). Not where it does not hold the s_m the party holds:
    secure aggregation (only the sum), a party being re-synchronized or not yet answered,
    stragglers='stale' (a reply lost after the party answered leaves the two apart); and not
    over-relaxed rounds (alpha != 1: the party's z_loc)."""
    c = st.central
    state = st.state_
    return (party is not None and state.sums.sees_releases and float(c.alpha) == 1.0
            and st.stragglers != "stale" and party not in state.resync and party in state.last_s)


def target_vectors(st, party, q) -> dict:
    """``{"v": target, "q_norm": ||q||}`` of ``party`` this round (:func:`sends_target`); ``q`` is its
    q (per party when accelerated)."""
    c = st.central
    _, v = x_update_target(st.state_.last_s[party], q, c.y, c.rho, c.theta)
    return {"v": v, "q_norm": target_norm(q)}


class FlowerRounds:
    """The strategy's :class:`~flower_vfl.core.rounds.RoundExchange` (see the module doc): it calls
    the strategy's Flower hooks and its public message builders, and reads and writes the run's
    state (:class:`~flower_vfl.strategies.vertical_admm.VADMMState`)."""

    def __init__(self, strategy, state, grid):
        self.st, self.state, self.grid = strategy, state, grid
        self.evaluates = strategy.t_test is not None

    def _send(self, messages, what, rebuild, parties, stale_ok=False):
        return self.state.exchange.send_messages(messages, what, rebuild, stale_ok=stale_ok, parties=parties)

    def train(self, k, parties, qs):
        st, state, what = self.st, self.state, f"round {k} (train)"
        state.active, state.qs = list(parties), qs
        c = state.central
        # what each party is sent, for the replay record: copies (an accelerator updates its
        # buffers in place after the round), one per distinct array
        kept = {}
        copy = lambda a: kept.setdefault(id(a), (a, np.array(a, dtype=float)))[1]  # noqa: E731
        state.sending = {p: (k, copy(c.q if qs is None else qs[p]), copy(c.y), float(c.rho), state.last_s.get(p))
                         for p in parties}
        messages = list(st.configure_train(k, ArrayRecord(), ConfigRecord(), self.grid))
        replayed = set()

        def rebuild(p, nid):
            # a party back without its state (a restarted SuperNode) is first sent the last round
            # it answered again: its release is checked against the one the central node holds
            # (other data or settings are refused), then it is sent this round (below)
            if p in state.resync and p in state.replay and p in state.last_s and state.sums.sees_releases:
                replayed.add(p)
                return Message(st.replay_content(state, p), dst_node_id=nid, message_type="train")
            replayed.discard(p)
            return Message(st.round_content(state, k, party=p), dst_node_id=nid, message_type="train")
        if st.stragglers == "stale":
            got, lost = self._send(messages, what, rebuild, parties, stale_ok=True)
            over = {p for p in lost if state.stale.get(p, 0) + 1 > st.max_staleness}
            if over:
                log(WARNING, "parties %s missed %d rounds in a row (max-staleness): waiting", sorted(over),
                    st.max_staleness)
                got.update(self._send([], what, rebuild, over))
        else:
            got = self._send(messages, what, rebuild, parties)
        for _ in range(MAX_LOSSES + 2):     # each pass follows a loss; the exchange stops after MAX_LOSSES
            back = sorted(p for p in got if p in replayed)
            if not back:
                break
            for p in back:
                self._check_replay(p, got.pop(p))
                replayed.discard(p)
            got.update(self._send([], what, rebuild, back))
        if any(p in replayed for p in got):
            raise ResumeRefused(f"parties {sorted(replayed)} kept losing their state while being re-synchronized "
                                f"in {what}; check their SuperNodes and resume")
        state.reply_party = {rep.metadata.reply_to_message_id: p for p, rep in got.items()}
        st.aggregate_train(k, [got[p] for p in sorted(got)])
        return state.fresh, state.penalties

    def resync(self, parties) -> None:
        """Send every party of ``parties`` that came back without its state the last round it
        answered again (the replay record, :mod:`~flower_vfl.strategies.checkpointing`): it then
        holds the x_m it had, and the next message (a round, an evaluation) finds it as an
        uninterrupted party would. Its release must be the one the checkpoint holds (bitwise
        when theta is a power of two; within rounding otherwise), else the resume is refused:
        the party's data or settings changed."""
        st, state = self.st, self.state
        for _ in range(max(1, 2 * st.num_parties)):      # a party may be lost and come back meanwhile
            todo = sorted(p for p in parties if p in state.resync and p in state.replay)
            if not todo:
                return
            what = f"re-synchronization (round {max(state.replay[p][0] for p in todo)} again)"
            got = state.exchange.send(lambda p, nid: st.replay_content(state, p), "train", todo, what)
            for p, rep in sorted(got.items()):
                self._check_replay(p, rep)
        raise ResumeRefused(f"parties {sorted(p for p in parties if p in state.resync)} kept losing their state "
                            "while being re-synchronized; check their SuperNodes and resume")

    def _check_replay(self, p, rep) -> None:
        """``rep`` answers the last round party ``p`` answered, sent again: its release must be
        the one the central node holds, else :class:`ResumeRefused` (its data or settings changed)."""
        st, state = self.st, self.state
        what = f"re-synchronization (round {state.replay[p][0]} again)"
        s = st.release(state, rep, p, "s", state.central.z.shape, what)
        kept = state.last_s[p]
        if not np.array_equal(s, kept):
            diff = float(np.max(np.abs(s - kept)))
            scale = max(1.0, float(np.max(np.abs(kept))))
            if diff > 1e-9 * scale:
                raise ResumeRefused(
                    f"party {p} (node {rep.metadata.src_node_id}) was sent round {state.replay[p][0]} again "
                    f"to restore its state and released another s_m than in that round (max |difference| "
                    f"{diff:.3g} over {s.shape[0]} rows): its data or its settings changed (rows, row "
                    "order, columns, lam, penalty, x-solver). Give the party its original data and node "
                    "config, or start a new run without resume")
        state.resync.discard(p)
        log(INFO, "party %s re-synchronized: round %d again, the same release", p, state.replay[p][0])

    def evaluate(self, k, parties, final):
        st, state = self.st, self.state
        state.ask, state.final_eval = list(parties), bool(final)
        what = f"round {k} ({'final ' if final else ''}evaluate)"
        self.resync(parties)
        messages = list(st.configure_evaluate(k, ArrayRecord(), ConfigRecord(), self.grid))
        rebuild = lambda p, nid: Message(st.eval_content(state, k, p, final), dst_node_id=nid,  # noqa: E731
                                         message_type="evaluate")
        got = self._send(messages, what, rebuild, parties)
        for _ in range(max(1, 2 * st.num_parties)):
            again = sorted(p for p in got if p in state.resync and p in state.replay)
            if not again:
                break
            # a party restarted during the evaluation answered from x_m = 0: restore it, ask again
            self.resync(again)
            got.update(self._send([], what, rebuild, again))
        state.reply_party = {rep.metadata.reply_to_message_id: p for p, rep in got.items()}
        return dict(st.aggregate_evaluate(k, [got[p] for p in sorted(got)]))

    def finish(self, k):
        """Nothing to do here: a private party's final x-update rides on the final evaluate
        request (``final_update``), as the party's protocol has it."""
