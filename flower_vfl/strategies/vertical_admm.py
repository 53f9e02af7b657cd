"""The central node of vertical ADMM sharing as a Flower message-API strategy.

Paper: Hu et al., "Learning Privately over Distributed Features: An ADMM Sharing
Approach" (Algorithm 1). The strategy owns the labels, z, y and the intercept; it learns
which node serves which party through an identify query, sends every party its own
message (the N-vectors q = a_hat - z and y, Alg. 1 lines 3-4 and 12), and runs the
in-process engine's round loop (:class:`~flower_vfl.core.rounds.RoundDriver`) and
:class:`~flower_vfl.core.central.CentralUpdate`.

Flower's contract: ``result = strategy.start(grid=grid, initial_arrays=ArrayRecord(),
num_rounds=..., timeout=...)`` returns a :class:`flwr.serverapp.strategy.Result`; the loop
calls ``configure_train`` / ``aggregate_train`` / ``configure_evaluate`` /
``aggregate_evaluate`` with Flower's signatures (their docstrings say which arguments mean
nothing for vertical training, and why).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from logging import ERROR, INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from flower_vfl.core.accel import make_accelerator
from flower_vfl.core.central import CentralUpdate
from flower_vfl.core.party import PLAIN_ROUNDS
from flower_vfl.core.rounds import SUM, RoundDriver, initial_theta
from flower_vfl.core.schedule import default_rho
from flower_vfl.core.losses import get_loss
from flower_vfl.privacy.label_dp import privatize_labels
from flower_vfl.privacy.outcome import noise_divergence_cause
from flower_vfl.core.validation import check_labels, encode_test_labels
from flower_vfl.strategies.config import StrategyConfig
from flower_vfl.core.scoring import combine
from flower_vfl.strategies import checkpointing, vertical_outcome
from flower_vfl.strategies.checkpointing import ResumeRefused, replay_q
from flower_vfl.strategies.exchange import (WIRE_DTYPES, Exchange, PartyFailed, PartyLost, PartyRefused,  # noqa: F401 (re-exported)
                                            ReplyError, check_release, keep_report, party_keys_from)
from flower_vfl.strategies.vertical_rounds import FlowerRounds, check_penalty, read_identity, sends_target, target_vectors
from flower_vfl.secagg import SecAggError
from flower_vfl.io.writer import RoundWriter

__all__ = ["VerticalADMMStrategy", "PartyRefused", "PartyFailed", "PartyLost", "ReplyError", "ResumeRefused",
           "DEFAULT_MAX_RELEASE"]

#: the run config's max-release default: the largest |value| of a party's release accepted
DEFAULT_MAX_RELEASE = 1e6


def log_round(k: int, row: dict) -> None:
    """One line per round in the ServerApp's log (what `flwr run --stream` shows)."""
    extra = "".join(f", {key}={row[key]:.4f}" for key in ("test_loss", "test_accuracy") if key in row)
    log(INFO, "round %d: train_loss=%.6f, primal_residual=%.3g, dual_residual=%.3g, parties=%d%s",
        k, row.get("train_loss", float("nan")), row["primal_residual"], row["dual_residual"],
        row.get("parties", 0), extra)


