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

import dataclasses
import json
from collections.abc import Iterable
from functools import partial
from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flower_vfl.core.accel import make_accelerator
from flower_vfl.core.central import CentralUpdate
from flower_vfl.core.party import PLAIN_ROUNDS
from flower_vfl.core.rounds import RoundDriver, initial_theta
from flower_vfl.core.schedule import default_rho
from flower_vfl.core.losses import get_loss
from flower_vfl.privacy.label_dp import privatize_labels
from flower_vfl.privacy.outcome import noise_divergence_cause
from flower_vfl.core.validation import check_labels, encode_test_labels
from flower_vfl.strategies.config import StrategyConfig
from flower_vfl.strategies import checkpointing, vertical_outcome
from flower_vfl.strategies.base import CentralBase, RunState
from flower_vfl.strategies.checkpointing import ResumeRefused, replay_q
from flower_vfl.strategies.sums import PlainSums, Sums, sums_for
from flower_vfl.strategies.exchange import (WIRE_DTYPES, Exchange, PartyFailed, PartyLost, PartyRefused,  # noqa: F401 (re-exported)
                                            ReplyError, check_release, keep_report, party_keys_from)
from flower_vfl.strategies.vertical_rounds import FlowerRounds, read_identity, sends_target
from flower_vfl.secagg import SecAggError
from flower_vfl.io.writer import RoundWriter

__all__ = ["VerticalADMMStrategy", "VADMMState", "PartyRefused", "PartyFailed", "PartyLost", "ReplyError", "ResumeRefused",
           "DEFAULT_MAX_RELEASE"]

#: the run config's max-release default: the largest |value| of a party's release accepted
DEFAULT_MAX_RELEASE = 1e6


def log_round(k: int, row: dict) -> None:
    """One line per round in the ServerApp's log (what `flwr run --stream` shows)."""
    extra = "".join(f", {key}={row[key]:.4f}" for key in ("test_loss", "test_accuracy") if key in row)
    log(INFO, "round %d: train_loss=%.6f, primal_residual=%.3g, dual_residual=%.3g, parties=%d%s",
        k, row.get("train_loss", float("nan")), row["primal_residual"], row["dual_residual"],
        row.get("parties", 0), extra)


@dataclasses.dataclass
class VADMMState(RunState):
    """One run of the vertical ADMM central node (:class:`~flower_vfl.strategies.base.RunState`):
    the iterates, the round loop and what the parties said and sent. The constructor's settings stay
    on the strategy; :class:`~flower_vfl.strategies.vertical_rounds.FlowerRounds`,
    :mod:`~flower_vfl.strategies.checkpointing` and the hooks read and write this."""

    #: z, y, q, the intercept and rho (:class:`~flower_vfl.core.central.CentralUpdate`)
    central: CentralUpdate | None = None
    #: the encoded training labels (label DP: the privatized ones; a resume restores its draw)
    t: np.ndarray | None = None
    #: the round loop (run() makes it)
    driver: RoundDriver | None = None
    #: the per-round checkpoint and report: written in line until run() hands them to a thread
    writer: RoundWriter = dataclasses.field(default_factory=lambda: RoundWriter(inline=True))
    #: how the round's sums over parties are formed, chosen once per run (strategies/sums.py: each
    #: party's release seen, or under secure aggregation their masked total alone)
    sums: Sums = dataclasses.field(default_factory=PlainSums)
    #: party -> planned training releases, for the parties that declared themselves private
    private_parties: dict = dataclasses.field(default_factory=dict)
    #: party -> the token of its plan (its identify reply), checkpointed for a resume
    party_plans: dict = dataclasses.field(default_factory=dict)
    #: party -> what it said of its data at identify (rows, held-out rows, fingerprint)
    party_data: dict = dataclasses.field(default_factory=dict)
    #: party -> its block model's kind and settings, as it said at identify
    party_models: dict = dataclasses.field(default_factory=dict)
    #: stateless restarted parties to re-synchronize (see joined), and those that cannot be
    resync: set = dataclasses.field(default_factory=set)
    stateless: set = dataclasses.field(default_factory=set)
    #: party -> (round, q, y, rho, s_prev) of the last round it answered (checkpointing.py)
    replay: dict = dataclasses.field(default_factory=dict)
    #: party -> (round, q, y, rho, s_prev) of the round being sent
    sending: dict = dataclasses.field(default_factory=dict)
    #: the identify query, also sent to a restarted node (under secure aggregation: the round a
    #: rejoining party restores)
    identify_query: ConfigRecord | None = None
    #: the parties of the round / of the evaluation being sent; whether it is the final evaluation
    active: list = dataclasses.field(default_factory=list)
    ask: list = dataclasses.field(default_factory=list)
    final_eval: bool = False
    #: the accelerator's per-party q of the round (None: c.q for all)
    qs: list | None = None
    #: party -> rounds it missed in a row
    stale: dict = dataclasses.field(default_factory=dict)
    #: the round's releases and penalties (aggregate_train)
    fresh: dict = dataclasses.field(default_factory=dict)
    penalties: dict = dataclasses.field(default_factory=dict)
    #: message id -> party, of the replies being read
    reply_party: dict = dataclasses.field(default_factory=dict)
    #: a resume's loaded checkpoint (arrays, header), or None
    checkpoint: tuple | None = None
    resume_round: int | None = None
    resume_plans: dict = dataclasses.field(default_factory=dict)
    run_record: dict | None = None
    acceleration: str | None = None
    decision_test: np.ndarray | None = None
    nonprivate_reference: dict | None = None
    dp_warning: str | None = None

    @property
    def last_s(self) -> dict:
        """party -> its last release, as the round driver holds it."""
        return {} if self.driver is None else self.driver.last_s


