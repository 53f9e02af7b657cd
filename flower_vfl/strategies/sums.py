"""How the vertical central node gets a round's sum over parties: one object per run.

:class:`~flower_vfl.strategies.vertical_admm.VerticalADMMStrategy` holds the run's :class:`Sums` in
its state (``state.sums``, chosen once by :func:`sums_for` from the run config's ``secagg``) and
calls its methods unconditionally; the strategy has no branch of its own for secure aggregation.

- :class:`PlainSums` (``secagg=false``): the central node sees and checks each party's release
  (``max-release``, a refusal stops the run), may send each party its own q (acceleration), re-sends
  a party back without its state the last round it answered (the replay record), counts stale
  parties, and combines the test scores itself (:func:`flower_vfl.core.scoring.combine`);
- :class:`~flower_vfl.strategies.secagg_central.SecureSums` (``secagg=true``): wraps the run's
  exchange (key agreement, re-keying), relays the roster in every message (the same one for every
  party), decodes only the masked total, refuses what it cannot do (per-party acceleration, theta
  following the parties, a resume or rejoin that would need a release it never saw), and has a
  rejoining party restore its own state from its disk.

Hooks take the run state and return what they compute (the state, or a result); glue only: the
sum's math is the round driver's (:class:`~flower_vfl.core.rounds.RoundDriver`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from flower_vfl.core.scoring import combine
from flower_vfl.strategies.checkpointing import ResumeRefused, replay_q
from flower_vfl.strategies.vertical_rounds import penalties, sends_target, target_vectors

__all__ = ["Sums", "PlainSums", "sums_for"]


class Sums(Protocol):
    """What the strategy asks of a run's sums (``st``: the strategy, ``state``: its
    :class:`~flower_vfl.strategies.vertical_admm.VADMMState`)."""

    #: secure aggregation's roster and sums of the run (the strategy's ``secagg``), or None
    agreement: object
    #: whether the central node holds each party's own release (a per-party target, a replay)
    sees_releases: bool
    #: whether theta may follow the parties' alignment (variant 'sharing')
    adapts_theta: bool

    def wrap(self, exchange):
        """The exchange of every request after identify."""

    def resume_fields(self, state) -> dict:
        """The identify query's fields of a resume, besides the private parties' plans."""

    def refuse_early_answer(self, party) -> None:
        """A restarted node answered a message of its previous session from an empty state before
        it was identified again: refused where that state is not the run's."""

    def rejoin_without_state(self, state, party) -> bool:
        """A non-private party came back without its state: True when it needs nothing restored,
        False when the central node re-synchronizes it; refused when neither can be done."""

    def train_vectors(self, st, state, party) -> tuple:
        """``(q, vectors)`` of ``party``'s train request (``vectors``: None, or its x-update target)."""

    def fields(self, parties) -> dict:
        """The config fields every request of a sum over ``parties`` carries."""

    def train(self, st, state, got: dict, k: int, what: str) -> tuple:
        """``(state, metrics)`` of round ``k``'s replies ``got`` (party -> Message): ``state.fresh``,
        ``state.penalties``, the stale counts."""

    def final_update(self, state, party) -> bool:
        """Whether the final evaluate request to ``party`` carries the last q, y."""

    def test_total(self, st, state, got: dict, shape, what: str, everyone: bool) -> np.ndarray:
        """The test decision values from the evaluate replies ``got`` (``everyone``: every party asked)."""

    def acceleration(self, requested: str) -> str:
        """The acceleration the run may use."""

    def begin(self, st, state, driver):
        """The state after the run-plan checks made before the first round (``driver.phases`` known)."""


class PlainSums:
    """The central node sees each party's release (see the module doc)."""

    agreement = None
    sees_releases = True
    adapts_theta = True

    @staticmethod
    def wrap(exchange):
        return exchange

    @staticmethod
    def resume_fields(state) -> dict:
        return {}

    @staticmethod
    def refuse_early_answer(party) -> None:
        # a SuperNode restarted with its registered key starts with an empty context.state: a
        # state now means it answered a message of its previous session before it was identified
        # again, from x_m = 0 (the central node never used that reply); that iterate is not the run's
        raise ResumeRefused(
            f"party {party} restarted and answered a message sent to its previous session from an empty state "
            "before it was identified again (its SuperNode came back within the SuperLink's heartbeat window "
            "and pulled it): its state is not the run's. "
            "Resume from the checkpoint (resume='<state-dir>'): a new run re-synchronizes every party")

    @staticmethod
    def rejoin_without_state(state, party) -> bool:
        return False          # re-synchronized: the last round it answered, sent again

    @staticmethod
    def train_vectors(st, state, party) -> tuple:
        c = state.central
        q = c.q if state.qs is None or party is None else state.qs[party]   # per party when accelerated
        if party in state.resync and party in state.last_s:
            # a restarted party that lost its state (s_m = 0): q - s_m/theta gives it the same
            # x-update target z_loc = s_m - theta q as the party that kept s_m (eq. 6, alpha = 1)
            return replay_q(q, state.last_s[party], c.theta), None
        if sends_target(st, party):     # alpha = 1: the x-update target alone (8 N bytes, not 16 N)
            return q, target_vectors(st, party, q)
        return q, None

    @staticmethod
    def fields(parties) -> dict:
        return {}

    @staticmethod
    def train(st, state, got: dict, k: int, what: str) -> tuple:
        shape = state.central.z.shape
        fresh = {p: st.release(state, rep, p, "s", shape, what) for p, rep in got.items()}
        state.resync.difference_update(fresh)
        for p in state.active:
            state.stale[p] = 0 if p in fresh else state.stale.get(p, 0) + 1
        pen = penalties(got, what)
        state.replay.update({p: state.sending[p] for p in fresh
                             if p in state.sending and p not in state.private_parties})
        state.fresh, state.penalties = fresh, pen
        return state, {"releases": len(fresh), "stale": len(set(state.active) - set(fresh))}

    @staticmethod
    def final_update(state, party) -> bool:
        return party in state.private_parties      # its unreleased final x-update first

    @staticmethod
    def test_total(st, state, got: dict, shape, what: str, everyone: bool) -> np.ndarray:
        scores = {p: st.release(state, rep, p, "s_test", shape, what) for p, rep in got.items()}
        return combine(scores, state.central.b, range(st.num_parties) if everyone else sorted(scores),
                       "test scores")

    @staticmethod
    def acceleration(requested: str) -> str:
        return requested

    @staticmethod
    def begin(st, state, driver):
        return state


def sums_for(secure: bool) -> Sums:
    """The run's sums: :class:`PlainSums`, or with ``secure`` (``secagg=true``) a fresh
    :class:`~flower_vfl.strategies.secagg_central.SecureSums` (its roster is this run's)."""
    if secure:
        from flower_vfl.strategies.secagg_central import SecureSums
        return SecureSums()
    return PlainSums()