class VerticalADMMStrategy(Strategy):
    """Central node (label owner) of vertical ADMM sharing.

    Parameters
    ----------
    y_train : array (N,)
        Labels of the aligned training rows (never sent anywhere).
    y_test : array (N_test,) or None, default=None
        Labels of the held-out rows, for the evaluation rounds' metrics.
    config : StrategyConfig or None, default=None
        The central node's settings (:class:`~flower_vfl.strategies.config.StrategyConfig`: rounds,
        tolerances, rho, faults, checkpoint, secure aggregation ...), checked against the parameter
        table (:data:`flower_vfl.config.schema.PARAMS`) when made; None: the defaults.
    **settings
        StrategyConfig's fields as keywords (``num_parties=3, max_rounds=30``), over ``config``:
        the former constructor arguments, same names and meanings.
    label_seed : None, int or numpy Generator, default=None
        Source of the label flips (None: OS entropy); never sent or reported.
    label_source : LabelSource or None, default=None
        Where ``y_train`` comes from (:func:`flower_vfl.privacy.label_dp.label_source`): the
        flips are then drawn once per source and ID and reused in every later run, from the
        label store in ``label_store`` (None: ``default_state_dir()``, the label owner's disk).
    label_store : str or None, default=None
        The label owner's state folder holding ``label-store.sqlite``.
    progress : callable(round, row) or None, default=None
        Called after every round with its history row (the ServerApp logs it and rewrites
        its report).

    Every round's checkpoint (``state_dir``) is written by ``writer``
    (:class:`~flower_vfl.io.writer.RoundWriter`) in a thread while the parties compute the next
    round; a ``progress`` callback may hand its own per-round files to ``writer.submit`` (as a
    snapshot) to be written after the checkpoint. The run waits for them before the next round's
    writes, at its end and when it fails; ``write_inline = True`` writes them in line.
    """

    #: True: the per-round checkpoint and report are written in line (benchmarks compare both)
    write_inline = False

    def __init__(self, y_train, y_test=None, config: StrategyConfig | None = None, *, progress=None,
                 label_seed=None, label_source=None, label_store=None, **settings):
        # every setting checked by the parameter table (config/schema.py, PARAMS) before any work;
        # the former keyword arguments (num_parties=..., max_rounds=...) still build the config
        self.config = cfg = StrategyConfig.build(config, **settings)
        num_parties, loss, rho, alpha = cfg.num_parties, cfg.loss, cfg.rho, cfg.alpha
        loss_name = getattr(cfg.loss, "name", cfg.loss)
        y_train = check_labels(y_train, "y_train", loss_name)
        y_test = None if y_test is None else check_labels(y_test, "y_test", loss_name)
        variant = cfg.variant
        theta = initial_theta(variant, int(num_parties))
        self.loss = get_loss(loss) if isinstance(loss, str) else loss
        self.loss_name, self.variant = self.loss.name, variant
        self.rho_requested = 0.0 if rho in (None, "auto", 0) else float(rho)
        # label DP (privacy/label_dp.py, the engine's code): the true y_train is used only here,
        # drawn once per label source and ID (the label store) when the source is known
        self.loss, y_train, self.label_privacy_ = privatize_labels(
            self.loss, np.asarray(y_train), cfg.label_epsilon, label_seed,
            store=label_store if label_source is not None else None, source=label_source)
        self.label_epsilon = None if self.label_privacy_ is None else self.label_privacy_.epsilon
        self.t = self.loss.encode_labels(np.asarray(y_train))
        self.t_test = None if y_test is None else encode_test_labels(self.loss, np.asarray(y_test))
        self.num_parties = int(num_parties)
        n = self.t.shape[0]
        rho = default_rho(self.loss, n, cfg.penalty) if rho in (None, "auto", 0) else rho
        self.central = CentralUpdate(self.loss, self.t, rho, alpha=alpha,
                                     theta=theta,
                                     fit_intercept=cfg.fit_intercept)
        self.max_rounds, self.tol, self.tol_abs = cfg.max_rounds, cfg.tol, cfg.tol_abs
        self.adaptive_rho, self.progress = bool(cfg.adaptive_rho), progress
        self.eval_every, self.round_timeout = cfg.eval_every, float(cfg.timeout)
        stragglers = cfg.stragglers
        self.party_wait, self.stragglers, self.max_staleness = float(cfg.party_wait), stragglers, int(cfg.max_staleness)
        self.state_dir, self.resume = cfg.state_dir or None, cfg.resume or None
        #: the per-round checkpoint and report: written in line until start() hands them to a thread
        self.writer = RoundWriter(inline=True)
        self.party_keys = party_keys_from(cfg.party_keys, self.num_parties)
        self.max_release = float(cfg.max_release)
        self.wire_dtype = cfg.wire_dtype
        self.run_settings = dict(cfg.run_settings or {})
        self.secagg = None
        if cfg.secagg:      # stragglers='stale' and resume: refused by StrategyConfig
            from flower_vfl.strategies.secagg_central import CentralSecAgg
            self.secagg = CentralSecAgg()
        self.failed_ = False
        make_accelerator(cfg.acceleration, self.central, [])          # checks the name
        #: 'anderson': core/accel.py, the engine's default; off with private parties or stragglers='stale'
        self.acceleration = cfg.acceleration
        self.driver: RoundDriver | None = None       # the round loop (start makes it)
        self._active: list[int] = list(range(self.num_parties))   # the parties of the round being sent
        self._ask: list[int] = list(range(self.num_parties))      # ... of the evaluation being sent
        self._final = False
        self._qs = None
        self._stale: dict[int, int] = {}
        self._reply_party: dict[str, int] = {}
        self.penalty, self.constraint = cfg.penalty, cfg.constraint   # the parties' (run config): see make_accelerator
        self.exchange: Exchange | None = None        # the channel to the parties (identify sets it)
        self._resync: set[int] = set()                 # stateless restarted parties (see _joined)
        self._stateless: set[int] = set()              # ... and those that cannot be re-synchronized
        #: party -> (round, q, y, rho, s_prev) of the last round it answered (checkpointing.py)
        self.replay_: dict[int, tuple] = {}
        self._sending: dict[int, tuple] = {}
        #: party -> what it said of its data at identify (rows, held-out rows, fingerprint)
        self.party_data: dict[int, dict] = {}
        #: party -> its block model's kind and settings, as it said at identify (report.json, the HTML report)
        self.party_models_: dict[int, str] = {}
        #: party -> planned training releases, for the parties that declared themselves private
        self.private_parties: dict[int, int] = {}
        #: party -> the token of its plan (its identify reply), checkpointed for a resume
        self.party_plans_: dict[int, str] = {}
        self.history_: list[dict] = []
        self.privacy_: dict[int, dict] = {}
        self.final_: dict = {}
        self.stopped_reason_: str | None = None

    # ------------------------------------------------------------------ setup
    def summary(self) -> None:
        c = self.central
        log(INFO, "\t├── VerticalADMMStrategy: %d parties, loss=%s, N=%d", self.num_parties, self.loss.name, c.n)
        log(INFO, "\t└── rho=%.3g alpha=%g theta=%g intercept=%s", c.rho, c.alpha, c.theta, c.fit_intercept)

    @property
    def _last_s(self) -> dict:
        """party -> its last release, as the round driver holds it."""
        return {} if self.driver is None else self.driver.last_s

    # ------------------------------------------------------------ identify
    @property
    def node_to_party(self) -> dict[int, int]:
        """node id -> party, as the exchange knows it (a restarted party's new node included)."""
        return {} if self.exchange is None else self.exchange.node_to_party

    def _joined(self, party, info, first) -> None:
        """A node identified itself as ``party`` (``first``: at identify, not a rejoin).

        A non-private party that answers without its state (``last_train`` absent or < 0: a
        restarted SuperNode, or a new run after resume) is re-synchronized: before anything
        else it is sent the last round it answered again (the replay record,
        :meth:`FlowerRounds.resync`; a party that rejoins during a round is sent that replay
        first, by the round's rebuild), and its release must be the one the central node holds
        (other data or settings are refused). A party that restored its own state
        (``last_train`` >= 0) is left as it is."""
        if first and info["private"]:
            self.private_parties[party] = info["train_rounds"]
        if first and info.get("plan"):  # a private party's plan token, a non-private party's resume token under
            self.party_plans_[party] = info["plan"]   # secagg (party_secagg.py): checkpointed, sent back by a resume
        if first:
            self.party_data[party] = info["data"]
            self.party_models_[party] = info.get("party_model", "linear")   # for the report (its own word)
        elif info["data"] != self.party_data.get(party, info["data"]):
            raise ResumeRefused(f"party {party} came back with other data than it declared at identify: "
                                f"{info['data']!r} now, {self.party_data[party]!r} before; give it its original data")
        if (not first and not info["private"] and info["restored"] and self.exchange.same_id_restart
                and self.secagg is None):    # (secagg: a state a party restored from its own disk at identify)
            # a SuperNode restarted with its registered key starts with an empty context.state: a
            # state now means it answered a message of its previous session before it was identified
            # again, from x_m = 0 (the central node never used that reply); that iterate is not the run's
            raise ResumeRefused(
                f"party {party} restarted and answered a message sent to its previous session from an empty state "
                "before it was identified again (its SuperNode came back within the SuperLink's heartbeat window "
                "and pulled it): its state is not the run's. " + (
                    "Resume from the checkpoint (resume='<state-dir>'): each non-private party restores its own "
                    "state of the checkpoint's round from its state-dir" if self.secagg is not None else
                    "Resume from the checkpoint (resume='<state-dir>'): a new run re-synchronizes every party"))
        if info["private"] or info["restored"]:
            self._resync.discard(party)
            return
        if self.secagg is not None and not first:
            k = int(self._identify_query.get("resume-round", 0) or 0)
            if k <= 0:               # no round summed yet: x_m = 0 is its state in this run
                self._resync.discard(party)
                return
            raise ResumeRefused(f"party {party} came back without its state (a restarted SuperNode) and secagg=true, "
                                f"and its state-dir holds no state of round {k} under the run's resume token (another "
                                "state-dir, partition-id or secagg-name): re-synchronizing it needs its own last "
                                "release s_m, which the central node does not hold under secure aggregation. Restart "
                                "it with its node config and state-dir, and resume the run (resume='<state-dir>')")
        self._stateless.add(party)
        if float(getattr(self.central, "alpha", 1.0)) != 1.0:
            log(WARNING, "party %s restarts from x = 0: re-synchronizing a stateless party needs alpha = 1", party)
            return
        self._resync.add(party)

    def _rejoin_round(self, k) -> None:
        """Secure aggregation: every party of round ``k`` answered it, so each non-private party
        holds its state after round ``k`` on its own disk (party_secagg.py). A node that restarts
        from now on is identified again with its run's resume token and this round, and restores
        that state (the central node, which never saw its release, cannot re-synchronize it)."""
        if set(self.private_parties) == set(range(self.num_parties)) or not self.party_plans_:
            return
        self._identify_query["plans"] = json.dumps({str(m): t for m, t in sorted(self.party_plans_.items())},
                                                   sort_keys=True)
        self._identify_query["resume-round"] = int(k)

    def identify(self, grid) -> dict[int, int]:
        """Map node id -> party (:class:`~flower_vfl.strategies.exchange.Exchange`): waits up to
        ``party_wait`` s for every party to have a node; checks node keys against ``party_keys``."""
        self._resync, self._stateless = set(), set()
        self.exchange = Exchange(grid, self.num_parties, timeout=self.round_timeout, party_wait=self.party_wait,
                                 party_keys=self.party_keys, on_join=self._joined)
        self.exchange.wire_dtype = self.wire_dtype
        query = {"want": "party"}
        if getattr(self, "resume_plans_", None):     # a resume: each private party continues its plan
            query["plans"] = json.dumps(self.resume_plans_, sort_keys=True)
            if self.secagg is not None:     # a non-private party restores its own state of this round
                query["resume-round"] = int(self.resume_round_)
        #: the identify query, also sent to a restarted node (secagg: the round a rejoining party restores)
        self._identify_query = ConfigRecord(query)
        self.exchange.identify("query.identify", RecordDict({"config": self._identify_query}),
                               lambda nid, rep: read_identity(self, nid, rep))
        return self.node_to_party

    # ------------------------------------------------------------ the 4 hooks
    def _round_content(self, server_round, party=None, parties=None, **extra) -> RecordDict:
        c = self.central
        if self.secagg is not None:      # one message for every party: the roster and the sum's parties
            extra.update(self.secagg.fields(self._active if parties is None else parties))
            return self._content(server_round, c.q, c.y, c.rho, **extra)
        q = c.q if self._qs is None or party is None else self._qs[party]   # per party when accelerated
        if party in self._resync and party in self._last_s:
            # a restarted party that lost its state (s_m = 0): q - s_m/theta gives it the same
            # x-update target z_loc = s_m - theta q as the party that kept s_m (eq. 6, alpha = 1)
            q = replay_q(q, self._last_s[party], c.theta)
        elif sends_target(self, party):     # alpha = 1: the x-update target alone (8 N bytes, not 16 N)
            return self._content(server_round, q, c.y, c.rho, vectors=target_vectors(self, party, q), **extra)
        return self._content(server_round, q, c.y, c.rho, **extra)

    def _content(self, server_round, q, y, rho, vectors=None, **extra) -> RecordDict:
        c = self.central
        # no accelerator extrapolates the rounds: a non-private party may take the looser x-update
        # the engine's parties take then (PartyUpdate.plain_rounds); a private party ignores it.
        # Not in a run that checkpoints or resumes: a resumed run replays the parties' last round
        # from x = 0, which an inexact warm-started CG solve does not reproduce (the resume would
        # be refused); the engine keeps no checkpoint, so it and a run without one agree
        plain = (self.driver is not None and self.driver.acc is None
                 and self.state_dir is None and self.resume is None)
        if vectors is None:
            vectors = {"q": Array(np.asarray(q)), "y": Array(np.asarray(y))}
        else:                               # (the target v: config['q_norm'] goes with it)
            vectors, extra = {k: Array(a) for k, a in vectors.items() if k != "q_norm"}, \
                {**extra, "q_norm": float(vectors["q_norm"])}
        return RecordDict({
            "vectors": ArrayRecord(vectors),
            "config": ConfigRecord({"round": int(server_round), "rho": float(rho),
                                    "alpha": float(c.alpha), "theta": float(c.theta), PLAIN_ROUNDS: plain,
                                    **extra}),
        })

    def _replay_content(self, party) -> RecordDict:
        """The last round ``party`` answered, as a party without state needs it (checkpointing.py)."""
        k, q, y, rho, s_prev = self.replay_[party]
        return self._content(k, replay_q(q, s_prev, self.central.theta), y, rho)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Alg. 1 line 12: every party of the round gets q = a_hat - z, y and the scalars (at alpha = 1,
        once it answered a round, its x-update target v alone: :func:`~.vertical_rounds.sends_target`).

        ``arrays`` and ``config`` are Flower's global model and free-form config: vertical
        training has neither (x_m stays on its party; a party takes its settings from its own
        node config), so they are not read (:meth:`start` refuses non-empty ones). The parties
        of the round are those of the phase (:func:`~flower_vfl.core.schedule.private_schedule`)."""
        if self._qs is None and not self._resync and not any(sends_target(self, p) for p in self._active):
            content = self._round_content(server_round)
            build = lambda p: content  # noqa: E731
        else:
            build = lambda p: self._round_content(server_round, party=p)  # noqa: E731
        node_of = self.exchange.node_of()
        return [Message(build(p), dst_node_id=node_of[p], message_type="train")
                for p in sorted(self._active) if p in node_of]

    def _refused(self, rep, party) -> None:
        """Keep a private party's report; a refusal stops the run (:class:`PartyRefused`)."""
        keep_report(rep, party, self.privacy_)

    def _release(self, rep, party, key, shape, what) -> np.ndarray:
        """A reply's checked release; a refusal stops the run (:class:`PartyRefused`)."""
        keep_report(rep, party, self.privacy_, what)
        return check_release(rep, party, key, shape, what, bound=self.max_release,
                             cause=noise_divergence_cause(self.privacy_) if self.private_parties else None)

    def _by_party(self, replies, what) -> dict[int, Message]:
        """party -> reply, the party being the one the exchange sent the request to."""
        out = {}
        for rep in replies:
            party = self._reply_party.get(rep.metadata.reply_to_message_id)
            if party is None:
                raise ReplyError(f"{what}: a reply to message {rep.metadata.reply_to_message_id!r}, which this "
                                 "round did not send")
            out[party] = rep
        return dict(sorted(out.items()))

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        """Check the parties' releases s_m (Alg. 1 line 8) and keep them for the central step.

        The sum over parties and the z-, y- and intercept updates (lines 9-11) are the round
        driver's (:class:`~flower_vfl.core.rounds.RoundDriver`, shared with the engine): a stale or
        idle party counts there with its last release. There is no global model to return
        (``None``); the metrics are the round's count of fresh releases and stale parties."""
        what = f"round {server_round} (train)"
        got = self._by_party(replies, what)
        shape = self.central.z.shape
        if self.secagg is not None:
            for p, rep in got.items():
                self._refused(rep, p)
            fresh = {SUM: self.secagg.total(got, self._active, "s", shape, what) if self._active
                     else np.zeros(shape)}
            self._stale = dict.fromkeys(self._active, 0)
            self._fresh = fresh
            self._rejoin_round(server_round)
            self._penalties = {p: v for p, rep in got.items() if (v := check_penalty(rep, p, what)) is not None}
            return None, MetricRecord({"releases": len(got), "stale": 0})
        fresh = {p: self._release(rep, p, "s", shape, what) for p, rep in got.items()}
        self._resync.difference_update(fresh)
        for p in self._active:
            self._stale[p] = 0 if p in fresh else self._stale.get(p, 0) + 1
        # lam R(x_m) from the parties that report it (non-private): the objective column
        penalties = {p: v for p, rep in got.items() if (v := check_penalty(rep, p, what)) is not None}
        self.replay_.update({p: self._sending[p] for p in fresh if p in self._sending and p not in self.private_parties})
        self._fresh, self._penalties = fresh, penalties
        return None, MetricRecord({"releases": len(fresh), "stale": len(set(self._active) - set(fresh))})

    def _eval_content(self, server_round, party, final=False) -> RecordDict:
        """Ask for D_test x_m. In the final evaluation private parties also get the last
        q, y: they make their unreleased final x-update first (:func:`private_schedule`)."""
        c = self.central
        cfg = {"round": int(server_round), "rho": float(c.rho), "alpha": float(c.alpha),
               "theta": float(c.theta), "n_outputs": int(self.loss.n_outputs)}
        if final and party in self.private_parties:
            return self._round_content(server_round, parties=self._ask, n_outputs=int(self.loss.n_outputs),
                                       final_update=True)
        if self.secagg is not None:
            if final and self.private_parties:
                # one message for every party of the sum: the private parties' (q, y) too
                return self._round_content(server_round, parties=self._ask, n_outputs=int(self.loss.n_outputs),
                                           final_update=True)
            cfg.update(self.secagg.fields(self._ask))
        return RecordDict({"config": ConfigRecord(cfg)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Ask the parties of this evaluation for their scores D_test x_m of the test rows.

        ``arrays`` / ``config``: as in :meth:`configure_train`, not read. Before the final
        update a private party is not asked (it releases its model once, at the end)."""
        node_of = self.exchange.node_of()
        return [Message(self._eval_content(server_round, p, self._final), dst_node_id=node_of[p],
                        message_type="evaluate") for p in sorted(self._ask) if p in node_of]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord:
        """Check the scores D_test x_m and combine them with the intercept
        (:func:`flower_vfl.core.scoring.combine`, as in the predict job) into the test metrics.
        Asked of the non-private parties alone, the metrics are named ``*_nonprivate``."""
        what = f"round {server_round} ({'final ' if self._final else ''}evaluate)"
        shape = self.t_test.shape[:1] + self.central.z.shape[1:]
        suffix = "" if set(self._ask) == set(range(self.num_parties)) else "_nonprivate"
        if self.secagg is not None:
            got = self._by_party(replies, what)
            for p, rep in got.items():
                self._refused(rep, p)
            f = (self.secagg.total(got, self._ask, "s_test", shape, what) if self._ask else np.zeros(shape)) \
                + self.central.b
        else:
            scores = {p: self._release(rep, p, "s_test", shape, what)
                      for p, rep in self._by_party(replies, what).items()}
            f = combine(scores, self.central.b, sorted(scores) if suffix else range(self.num_parties), "test scores")
        if not suffix:
            self.decision_test_ = f
        # test labels are clean: with label DP score them with the plain logistic loss (log-loss)
        test_loss = get_loss("logistic") if self.label_privacy_ is not None else self.loss
        out = {"test_loss" + suffix: test_loss.mean(f, self.t_test)}
        if self.loss.name != "squared":
            pred = self.loss.predict(f)
            truth = self.loss.predict(self.t_test)
            out["test_accuracy" + suffix] = float(np.mean(pred == truth))
        return MetricRecord({k: float(v) for k, v in out.items()})

    # ------------------------------------------------------------------- loop
    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn=None) -> Result:
        """Identify the parties, then run the rounds (:class:`~flower_vfl.core.rounds.RoundDriver`,
        the engine's loop) until the stopping rule or the last round; returns Flower's Result.

        Parameters
        ----------
        grid : Grid
        initial_arrays : ArrayRecord or None
            Must be empty: vertical training has no global model to send (each party starts
            its x_m at 0 on its own node; z and y start from the labels here). To continue a
            run, give the strategy ``resume``.
        num_rounds : int or None, default=None
            Rounds (with private parties: of the non-private parties' warm start, then the
            private parties' declared rounds follow); None: ``max_rounds``.
        timeout : float or None, default=None
            Seconds to wait for the replies to one request; None: the constructor's ``timeout``.
        train_config, evaluate_config : ConfigRecord or None
            Must be empty: a party takes no free-form settings from the central node (only the
            protocol's scalars: round, rho, alpha, theta); its settings are its node config's.
        evaluate_fn : None
            Must be None: the central node holds no model (the x_m never leave the parties),
            so there is nothing to evaluate centrally; test metrics come from the parties'
            scores (``y_test``, ``eval_every``).

        Returns
        -------
        Result
            ``arrays``: the central node's part of the model (``intercept``);
            ``train_metrics_clientapp[k]``: round k's history row; ``evaluate_metrics_clientapp[k]``:
            the test metrics of the rounds that had an evaluation. The strategy keeps
            ``history_``, ``final_``, ``privacy_``, ``decision_test_`` as before.

        With private parties the rounds follow :func:`~flower_vfl.core.schedule.private_schedule`.
        A party that refuses (budget spent), fails, sends an invalid or out-of-range reply or
        does not come back within ``party_wait`` stops the run with the checkpoint of the last
        full round: ``stopped_reason_`` names the party, ``failed_`` is True and the error is
        raised again so that the ServerApp (and the Flower run) fail: a run without a model
        never reports success.
        """
        vertical_outcome.check_start(initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn)
        if num_rounds is not None:
            self.max_rounds = int(num_rounds)
        if timeout is not None:
            self.round_timeout = float(timeout)
        t0 = time.perf_counter()
        log(INFO, "Starting %s strategy:", type(self).__name__)
        self.summary()
        self.run_record_ = checkpointing.run_record(self)
        # another run's checkpoint is refused before any party is contacted
        ckpt = checkpointing.load(self.resume, self.run_record_) if self.resume else None
        self.resume_plans_ = checkpointing.plans(ckpt)
        self.resume_round_ = int(ckpt[1]["round"]) if ckpt is not None else None
        self.identify(grid)
        if ckpt is not None and self._stateless and float(self.central.alpha) != 1.0:
            raise ResumeRefused(f"resume={str(self.resume)!r}: parties {sorted(self._stateless)} came back without "
                                f"their state and alpha={self.central.alpha:g}: the relaxed x-update needs the "
                                "party's own z_loc, which the central node cannot restore. Resume with parties that "
                                "kept their state, or start a new run without resume")
        self._stale, self._qs = {}, None
        self.driver = RoundDriver(self.central, self.num_parties, max_rounds=self.max_rounds, tol=self.tol,
                                  tol_abs=self.tol_abs, adaptive_rho=self.adaptive_rho, eval_every=self.eval_every)
        acceleration = self.acceleration
        if self.secagg is not None and acceleration != "none":
            log(WARNING, "secagg=true: acceleration=%s turned off (per-party Anderson needs each party's release, "
                "which the central node does not see under secure aggregation)", acceleration)
            acceleration = "none"
        self.driver.plan([m in self.private_parties for m in range(self.num_parties)],
                         list(self.private_parties.values()), acceleration, self.penalty,
                         self.constraint is not None, stale=self.stragglers == "stale",
                         # as the plain-rounds flag (_content): a resumed run replays the parties'
                         # last round, whose theta a checkpoint does not keep
                         adapt_theta=self.variant == "sharing" and self.secagg is None and self.state_dir is None
                         and self.resume is None)
        public = [m for m in range(self.num_parties) if m not in self.private_parties]
        lost = sorted(set(public) & self._stateless)
        if ckpt is not None and self.secagg is not None and lost and self.resume_round_ > 0:
            raise ResumeRefused(f"resume={str(self.resume)!r} with secagg=true: non-private parties {lost} hold no "
                                f"state of round {self.resume_round_} under the checkpoint's resume token (their "
                                "state-dir, partition-id or secagg-name is not the run's, or the run kept no token): "
                                "re-synchronizing them needs their own last release, which the central node never "
                                "saw under secure aggregation. Resume with the parties' original node configs and "
                                "state-dirs, or start a new run without resume")
        if ckpt is None:       # round 0, before any key agreement or round: the private parties' plans, for a resume
            checkpointing.save(self, 0, 0, 0, False)
        if self.secagg is not None:
            small = [sum(active) for _, active, _ in self.driver.phases if 0 < sum(active) < 2]
            if small or self.num_parties < 2:
                n = small[0] if small else self.num_parties
                raise ValueError(f"secagg=true needs at least 2 parties in every sum; this run has a phase of {n} "
                                 f"part{'y' if n == 1 else 'ies'} (private parties {sorted(self.private_parties)} "
                                 "sit out the warm start): run with 2 or more non-private parties, every party "
                                 "private, or secagg=false")
            self.secagg.check_phases(self.driver.phases, self.private_parties)      # one roster per run
            self.secagg.keys(self.exchange, self.num_parties)
        self.acceleration_ = self.driver.acceleration
        self.history_ = self.driver.history
        begin = (0, 0, 0, False)
        if ckpt is not None:
            begin = checkpointing.restore(self, self.resume, *ckpt)
            log(INFO, "resuming from %s after round %d", self.resume, begin[0])
        rounds = FlowerRounds(self, grid)
        self.writer = RoundWriter(inline=self.write_inline)
        try:
            rounds.resync(range(self.num_parties))    # parties back without state: their x_m first
            self.driver.run(rounds, start=begin, t0=t0, on_round=self._on_round, on_warm_start=self._on_warm_start)
            self.writer.close()                      # the last round's checkpoint and report are on disk
            if self.t_test is not None:
                vertical_outcome.warn_if_dp_hurts(self)
        except (PartyRefused, PartyLost, PartyFailed, ReplyError, ResumeRefused, PermissionError, SecAggError) as exc:
            # no model: the run fails (a refusal too: the rounds done are kept, never reported as a success)
            self._close_writer()
            self.stopped_reason_, self.failed_ = str(exc), True
            log(ERROR, "stopping after round %d (checkpoint: %s): %s", len(self.history_),
                self.state_dir or "none, set state-dir or out-dir", exc)
            vertical_outcome.finish(self, t0)
            raise
        except BaseException:
            self._close_writer()
            raise
        vertical_outcome.finish(self, t0)
        return vertical_outcome.flower_result(self)

    def _close_writer(self) -> None:
        """The run is failing: the writes of the rounds done still reach the disk (their own
        error is logged: the run's error is the one to see)."""
        err = self.writer.close(raising=False)
        if err is not None:
            log(WARNING, "%s", err)

    def _on_round(self, k, row, i_phase, j, stopped) -> None:
        # round k-1's checkpoint and report were written while the parties computed round k
        # (io/writer.py): wait for them (their disk error stops the run here), then hand over k's
        self.writer.wait()
        checkpointing.save(self, k, i_phase, j, stopped)
        if self.progress is not None:
            self.progress(k, row)
        else:                 # a custom ServerApp without a callback still sees each round in its log
            log_round(k, row)

    def _on_warm_start(self, k, metrics) -> None:
        # the non-private parties alone, at the end of the warm start: the bar the private
        # parties must clear (a warning after the run if they do not)
        if metrics is not None:
            self.nonprivate_reference_ = metrics

    def protection(self) -> dict:
        """What this run protects, per party (the run report's plain statement)."""
        return vertical_outcome.protection(self)