class VerticalADMMStrategy(CentralBase):
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

    State = VADMMState
    ROUTE = "vertical ADMM"
    STOPS = (PartyRefused, PartyLost, PartyFailed, ReplyError, ResumeRefused, PermissionError, SecAggError)

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
        self.theta = initial_theta(variant, int(num_parties))
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
        #: the z-update's rho at the start of a run (the requested one, else the default for the loss)
        self.rho_start = default_rho(self.loss, n, cfg.penalty) if rho in (None, "auto", 0) else rho
        self.alpha, self.fit_intercept = alpha, cfg.fit_intercept
        self.max_rounds, self.tol, self.tol_abs = cfg.max_rounds, cfg.tol, cfg.tol_abs
        self.adaptive_rho, self.progress = bool(cfg.adaptive_rho), progress
        self.eval_every, self.round_timeout = cfg.eval_every, float(cfg.timeout)
        self.timeout = self.round_timeout
        stragglers = cfg.stragglers
        self.party_wait, self.stragglers, self.max_staleness = float(cfg.party_wait), stragglers, int(cfg.max_staleness)
        self.state_dir, self.resume = cfg.state_dir or None, cfg.resume or None
        self.party_keys = party_keys_from(cfg.party_keys, self.num_parties)
        self.max_release = float(cfg.max_release)
        self.wire_dtype = cfg.wire_dtype
        self.run_settings = dict(cfg.run_settings or {})
        #: 'anderson': core/accel.py, the engine's default; off with private parties or stragglers='stale'
        self.acceleration = cfg.acceleration
        self.penalty, self.constraint = cfg.penalty, cfg.constraint   # the parties' (run config): see make_accelerator
        super().__init__()
        make_accelerator(cfg.acceleration, self.central, [])          # checks the name

    def new_state(self) -> VADMMState:
        """A fresh run: z, y and the intercept from the labels, no party known yet."""
        state = super().new_state()
        state.t = self.t
        state.central = CentralUpdate(self.loss, self.t, self.rho_start, alpha=self.alpha, theta=self.theta,
                                      fit_intercept=self.fit_intercept)
        state.active, state.ask = list(range(self.num_parties)), list(range(self.num_parties))
        state.sums = sums_for(self.config.secagg)   # (secure: stragglers='stale' refused by StrategyConfig)
        return state

    # ------------------------------------------------------------------ read-outs of the last run
    @property
    def central(self) -> CentralUpdate:
        """z, y, q, the intercept and rho of the last run (before a run: its start)."""
        return self.state_.central

    @property
    def secagg(self):
        """Secure aggregation's roster and sums of the last run (None: without secure aggregation)."""
        return self.state_.sums.agreement

    @property
    def driver(self) -> RoundDriver | None:
        return self.state_.driver

    @property
    def writer(self) -> RoundWriter:
        """The run's writer (a ``progress`` callback may hand it its per-round files)."""
        return self.state_.writer

    @property
    def private_parties(self) -> dict:
        return self.state_.private_parties

    @property
    def party_data(self) -> dict:
        return self.state_.party_data

    @property
    def party_plans_(self) -> dict:
        return self.state_.party_plans

    @property
    def party_models_(self) -> dict:
        """party -> its block model's kind and settings, as it said at identify (report.json, the HTML report)."""
        return self.state_.party_models

    # ------------------------------------------------------------------ setup
    def summary(self) -> None:
        c = self.central
        log(INFO, "\t├── VerticalADMMStrategy: %d parties, loss=%s, N=%d", self.num_parties, self.loss.name, c.n)
        log(INFO, "\t└── rho=%.3g alpha=%g theta=%g intercept=%s", c.rho, c.alpha, c.theta, c.fit_intercept)

    def check_start(self, initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn):
        vertical_outcome.check_start(initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn)

    def rounds_of(self, state: VADMMState) -> int:
        """The run's max rounds: ``start``'s ``num_rounds``, else the constructor's ``max_rounds``."""
        return self.max_rounds if state.num_rounds is None else int(state.num_rounds)

    # ------------------------------------------------------------ identify
    def joined(self, state: VADMMState, party, info, first) -> None:
        """A node identified itself as ``party`` (``first``: at identify, not a rejoin).

        A non-private party that answers without its state (``last_train`` absent or < 0: a
        restarted SuperNode, or a new run after resume) is re-synchronized: before anything
        else it is sent the last round it answered again (the replay record,
        :meth:`FlowerRounds.resync`; a party that rejoins during a round is sent that replay
        first, by the round's rebuild), and its release must be the one the central node holds
        (other data or settings are refused). A party that restored its own state
        (``last_train`` >= 0) is left as it is. The run's sums (:mod:`~flower_vfl.strategies.sums`) may
        say otherwise: under secure aggregation the central node holds no release to replay, so a party
        back without its state is refused once a round was summed (it restores its own from its disk)."""
        if first and info["private"]:
            state.private_parties[party] = info["train_rounds"]
        if first and info.get("plan"):  # a private party's plan token, a non-private party's resume token under
            state.party_plans[party] = info["plan"]   # secure aggregation: checkpointed, sent back by a resume
        if first:
            state.party_data[party] = info["data"]
            state.party_models[party] = info.get("party_model", "linear")   # for the report (its own word)
        elif info["data"] != state.party_data.get(party, info["data"]):
            raise ResumeRefused(f"party {party} came back with other data than it declared at identify: "
                                f"{info['data']!r} now, {state.party_data[party]!r} before; give it its original data")
        if not first and not info["private"] and info["restored"] and state.exchange.same_id_restart:
            state.sums.refuse_early_answer(party)    # (not a state the party restored from its own disk)
        # back without its state: nothing to restore (the sums' say), else re-synchronized below
        if info["private"] or info["restored"] or (not first and state.sums.rejoin_without_state(state, party)):
            state.resync.discard(party)
            return
        state.stateless.add(party)
        if float(getattr(state.central, "alpha", 1.0)) != 1.0:
            log(WARNING, "party %s restarts from x = 0: re-synchronizing a stateless party needs alpha = 1", party)
            return
        state.resync.add(party)

    def identify(self, grid: Grid, state: VADMMState) -> VADMMState:
        """Map node id -> party (:class:`~flower_vfl.strategies.exchange.Exchange`): waits up to
        ``party_wait`` s for every party to have a node; checks node keys against ``party_keys``.
        Before: the run record, and a resume's checkpoint (another run's is refused before any
        party is contacted)."""
        state.run_record = checkpointing.run_record(self, state)
        state.checkpoint = checkpointing.load(self.resume, state.run_record) if self.resume else None
        state.resume_plans = checkpointing.plans(state.checkpoint)
        state.resume_round = int(state.checkpoint[1]["round"]) if state.checkpoint is not None else None
        query = {"want": "party"}
        if state.resume_plans:     # a resume: each private party continues its plan
            query["plans"] = json.dumps(state.resume_plans, sort_keys=True)
            query.update(state.sums.resume_fields(state))
        state.identify_query = ConfigRecord(query)
        state = super().identify(grid, state)
        state.exchange = state.sums.wrap(state.exchange)   # the exchange of every later request
        return state

    def identify_query(self, state: VADMMState):
        return "query.identify", RecordDict({"config": state.identify_query}), "the identify query"

    def exchange_kwargs(self, state: VADMMState) -> dict:
        return {"on_join": partial(self.joined, state), "wire_dtype": self.wire_dtype}

    def read_identity(self, nid, rep):
        return read_identity(self, nid, rep)

    # ------------------------------------------------------------ the 4 hooks
    def round_content(self, state: VADMMState, server_round, party=None, parties=None, **extra) -> RecordDict:
        """The train request of round ``server_round`` for ``party`` (None: the one every party gets)."""
        c = state.central
        q, vectors = state.sums.train_vectors(self, state, party)
        extra.update(state.sums.fields(state.active if parties is None else parties))
        return self.content(state, server_round, q, c.y, c.rho, vectors=vectors, **extra)

    def content(self, state: VADMMState, server_round, q, y, rho, vectors=None, **extra) -> RecordDict:
        c = state.central
        # no accelerator extrapolates the rounds: a non-private party may take the looser x-update
        # the engine's parties take then (PartyUpdate.plain_rounds); a private party ignores it.
        # Not in a run that checkpoints or resumes: a resumed run replays the parties' last round
        # from x = 0, which an inexact warm-started CG solve does not reproduce (the resume would
        # be refused); the engine keeps no checkpoint, so it and a run without one agree
        plain = (state.driver is not None and state.driver.acc is None
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

    def replay_content(self, state: VADMMState, party) -> RecordDict:
        """The last round ``party`` answered, as a party without state needs it (checkpointing.py)."""
        k, q, y, rho, s_prev = state.replay[party]
        return self.content(state, k, replay_q(q, s_prev, state.central.theta), y, rho)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Alg. 1 line 12: every party of the round gets q = a_hat - z, y and the scalars (at alpha = 1,
        once it answered a round, its x-update target v alone: :func:`~.vertical_rounds.sends_target`).

        ``arrays`` and ``config`` are Flower's global model and free-form config: vertical
        training has neither (x_m stays on its party; a party takes its settings from its own
        node config), so they are not read (:meth:`start` refuses non-empty ones). The parties
        of the round are those of the phase (:func:`~flower_vfl.core.schedule.private_schedule`)."""
        state = self.state_
        if state.qs is None and not state.resync and not any(sends_target(self, p) for p in state.active):
            content = self.round_content(state, server_round)
            build = lambda p: content  # noqa: E731
        else:
            build = lambda p: self.round_content(state, server_round, party=p)  # noqa: E731
        node_of = state.exchange.node_of()
        return [Message(build(p), dst_node_id=node_of[p], message_type="train")
                for p in sorted(state.active) if p in node_of]

    @staticmethod
    def refused(state: VADMMState, rep, party) -> None:
        """Keep a private party's report; a refusal stops the run (:class:`PartyRefused`)."""
        keep_report(rep, party, state.privacy)

    def release(self, state: VADMMState, rep, party, key, shape, what) -> np.ndarray:
        """A reply's checked release; a refusal stops the run (:class:`PartyRefused`)."""
        keep_report(rep, party, state.privacy, what)
        return check_release(rep, party, key, shape, what, bound=self.max_release,
                             cause=noise_divergence_cause(state.privacy) if state.private_parties else None)

    @staticmethod
    def by_party(state: VADMMState, replies, what) -> dict[int, Message]:
        """party -> reply, the party being the one the exchange sent the request to."""
        out = {}
        for rep in replies:
            party = state.reply_party.get(rep.metadata.reply_to_message_id)
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
        state, what = self.state_, f"round {server_round} (train)"
        got = self.by_party(state, replies, what)
        self.state_, metrics = state.sums.train(self, state, got, server_round, what)
        return None, MetricRecord(metrics)

    def eval_content(self, state: VADMMState, server_round, party, final=False) -> RecordDict:
        """Ask for D_test x_m. In the final evaluation private parties also get the last
        q, y: they make their unreleased final x-update first (:func:`private_schedule`)."""
        c = state.central
        cfg = {"round": int(server_round), "rho": float(c.rho), "alpha": float(c.alpha),
               "theta": float(c.theta), "n_outputs": int(self.loss.n_outputs)}
        if final and state.sums.final_update(state, party):
            return self.round_content(state, server_round, parties=state.ask, n_outputs=int(self.loss.n_outputs),
                                      final_update=True)
        cfg.update(state.sums.fields(state.ask))
        return RecordDict({"config": ConfigRecord(cfg)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Ask the parties of this evaluation for their scores D_test x_m of the test rows.

        ``arrays`` / ``config``: as in :meth:`configure_train`, not read. Before the final
        update a private party is not asked (it releases its model once, at the end)."""
        state = self.state_
        node_of = state.exchange.node_of()
        return [Message(self.eval_content(state, server_round, p, state.final_eval), dst_node_id=node_of[p],
                        message_type="evaluate") for p in sorted(state.ask) if p in node_of]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord:
        """Check the scores D_test x_m and combine them with the intercept
        (:func:`flower_vfl.core.scoring.combine`, as in the predict job) into the test metrics.
        Asked of the non-private parties alone, the metrics are named ``*_nonprivate``."""
        state = self.state_
        what = f"round {server_round} ({'final ' if state.final_eval else ''}evaluate)"
        shape = self.t_test.shape[:1] + state.central.z.shape[1:]
        suffix = "" if set(state.ask) == set(range(self.num_parties)) else "_nonprivate"
        f = state.sums.test_total(self, state, self.by_party(state, replies, what), shape, what, everyone=not suffix)
        if not suffix:
            state.decision_test = f
        # test labels are clean: with label DP score them with the plain logistic loss (log-loss)
        test_loss = get_loss("logistic") if self.label_privacy_ is not None else self.loss
        out = {"test_loss" + suffix: test_loss.mean(f, self.t_test)}
        if self.loss.name != "squared":
            pred = self.loss.predict(f)
            truth = self.loss.predict(self.t_test)
            out["test_accuracy" + suffix] = float(np.mean(pred == truth))
        return MetricRecord({k: float(v) for k, v in out.items()})

    # ------------------------------------------------------------------- loop
    def run(self, grid: Grid, state: VADMMState) -> VADMMState:
        """``start`` (Flower's, :class:`~flower_vfl.strategies.base.CentralBase`'s) identifies the parties,
        then this runs the rounds (:class:`~flower_vfl.core.rounds.RoundDriver`,
        the engine's loop) until the stopping rule or the last round (``start`` then returns Flower's Result).

        Parameters (of ``start``)
        -------------------------
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
        ckpt = state.checkpoint
        if ckpt is not None and state.stateless and float(state.central.alpha) != 1.0:
            raise ResumeRefused(f"resume={str(self.resume)!r}: parties {sorted(state.stateless)} came back without "
                                f"their state and alpha={state.central.alpha:g}: the relaxed x-update needs the "
                                "party's own z_loc, which the central node cannot restore. Resume with parties that "
                                "kept their state, or start a new run without resume")
        state.stale, state.qs = {}, None
        state.driver = driver = RoundDriver(state.central, self.num_parties, max_rounds=self.rounds_of(state),
                                            tol=self.tol, tol_abs=self.tol_abs, adaptive_rho=self.adaptive_rho,
                                            eval_every=self.eval_every)
        acceleration = state.sums.acceleration(self.acceleration)
        driver.plan([m in state.private_parties for m in range(self.num_parties)],
                    list(state.private_parties.values()), acceleration, self.penalty,
                    self.constraint is not None, stale=self.stragglers == "stale",
                    # as the plain-rounds flag (content): a resumed run replays the parties'
                    # last round, whose theta a checkpoint does not keep
                    adapt_theta=self.variant == "sharing" and state.sums.adapts_theta and self.state_dir is None
                    and self.resume is None)
        if ckpt is None:       # round 0, before any key agreement or round: the private parties' plans, for a resume
            checkpointing.save(self, state, 0, 0, 0, False)
        # the sums' checks of the run's plan (secure: a resume it cannot restore, a sum of one party,
        # two rosters), then its key agreement
        state = state.sums.begin(self, state, driver)
        state.acceleration = driver.acceleration
        state.history = driver.history
        begin = (0, 0, 0, False)
        if ckpt is not None:
            begin = checkpointing.restore(self, state, self.resume, *ckpt)
            log(INFO, "resuming from %s after round %d", self.resume, begin[0])
        rounds = FlowerRounds(self, state, grid)
        state.writer = RoundWriter(inline=self.write_inline)
        try:
            rounds.resync(range(self.num_parties))    # parties back without state: their x_m first
            driver.run(rounds, start=begin, t0=state.t0, on_round=partial(self._on_round, state),
                       on_warm_start=partial(self._on_warm_start, state))
            state.writer.close()                      # the last round's checkpoint and report are on disk
            if self.t_test is not None:
                vertical_outcome.warn_if_dp_hurts(state)
        except BaseException:
            # no model: the run fails (a refusal too: the rounds done are kept, never reported as a success)
            self._close_writer(state)
            raise
        return state

    def stop_line(self, state: VADMMState, exc: BaseException) -> str:
        return (f"stopping after round {len(state.history)} (checkpoint: "
                f"{self.state_dir or 'none, set state-dir or out-dir'}): {exc}")

    def report(self, state: VADMMState) -> dict:
        """The report's intercept, DP warning and the plain statement of what the run protects."""
        out = {"intercept": np.asarray(state.central.b).tolist()}
        if state.dp_warning:
            out["dp_warning"] = state.dp_warning
        out["protection"] = vertical_outcome.protection(self)
        return out

    def model(self, state: VADMMState) -> dict:
        """The central node's part of the model: the intercept."""
        return {"intercept": np.atleast_1d(np.asarray(state.central.b, float))}

    @staticmethod
    def _close_writer(state: VADMMState) -> None:
        """The run is failing: the writes of the rounds done still reach the disk (their own
        error is logged: the run's error is the one to see)."""
        err = state.writer.close(raising=False)
        if err is not None:
            log(WARNING, "%s", err)

    def _on_round(self, state, k, row, i_phase, j, stopped) -> None:
        # round k-1's checkpoint and report were written while the parties computed round k
        # (io/writer.py): wait for them (their disk error stops the run here), then hand over k's
        state.writer.wait()
        checkpointing.save(self, state, k, i_phase, j, stopped)
        if self.progress is not None:
            self.progress(k, row)
        else:                 # a custom ServerApp without a callback still sees each round in its log
            log_round(k, row)

    @staticmethod
    def _on_warm_start(state, k, metrics) -> None:
        # the non-private parties alone, at the end of the warm start: the bar the private
        # parties must clear (a warning after the run if they do not)
        if metrics is not None:
            state.nonprivate_reference = metrics

    def protection(self) -> dict:
        """What this run protects, per party (the run report's plain statement)."""
        return vertical_outcome.protection(self)
